"""The CI smoke of the peer benchmark (`python -m bench.peers_run --smoke`): real nats-server,
redis-server and broker processes run every phase with a tiny workload, so a broken phase
shows up in CI rather than halfway through a long benchmark run. The results, the targets'
verdicts and the chart are written where asked, never into bench/RESULTS.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peers_run

pytestmark = pytest.mark.slow

NUMBERS = (
    "publish_per_s",
    "ack_p50_ms",
    "ack_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "latency_achieved_per_s",
    "consume_per_s",
    "base_rss_mib",
    "idle_rss_mib",
)


def test_the_smoke_run_measures_every_system(tmp_path: Path) -> None:
    results_md = Path(peers_run.__file__).parent / "RESULTS.md"
    before = results_md.read_text()
    assert peers_run.main(["--smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["system"].split()[0] for r in results] == ["Danube", "NATS", "Redis", "Redis"]
    assert ["everysec" in r["durability"] for r in results[2:]] == [True, False]
    for result in results:
        assert result["durability"] and result["notes"]
        for name in NUMBERS:
            assert result[name] > 0, (result["system"], name)
        assert result["ack_p50_ms"] <= result["ack_p99_ms"]
        assert result["e2e_p50_ms"] <= result["e2e_p99_ms"]
    text = (tmp_path / "results.md").read_text()
    assert "durable publish at least 2x NATS JetStream's" in text
    assert (tmp_path / "peers.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert results_md.read_text() == before
