"""HTTP/2 abuse against the broker's gRPC server class (`grpc_util.Server` with the connection
guard), served in-process on a free loopback port and attacked over a real socket by a raw
`h2` client (`tests/broker/h2_raw.py`). The broker-process versions are in
`test_h2_abuse_broker.py`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator

import grpclib.const
import h2.events
import h2.settings
from grpclib.client import Channel
from h2.errors import ErrorCodes
from hyperframe.frame import HeadersFrame

from danube.proto import danube as pb
from danube.runtime.grpc_util import Server, unary
from danube.runtime.h2_guard import GuardedHandler
from danube.values.config import GrpcConfig
from tests.broker.h2_raw import HEALTH_PATH, RawH2, grpc_headers, rapid_reset
from tests.support.aio import run

SLOW_PATH = "/danube.HealthCheck/Slow"
STUBBORN_PATH = "/danube.HealthCheck/Stubborn"


class Probe:
    """A fast method (HealthCheck) and a slow one that counts its handlers."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.started = 0
        self.finished = 0

    async def health(self, _: pb.HealthCheckRequest) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(status=pb.HealthCheckResponseClientStatus.OK)

    async def slow(self, _: pb.HealthCheckRequest) -> pb.HealthCheckResponse:
        self.started += 1
        try:
            await asyncio.sleep(self.delay)
            return pb.HealthCheckResponse(status=pb.HealthCheckResponseClientStatus.OK)
        finally:
            self.finished += 1

    async def stubborn(self, _: pb.HealthCheckRequest) -> pb.HealthCheckResponse:
        """Takes `delay` more to clean up when cancelled: its stream is gone, it still runs."""
        self.started += 1
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            await asyncio.sleep(self.delay)
            raise
        finally:
            self.finished += 1
        return pb.HealthCheckResponse()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        request, response = pb.HealthCheckRequest, pb.HealthCheckResponse
        return {
            HEALTH_PATH: unary(self.health, request, response),
            SLOW_PATH: unary(self.slow, request, response),
            STUBBORN_PATH: unary(self.stubborn, request, response),
        }


@dataclasses.dataclass
class Served:
    server: Server
    probe: Probe
    port: int

    def live_tasks(self) -> int:
        """Request tasks not finished, over every connection (grpclib's handler fields)."""
        return sum(
            sum(not t.done() for t in h._tasks.values()) + sum(not t.done() for t in h._cancelled)
            for h in self.server._handlers
        )

    def registered_streams(self) -> int:
        return sum(
            len(p.processor.streams)
            for p in list(self.server._protocols)
            if hasattr(p, "processor")
        )


@contextlib.asynccontextmanager
async def serving(limits: GrpcConfig | None = None, delay: float = 5.0) -> AsyncIterator[Served]:
    probe = Probe(delay)
    server = Server([probe], limits=limits or GrpcConfig())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    await server.start(sock=sock)
    try:
        yield Served(server, probe, sock.getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()
        server.close_connections()
        sock.close()


async def health_latency(port: int) -> float:
    channel = Channel("127.0.0.1", port)
    started = time.monotonic()
    try:
        reply = await pb.HealthCheckStub(channel).health_check(pb.HealthCheckRequest(), timeout=10)
    finally:
        channel.close()
    assert reply.status == pb.HealthCheckResponseClientStatus.OK
    return time.monotonic() - started


async def settle(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.02)


def test_rapid_reset_closes_the_connection_with_enhance_your_calm_and_leaves_no_handler() -> None:
    async def scenario() -> None:
        async with serving() as served:
            attacker = await RawH2.open(served.port)
            sent = await rapid_reset(attacker, 5000, SLOW_PATH)
            await attacker.pump(3)
            goaway = attacker.goaway()
            assert goaway is not None, f"no GOAWAY after {sent} resets"
            assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
            assert goaway.additional_data == b"too_many_resets"
            assert attacker.closed
            # the budget is 200 resets per 10 s: the attacker got little further than that
            assert sent < 1000
            assert await health_latency(served.port) < 2.0
            await settle(lambda: served.live_tasks() == 0 and served.registered_streams() == 0)
            assert served.live_tasks() == 0
            assert served.registered_streams() == 0
            attacker.close()

    run(scenario)


def test_streams_reset_in_the_same_read_start_no_handler_and_none_stays_registered() -> None:
    """grpclib alone started a handler task for each, cancelled it before its first step, and
    the task's `finally` (which releases the stream) never ran: every such stream stayed
    registered on the connection until it closed (the memory that never came back)."""

    async def scenario() -> None:
        limits = GrpcConfig(max_stream_resets=0)  # no budget: the connection stays open
        async with serving(limits) as served:
            attacker = await RawH2.open(served.port)
            await attacker.pump(0.2)
            sent = await rapid_reset(attacker, 3000, SLOW_PATH, batch=200)
            assert sent == 3000 and not attacker.closed
            await settle(lambda: served.registered_streams() == 0 and served.live_tasks() == 0)
            assert served.registered_streams() == 0
            assert served.live_tasks() == 0
            assert served.probe.started == served.probe.finished
            # and the connection still works
            stream_id = attacker.request(HEALTH_PATH)
            await attacker.flush()
            await attacker.pump(1)
            assert attacker.trailers(stream_id).get("grpc-status") == "0"
            attacker.close()

    run(scenario)


def test_a_handler_task_cancelled_before_it_ran_still_releases_its_stream() -> None:
    async def scenario() -> None:
        released: list[int] = []
        handler = GuardedHandler({}, None, None, None)  # type: ignore[arg-type]
        stream = object()
        handler.accept(stream, [], lambda: released.append(1))  # type: ignore[arg-type]
        handler.cancel(stream)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert released == [1]
        assert handler.live_tasks() == 0

    run(scenario)


def test_settings_advertise_the_stream_and_header_limits() -> None:
    async def scenario() -> None:
        async with serving() as served:
            client = await RawH2.open(served.port)
            events = await client.pump(0.5)
            settings = [e for e in events if isinstance(e, h2.events.RemoteSettingsChanged)]
            assert settings
            changed = settings[0].changed_settings
            codes = h2.settings.SettingCodes
            assert changed[codes.MAX_CONCURRENT_STREAMS].new_value == 500
            assert changed[codes.MAX_HEADER_LIST_SIZE].new_value == 16 * 1024
            client.close()

    run(scenario)


def test_streams_beyond_the_advertised_limit_close_the_connection_with_a_goaway() -> None:
    async def scenario() -> None:
        async with serving(GrpcConfig(max_concurrent_streams=4), delay=30) as served:
            client = await RawH2.open(served.port)
            await client.pump(0.3)  # the broker's SETTINGS, acked
            client.h2.local_settings.acknowledge()
            # h2 (the client) would refuse to exceed the limit itself: pretend it is higher
            client.h2.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 100
            client.h2.remote_settings.acknowledge()
            for _ in range(5):
                client.request(SLOW_PATH)
            await client.flush()
            await client.pump(3)
            goaway = client.goaway()
            assert goaway is not None and goaway.error_code == ErrorCodes.PROTOCOL_ERROR
            await settle(lambda: served.live_tasks() == 0)
            assert served.live_tasks() == 0
            client.close()

    run(scenario)


def test_handlers_still_running_for_reset_streams_count_against_the_stream_limit() -> None:
    """The rapid-reset variant the h2 limit cannot see: reset streams are closed for h2, but
    their handlers still run; a new stream beyond the limit is refused (REFUSED_STREAM)."""

    async def scenario() -> None:
        async with serving(GrpcConfig(max_concurrent_streams=4), delay=1.0) as served:
            client = await RawH2.open(served.port)
            await client.pump(0.3)
            for _ in range(4):
                client.request(STUBBORN_PATH)
            await client.flush()
            await settle(lambda: served.probe.started == 4)
            for stream_id in (1, 3, 5, 7):
                client.h2.reset_stream(stream_id, ErrorCodes.CANCEL)
            await client.flush()
            await asyncio.sleep(0.2)
            refused = client.request(HEALTH_PATH)
            await client.flush()
            events = await client.pump(0.5)
            resets = [e for e in events if isinstance(e, h2.events.StreamReset)]
            assert [(e.stream_id, e.error_code) for e in resets] == [
                (refused, ErrorCodes.REFUSED_STREAM)
            ]
            await settle(lambda: served.live_tasks() == 0)
            answered = client.request(HEALTH_PATH)  # the handlers ended: room again
            await client.flush()
            await client.pump(1)
            assert client.trailers(answered).get("grpc-status") == "0"
            client.close()

    run(scenario)


def test_oversized_request_headers_are_refused_with_resource_exhausted_at_once() -> None:
    async def scenario() -> None:
        async with serving() as served:
            client = await RawH2.open(served.port)
            await client.pump(0.2)
            started = time.monotonic()
            big = client.request(HEALTH_PATH, extra=20_000)
            await client.flush()
            await client.pump(1)
            trailers = client.trailers(big)
            assert trailers.get("grpc-status") == "8", trailers  # RESOURCE_EXHAUSTED
            assert "exceed the limit of 16384 bytes" in trailers["grpc-message"]
            assert time.monotonic() - started < 2.0
            assert served.probe.started == 0
            # the connection survives: the next request is answered
            ok = client.request(HEALTH_PATH)
            await client.flush()
            await client.pump(1)
            assert client.trailers(ok).get("grpc-status") == "0"
            # beyond 4x the limit HPACK decoding stops: the connection is closed
            client.request(HEALTH_PATH, extra=70_000)
            await client.flush()
            await client.pump(2)
            goaway = client.goaway()
            assert goaway is not None and goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
            client.close()

    run(scenario)


def test_a_connection_that_never_completes_the_handshake_is_closed() -> None:
    async def scenario() -> None:
        async with serving(GrpcConfig(handshake_timeout_ms=300)) as served:
            silent = await RawH2.open(served.port, handshake=False)
            partial = await RawH2.open(served.port, handshake=False)
            partial.writer.write(b"PRI * HTTP/2.0\r\n")  # half a preface, then nothing
            complete = await RawH2.open(served.port)
            await asyncio.gather(silent.pump(3), partial.pump(3), complete.pump(1))
            assert silent.closed and partial.closed
            assert not complete.closed
            for client in (silent, partial, complete):
                client.close()

    run(scenario)


def test_a_frozen_peer_is_closed_after_the_keepalive_timeout_and_its_handler_ends() -> None:
    async def scenario() -> None:
        limits = GrpcConfig(keepalive_time_ms=200, keepalive_timeout_ms=300)
        async with serving(limits, delay=60) as served:
            frozen = await RawH2.open(served.port)
            await frozen.pump(0.1)
            frozen.request(SLOW_PATH)
            await frozen.flush()
            await settle(lambda: served.probe.started == 1)
            # frozen: reads nothing, so it answers no PING
            await asyncio.sleep(1.0)
            await settle(lambda: served.live_tasks() == 0, timeout=3)
            assert served.live_tasks() == 0
            assert served.probe.finished == 1
            await frozen.pump(1)
            assert frozen.closed
            frozen.close()

    run(scenario)


def test_a_peer_that_answers_pings_keeps_its_long_call() -> None:
    """Our client (grpclib's channel, as `danube.client` uses) answers the broker's PINGs."""

    async def scenario() -> None:
        limits = GrpcConfig(keepalive_time_ms=100, keepalive_timeout_ms=200)
        async with serving(limits, delay=1.5) as served:
            channel = Channel("127.0.0.1", served.port)
            try:
                reply = await channel.request(
                    SLOW_PATH,
                    grpclib.const.Cardinality.UNARY_UNARY,
                    pb.HealthCheckRequest,
                    pb.HealthCheckResponse,
                ).__aenter__()
                await reply.send_message(pb.HealthCheckRequest(), end=True)
                message = await reply.recv_message()
                await reply.recv_trailing_metadata()
                await reply.__aexit__(None, None, None)
            finally:
                channel.close()
            assert message is not None
            assert served.probe.finished == 1

    run(scenario)


def test_a_client_that_pings_too_often_gets_goaway_too_many_pings() -> None:
    async def scenario() -> None:
        async with serving() as served:
            client = await RawH2.open(served.port)
            await client.pump(0.2)
            for n in range(10):
                if client.goaway() is not None:
                    break
                client.h2.ping(b"flood%03d" % n)
                await client.flush()
                await client.pump(0.02)
            await client.pump(2)
            goaway = client.goaway()
            assert goaway is not None
            assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
            assert goaway.additional_data == b"too_many_pings"
            client.close()

    run(scenario)


def test_pings_while_the_broker_sends_are_no_strikes() -> None:
    async def scenario() -> None:
        async with serving() as served:
            client = await RawH2.open(served.port)
            await client.pump(0.2)
            for n in range(6):
                client.request(HEALTH_PATH)
                client.h2.ping(b"bdp%05d" % n)
                await client.flush()
                await client.pump(0.1)
            assert client.goaway() is None and not client.closed
            client.close()

    run(scenario)


def test_undecodable_headers_close_the_connection_without_a_traceback(caplog: object) -> None:
    async def scenario() -> None:
        async with serving() as served:
            client = await RawH2.open(served.port)
            await client.pump(0.2)
            stream_id = client.h2.get_next_available_stream_id()
            headers = [(k.encode(), v.encode()) for k, v in grpc_headers(HEALTH_PATH)]
            headers.append((b"x-bad", "é".encode()))
            client.h2.send_headers(stream_id, headers, end_stream=True)
            await client.flush()
            await client.pump(2)
            assert client.closed or client.goaway() is not None
            assert await health_latency(served.port) < 2.0
            client.close()

    run(scenario)
    records = getattr(caplog, "records", [])
    assert not [r for r in records if r.exc_info], "a traceback was logged"


def test_a_busy_connection_whose_reads_end_mid_frame_is_no_slowloris() -> None:
    """Every read ends inside a frame, but each frame completes quickly: the frame timeout
    measures one frame left incomplete, not a buffer that is never empty (a producer
    streaming large batches was cut off after `frame_timeout_ms`; review of issue 20)."""

    def window_update() -> bytes:  # 13 bytes: a connection-level WINDOW_UPDATE of 1
        return b"\x00\x00\x04\x08\x00" + (0).to_bytes(4, "big") + (1).to_bytes(4, "big")

    async def scenario() -> None:
        async with serving(GrpcConfig(frame_timeout_ms=300)) as served:
            client = await RawH2.open(served.port)
            await client.pump(0.2)
            frames = window_update() * 2000
            position, started = 0, time.monotonic()
            while time.monotonic() - started < 1.2 and not client.closed:
                end = position + 20
                if end % 13 == 0:
                    end += 1  # every write ends inside a frame
                client.writer.write(frames[position:end])
                position = end
                await client.writer.drain()
                await client.pump(0.02)
            assert not client.closed, "a connection completing frames was closed"
            client.close()

    run(scenario)


def test_slowloris_a_frame_or_header_block_left_incomplete_is_closed() -> None:
    async def scenario() -> None:
        async with serving(GrpcConfig(frame_timeout_ms=300)) as served:
            # a HEADERS frame without END_HEADERS, and no CONTINUATION ever
            open_block = await RawH2.open(served.port)
            await open_block.pump(0.2)
            frame = HeadersFrame(1, open_block.h2.encoder.encode(grpc_headers(SLOW_PATH)))
            open_block.writer.write(frame.serialize())
            # a frame header announcing 1000 bytes, followed by 10 of them
            trickle = await RawH2.open(served.port)
            await trickle.pump(0.2)
            trickle.writer.write(b"\x00\x03\xe8\x00\x00\x00\x00\x00\x01" + b"x" * 10)
            healthy = await RawH2.open(served.port)
            await healthy.pump(0.2)
            await asyncio.gather(open_block.pump(3), trickle.pump(3), healthy.pump(1))
            assert open_block.closed and trickle.closed
            assert not healthy.closed
            # a complete request long after the last one is no slowloris
            stream_id = healthy.request(HEALTH_PATH)
            await healthy.flush()
            await healthy.pump(1)
            assert healthy.trailers(stream_id).get("grpc-status") == "0"
            assert served.probe.started == 0
            for client in (open_block, trickle, healthy):
                client.close()

    run(scenario)
