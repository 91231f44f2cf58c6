"""The connection gate carried out by the gRPC server over real sockets (spec/memory.md,
"Connections"): the broker-wide cap refuses connections beyond it with a GOAWAY, idle
connections that never made a call are evicted for newcomers and closed at their first-call
deadline, an unauthenticated call is no first call, refusals are logged once per interval
and never with a traceback. The broker-process check is `test_connection_cap_broker.py`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import grpclib.const
import grpclib.server
import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from h2.errors import ErrorCodes

from danube.machines.memory.connections import ConnectionGate, Refusal, connection_limits
from danube.proto import danube as pb
from danube.runtime.grpc_util import Server
from danube.runtime.h2_guard import GatedConnections
from danube.runtime.metrics import _connection_families
from danube.values.config import GrpcConfig
from danube.values.sizes import MIB
from tests.broker.h2_raw import RawH2
from tests.broker.test_h2_abuse import Probe, settle
from tests.support.aio import run


@contextlib.asynccontextmanager
async def gated(
    max_connections: int,
    max_pending: int,
    first_call_timeout_ms: int = 0,
    auth: object = None,
) -> AsyncIterator[tuple[Server, GatedConnections, int]]:
    gate = ConnectionGate(
        connection_limits(256 * MIB, max_connections, max_pending, first_call_timeout_ms)
    )
    connections = GatedConnections(gate)
    server = Server([Probe(1.0)], limits=GrpcConfig(), gate=connections, auth=auth)  # type: ignore[arg-type]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    await server.start(sock=sock)
    try:
        yield server, connections, sock.getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
        server.close_connections()
        sock.close()


async def health(port: int, metadata: dict[str, str] | None = None) -> None:
    channel = Channel("127.0.0.1", port)
    try:
        reply = await pb.HealthCheckStub(channel).health_check(
            pb.HealthCheckRequest(), timeout=5, metadata=metadata
        )
        assert reply.status == pb.HealthCheckResponseClientStatus.OK
    finally:
        channel.close()


async def proven_connection(port: int) -> Channel:
    """A client connection that made a call and stays open."""
    channel = Channel("127.0.0.1", port)
    await pb.HealthCheckStub(channel).health_check(pb.HealthCheckRequest(), timeout=5)
    return channel


def test_connections_beyond_the_cap_are_refused_with_a_goaway_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with gated(3, 3) as (server, connections, port):
            channels = [await proven_connection(port) for _ in range(3)]
            assert connections.gate.open == 3 and connections.gate.pending == 0
            refused = [await RawH2.open(port) for _ in range(5)]
            await asyncio.gather(*(r.pump(2) for r in refused))
            # refused connections are not charged while their lingering close runs
            assert server.transport_counts()[1] == 3
            for raw in refused:
                goaway = raw.goaway()
                assert goaway is not None, "no GOAWAY for a connection past the cap"
                assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
                assert goaway.additional_data == b"too_many_connections"
                assert raw.closed
                raw.close()
            # a grpclib client is refused too (grpclib's client fails on a connection
            # closed as it opens with an AttributeError of its own, hence no narrower type)
            with pytest.raises(Exception):  # noqa: B017
                await health(port)
            assert connections.gate.open == 3
            assert connections.gate.refused[Refusal.FULL] == 6
            channels.pop().close()
            await settle(lambda: connections.gate.open == 2)
            await health(port)  # room again
            for channel in channels:
                channel.close()
            await settle(lambda: connections.gate.open == 0)
            assert connections.gate.open == 0 and connections.protocols == {}
            assert server.transport_counts()[1] <= 1  # the last lingering close, at most
            families = {f.name: f for f in _connection_families("b", {"client": connections.gate})}
            samples = {
                tuple(s.labels.values()): s.value
                for s in families["danube_broker_connections_refused"].samples
                if s.name.endswith("_total")
            }
            assert samples[("b", "client", "too_many_connections")] == 6

    with caplog.at_level(logging.INFO, logger="danube.runtime"):
        run(scenario)
    refusals = [r for r in caplog.records if "event=connections_refused" in r.getMessage()]
    assert len(refusals) == 1, "refusals are logged once per interval, not per connection"
    assert "count=1 " in refusals[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not [r for r in caplog.records if "grpc_connection_closed" in r.getMessage()]


def test_idle_connections_are_evicted_for_a_client_that_calls() -> None:
    async def scenario() -> None:
        async with gated(100, 4) as (_, connections, port):
            idle = [await RawH2.open(port) for _ in range(4)]
            await asyncio.gather(*(r.pump(0.2) for r in idle))
            assert connections.gate.pending == 4
            await health(port)  # gets in, evicting the oldest idle socket
            late = await RawH2.open(port)  # the pending places are full again
            await health(port)  # evicts the next oldest
            await asyncio.gather(*(r.pump(1) for r in [*idle, late]))
            assert [r.closed for r in idle] == [True, True, False, False]
            assert not late.closed
            for raw in idle[:2]:
                goaway = raw.goaway()
                assert goaway is not None and goaway.error_code == ErrorCodes.NO_ERROR
                assert goaway.additional_data == b"too_many_pending_connections"
            assert connections.gate.pending == 3  # idle[2], idle[3], late
            assert connections.gate.refused[Refusal.EVICTED] == 2
            late.close()
            for raw in idle:
                raw.close()

    run(scenario)


def test_a_connection_without_a_call_is_closed_at_its_deadline_and_one_with_a_call_stays() -> None:
    async def scenario() -> None:
        async with gated(100, 50, first_call_timeout_ms=300) as (_, connections, port):
            idle = await RawH2.open(port)
            busy = await proven_connection(port)
            await idle.pump(2)
            assert idle.closed
            goaway = idle.goaway()
            assert goaway is not None and goaway.error_code == ErrorCodes.NO_ERROR
            assert goaway.additional_data == b"first_call_timeout"
            reply = await pb.HealthCheckStub(busy).health_check(
                pb.HealthCheckRequest(), timeout=5
            )  # the same connection, well past the deadline
            assert reply.status == pb.HealthCheckResponseClientStatus.OK
            assert connections.gate.refused[Refusal.FIRST_CALL_TIMEOUT] == 1
            busy.close()
            idle.close()

    run(scenario)


def _refusing_auth(path: str, handler: grpclib.const.Handler) -> grpclib.const.Handler:
    """A port that authenticates: calls without `token: good` are refused before the
    handler runs, as `AuthGuard.wrap` refuses them."""
    func = handler.func

    async def call(stream: grpclib.server.Stream) -> None:
        if dict(stream.metadata or {}).get("token") != "good":
            raise GRPCError(Status.UNAUTHENTICATED, "no token")
        await func(stream)

    return handler._replace(func=call)


def test_an_unauthenticated_call_is_not_a_first_call() -> None:
    async def scenario() -> None:
        async with gated(100, 50, 400, auth=_refusing_auth) as (_, connections, port):
            stranger = Channel("127.0.0.1", port)
            member = Channel("127.0.0.1", port)
            with pytest.raises(GRPCError) as refused:
                await pb.HealthCheckStub(stranger).health_check(pb.HealthCheckRequest())
            assert refused.value.status is Status.UNAUTHENTICATED
            await pb.HealthCheckStub(member).health_check(
                pb.HealthCheckRequest(), metadata={"token": "good"}
            )
            assert connections.gate.pending == 1  # the stranger's
            await settle(lambda: connections.gate.pending == 0, timeout=3)
            assert connections.gate.refused[Refusal.FIRST_CALL_TIMEOUT] == 1
            assert connections.gate.open == 1  # the member's
            stranger.close()
            member.close()

    run(scenario)
