"""The official Danube Python client against a broker that removes idle producers
(spec/memory.md, "Departed clients"): its producer, silent past the timeout, is gone (its
health check answers CLOSE) and its next send still succeeds, with a new producer."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.localcluster.broker_process import BrokerProcess
from tests.conformance.harness import run_scenario
from tests.support.aio import unique_topic

pytestmark = [pytest.mark.slow, pytest.mark.conformance]


def test_an_expired_official_producer_recovers_on_its_next_send(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("broker:\n  producer_idle_timeout_ms: 1500\n")
    with BrokerProcess(tmp_path / "data", config_file=config) as broker:
        result = run_scenario("idle_producer", broker.url, unique_topic("idle"), 3.5, broker=broker)
    assert result["old_health"] == "CLOSE", result
    assert result["send_after_idle"] == "OK", result
    assert result["new_id"] != result["old_id"], result
