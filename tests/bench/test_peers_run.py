"""The CI smoke of the peer benchmark (`python -m bench.peers_run --smoke`): every system runs
every phase with a tiny workload, and the results, the targets' verdicts and the chart are
written where asked (never into bench/RESULTS.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peers_run

pytestmark = pytest.mark.slow

FIELDS = (
    "publish_per_s",
    "ack_p50_ms",
    "e2e_p50_ms",
    "latency_achieved_per_s",
    "consume_per_s",
    "idle_rss_mib",
)


def test_the_smoke_run_measures_every_system(tmp_path: Path) -> None:
    results_md = Path(peers_run.__file__).parent / "RESULTS.md"
    before = results_md.read_text()
    assert peers_run.main(["--smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["system"].split()[0] for r in results] == ["Danube", "NATS", "Redis", "Redis"]
    for result in results:
        assert result["durability"]
        for field in FIELDS:
            assert result[field] > 0, (result["system"], field)
        assert result["ack_p50_ms"] <= result["ack_p99_ms"]
    text = (tmp_path / "results.md").read_text()
    assert "durable publish at least 2x NATS JetStream's" in text
    assert (tmp_path / "peers.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert results_md.read_text() == before
