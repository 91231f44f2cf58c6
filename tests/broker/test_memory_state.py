"""Topics in the memory budget with a real broker (spec/memory.md, "State"): under a 16 MiB
budget (state may take 4 MiB of its 8 MiB cache pool, some 340 topics at 12 KiB), producers
creating topic after topic are refused RESOURCE_EXHAUSTED with the reason, the broker stays
up and serves the topics it has, and the state pool shows in the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from pathlib import Path
from typing import Any

import grpclib.client
import grpclib.const
import pytest
from grpclib.const import Status

from danube.client import DanubeClient, DispatchStrategy
from danube.client.errors import DanubeClientError
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.memory.state import CONNECTION_BYTES, STATE_SHARE, STREAM_BYTES, TOPIC_BYTES
from danube.proto import danube as pb
from tests.support.aio import run

pytestmark = pytest.mark.slow


def _state_used(broker: BrokerProcess) -> float:
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=30) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("danube_memory_pool_used_bytes{") and 'pool="state"' in line:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no state pool in the metrics")


def test_topics_past_the_state_share_are_refused_and_the_broker_serves_on(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=("--memory-budget", "16MiB")).start()
    try:

        async def scenario() -> tuple[int, str]:
            async with DanubeClient(broker.url) as client:
                for index in range(1_000):
                    producer = client.producer(
                        f"/default/many-{index}", "p", dispatch=DispatchStrategy.RELIABLE,
                        batching=None,
                    )  # fmt: skip
                    try:
                        await producer.create()
                    except DanubeClientError as error:
                        assert error.status is Status.RESOURCE_EXHAUSTED, error
                        first = client.producer(
                            "/default/many-0", "again", dispatch=DispatchStrategy.RELIABLE,
                            batching=None,
                        )  # fmt: skip
                        await first.create()
                        await first.send(b"still served")
                        return index, str(error)
            raise AssertionError("1,000 topics fitted in a 16 MiB budget")

        created, message = run(scenario, timeout=240)
        assert "no room for topic /default/many-" in message and "--memory-budget" in message
        share = int(8 * 1024 * 1024 * STATE_SHARE)  # of a 16 MiB budget's 8 MiB cache pool
        assert share // TOPIC_BYTES // 2 < created <= share // TOPIC_BYTES
        assert _state_used(broker) >= created * TOPIC_BYTES
        assert broker.process is not None and broker.process.poll() is None
    finally:
        broker.kill()


def test_open_streams_and_connections_show_in_the_state_pool(tmp_path: Path) -> None:
    """The runtime reports its open streams and connections at each tick: 100 idle receive
    streams on one connection are charged to the state pool, and given back once closed
    (the soak's load holds 2,000 on one connection: bench/stream_memory.py)."""
    broker = BrokerProcess(tmp_path / "data", extra_args=("--memory-budget", "64MiB")).start()
    try:
        before = _state_used(broker)  # the scrape's own connection is not a gRPC one

        async def scenario() -> tuple[float, float]:
            host, port = broker.broker_addr.rsplit(":", 1)
            channel = grpclib.client.Channel(host, int(port))
            try:
                async with contextlib.AsyncExitStack() as stack:
                    for _ in range(100):
                        stream: Any = channel.request(
                            "/danube.ConsumerService/ReceiveMessages",
                            grpclib.const.Cardinality.UNARY_STREAM,
                            pb.ReceiveRequest,
                            pb.StreamMessage,
                        )
                        await stack.enter_async_context(stream)
                        await stream.send_request()  # headers only: the handler waits
                    await asyncio.sleep(0.5)  # a few ticks
                    opened = _state_used(broker)
                    channel.close()
                    stack.pop_all()
            finally:
                channel.close()
            await asyncio.sleep(0.5)
            return opened, _state_used(broker)

        opened, closed = run(scenario, timeout=60)
        assert opened - before >= 100 * STREAM_BYTES + CONNECTION_BYTES
        assert closed == before
    finally:
        broker.kill()
