"""The connection gate in a real broker process (spec/memory.md, "Connections"): the
review's reproduction, scaled to a 16 MiB budget. Idle connections that never made a call
were charged to the state share (40 KiB each) until it was full, and then every topic
creation was refused RESOURCE_EXHAUSTED: about 1,640 of them under 256 MiB, 154 under
16 MiB. Now they are evicted for newcomers and closed at their first-call deadline, the
broker-wide cap refuses what is beyond it, and the broker logs it in a line per interval,
never a traceback. The in-process versions are in tests/runtime/test_connection_gate_sockets.py."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import pytest
from grpclib.client import Channel
from h2.errors import ErrorCodes

from danube.client import DanubeClient
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from danube.proto import danube_admin as admin_pb
from tests.broker.h2_raw import RawH2
from tests.support.aio import run, unique_topic

pytestmark = pytest.mark.slow

IDLE = 240
"""Idle connections opened: past the 154 that fill a 16 MiB budget's state share."""


def _metric(broker: BrokerProcess, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(rf"^{name}\{{[^}}]*{labels}[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"no {name} {labels}"
    return float(found.group(1))


def test_idle_connections_no_longer_refuse_real_work(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "broker.yml"
    config.write_text("broker:\n  grpc:\n    first_call_timeout_ms: 2000\n")
    broker = broker_factory(
        tmp_path / "data", config_file=config, extra_args=("--memory-budget", "16MiB")
    ).start()
    port = int(broker.broker_addr.rsplit(":", 1)[1])

    async def scenario() -> None:
        idle = []
        for _ in range(IDLE):
            idle.append(await RawH2.open(port))
        await asyncio.gather(*(raw.pump(0.5) for raw in idle))
        await asyncio.sleep(0.3)  # a few ticks: the open connections are charged
        async with DanubeClient(broker.url) as client:  # real work gets through
            topic = unique_topic("gate")
            producer = await client.producer(topic, "p").create()
            await producer.send(b"through")
        evicted = [raw for raw in idle if raw.closed]
        assert len(evicted) >= IDLE - 16  # at most the pending places stay taken
        goaway = evicted[0].goaway()
        assert goaway is not None and goaway.additional_data == b"too_many_pending_connections"
        await asyncio.gather(*(raw.pump(2.5) for raw in idle))
        assert all(raw.closed for raw in idle)  # the rest at their first-call deadline
        for raw in idle:
            raw.close()
        assert _metric(broker, "danube_broker_connections", 'port="client",state="pending"') == 0
        limit = _metric(broker, "danube_broker_connections_limit", 'port="client",state="open"')
        assert limit == 76

        # the cap itself: 76 connections that made a call, then one more is refused
        channels = []
        for _ in range(76):
            channel = Channel("127.0.0.1", port)
            await pb.HealthCheckStub(channel).health_check(pb.HealthCheckRequest(), timeout=10)
            channels.append(channel)
        refused = await RawH2.open(port)
        await refused.pump(2)
        goaway = refused.goaway()
        assert goaway is not None and goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
        assert goaway.additional_data == b"too_many_connections"
        refused.close()
        # the admin port has a gate of its own: the operator gets in while clients are at the cap
        admin = Channel("127.0.0.1", broker.admin_port)
        listed = await admin_pb.BrokerAdminStub(admin).list_namespaces(admin_pb.Empty(), timeout=10)
        assert "default" in listed.namespaces
        admin.close()
        for channel in channels:
            channel.close()
        assert (
            _metric(
                broker,
                "danube_broker_connections_refused_total",
                'port="client",reason="too_many_connections"',
            )
            == 1
        )

    run(scenario, timeout=120)
    log = broker.log_text()
    assert "Traceback" not in log
    assert "memory budget has no room" not in log
    lines = [line for line in broker.log_lines if "event=connections_refused" in line]
    assert 1 <= len(lines) <= 4, lines  # one per 10 s interval, not one per connection
