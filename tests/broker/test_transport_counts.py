"""`Server.transport_counts`, what the state pool charges for open streams and connections
(spec/memory.md "State"), is kept as streams and connections open and close, so that the
runtime can read it at every tick in O(1); it must agree with a count of every connection's
request tasks at each point, through calls that end, are cut off and connections that go."""

from __future__ import annotations

import asyncio

from grpclib.client import Channel
from grpclib.const import Cardinality

from danube.proto import danube as pb
from tests.broker.h2_raw import RawH2, rapid_reset
from tests.broker.test_h2_abuse import SLOW_PATH, Served, serving, settle
from tests.support.aio import run


def _connected(served: Served) -> int:
    return sum(1 for p in list(served.server._protocols) if getattr(p, "connected", False))


def _agrees(served: Served) -> bool:
    return served.server.transport_counts() == (served.live_tasks(), _connected(served))


async def _slow(channel: Channel) -> None:
    stream = channel.request(
        SLOW_PATH,
        cardinality=Cardinality.UNARY_UNARY,
        request_type=pb.HealthCheckRequest,
        reply_type=pb.HealthCheckResponse,
    )
    async with stream as call:
        await call.send_message(pb.HealthCheckRequest(), end=True)
        await call.recv_message()


def test_streams_and_connections_are_counted_as_they_open_and_close() -> None:
    async def scenario() -> None:
        async with serving(delay=0.5) as served:
            assert served.server.transport_counts() == (0, 0)
            channels = [Channel("127.0.0.1", served.port) for _ in range(2)]
            calls = [asyncio.ensure_future(_slow(c)) for c in channels for _ in range(3)]
            await settle(lambda: served.probe.started == 6)
            assert served.server.transport_counts() == (6, 2)
            assert _agrees(served)
            await asyncio.gather(*calls)  # the calls end: their streams are no longer counted
            await settle(lambda: served.server.transport_counts()[0] == 0)
            assert served.server.transport_counts() == (0, 2) and _agrees(served)
            cut = [asyncio.ensure_future(_slow(channels[0])) for _ in range(2)]
            await settle(lambda: served.probe.started == 8)
            channels[0].close()  # calls cut off with their connection
            await asyncio.gather(*cut, return_exceptions=True)
            await settle(lambda: served.server.transport_counts() == (0, 1))
            assert served.server.transport_counts() == (0, 1) and _agrees(served)
            attacker = await RawH2.open(served.port)  # streams reset before they end
            await rapid_reset(attacker, 300, SLOW_PATH)
            await attacker.pump(1)
            await settle(lambda: _agrees(served) and served.live_tasks() == 0, timeout=5)
            assert _agrees(served)
            channels[1].close()
            await settle(lambda: served.server.transport_counts() == (0, 0))
            assert served.server.transport_counts() == (0, 0) and _agrees(served)

    run(scenario)


def test_reading_the_counts_visits_no_connection(monkeypatch: object) -> None:
    """Read at every tick: it must not sum over connections and their tasks (3,000 streams
    under the soak's load)."""
    from danube.runtime.h2_guard import GuardedHandler

    def visited(_: object) -> int:
        raise AssertionError("transport_counts visited a connection's tasks")

    async def scenario() -> None:
        async with serving(delay=0.5) as served:
            channel = Channel("127.0.0.1", served.port)
            call = asyncio.ensure_future(_slow(channel))
            await settle(lambda: served.probe.started == 1)
            monkeypatch.setattr(GuardedHandler, "live_tasks", visited)  # type: ignore[attr-defined]
            assert served.server.transport_counts() == (1, 1)
            await call
            channel.close()

    run(scenario)
