"""A broker's first start as a new user sees it (issue 26): the kernels are compiled (or
loaded from numba's cache) before it reports ready, its log says how long that took, a
client leaving is the broker's own `stream_closed` event (not grpclib's INFO chatter), and
`--log-format json` writes one JSON object per line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danube.localcluster.broker_process import BROKER_BIN, BrokerProcess
from tests.support.aio import unique_topic

pytestmark = pytest.mark.slow

CLI_BIN = Path(sys.executable).parent / "danube-cli"


def _index(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines) if needle in line)


def test_the_kernels_are_ready_before_the_broker(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    process = broker_factory(tmp_path / "data").start()
    lines = process.log_lines
    warmed = lines[_index(lines, "event=kernels_ready")]
    assert _index(lines, "event=kernels_ready") < _index(lines, "event=broker_ready")
    assert "seconds=" in warmed and "cache_dir=" in warmed
    produced = subprocess.run(
        [str(CLI_BIN), "produce", "-s", process.url, "-t", unique_topic("first"), "-m", "x"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert produced.stderr.count("sent 1/1 messages") == 1, produced.stderr


def test_a_client_that_leaves_is_the_broker_s_own_event(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    process = broker_factory(tmp_path / "data").start()
    topic = unique_topic("leave")
    created = subprocess.run(
        [str(CLI_BIN), "produce", "-s", process.url, "-t", topic, "-m", "x"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    consumer = subprocess.Popen(
        [str(CLI_BIN), "consume", "-s", process.url, "-t", topic, "-m", "sub"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert consumer.stderr is not None
        assert consumer.stderr.readline().startswith("subscribed to ")
        consumer.kill()
        consumer.wait(10)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not any(
        "event=stream_closed" in line for line in process.log_lines
    ):
        time.sleep(0.1)
    closed = [line for line in process.log_lines if "event=stream_closed" in line]
    assert closed, process.log_text()
    assert "rpc=/" in closed[0] and "status=CANCELLED" in closed[0]
    assert not any("Request was cancelled" in line for line in process.log_lines)


def test_the_json_log_is_one_object_per_line(tmp_path: Path) -> None:
    broker = subprocess.Popen(
        [
            str(BROKER_BIN), "--log-format", "json", "--data-dir", str(tmp_path),
            "--broker-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
            "--prom-exporter", "off",
        ],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    events: list[dict[str, str]] = []
    try:
        assert broker.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = broker.stderr.readline()
            if not line:
                break
            events.append(json.loads(line))
            if events[-1].get("event") == "broker_ready":
                break
    finally:
        broker.terminate()
        broker.wait(30)
    names = [event.get("event") for event in events]
    assert "kernels_ready" in names and names[-1] == "broker_ready", events
    ready = events[-1]
    assert ready["level"] == "INFO" and ready["broker_addr"].startswith("127.0.0.1:")
