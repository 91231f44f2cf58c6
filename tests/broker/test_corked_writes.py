"""Corked writes (issue 23, point 2): what grpclib writes on a connection during one turn of
the loop reaches the socket in one send, in order. A unary reply is three writes (HEADERS,
DATA, trailers); without the cork each was a `send` syscall, the largest cost of the broker's
loop at 1,000 msg/s. `close` still sends what is corked (the GOAWAY saying why), `abort`
does not."""

from __future__ import annotations

import asyncio
from typing import Any

import grpclib.const
from grpclib.client import Channel
from grpclib.const import Cardinality

from danube.proto import danube as pb
from danube.runtime.grpc_util import Server, unary
from danube.runtime.h2_guard import GuardedProtocol, LingeringTransport
from tests.support.aio import run


class _Transport:
    """The socket side: records each write and how the transport ended."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.ended: str | None = None

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return self.ended is not None

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.ended = "eof"

    def close(self) -> None:
        self.ended = "close"

    def abort(self) -> None:
        self.ended = "abort"


def test_the_writes_of_one_turn_go_out_in_one_send_in_order() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes], list[bytes], str | None]:
        loop = asyncio.get_running_loop()
        socket = _Transport()
        transport = LingeringTransport(socket, loop)  # type: ignore[arg-type]
        for part in (b"headers", b"", b"data", b"trailers"):
            transport.write(part)
        assert socket.sent == []  # corked until the turn ends
        await asyncio.sleep(0)
        first = list(socket.sent)
        transport.write(b"next")
        await asyncio.sleep(0)
        second = list(socket.sent)
        transport.write(b"goaway")
        transport.close()  # what is corked goes before the socket closes
        closed = list(socket.sent)
        transport.write(b"late")
        await asyncio.sleep(0)
        assert transport.writes == 5 and transport.sends == 3
        return first, second, closed, socket.ended

    first, second, closed, ended = run(scenario)
    assert first == [b"headersdatatrailers"]
    assert second == [b"headersdatatrailers", b"next"]
    assert closed == [b"headersdatatrailers", b"next", b"goaway"]
    assert ended == "close"


def test_abort_drops_what_is_corked() -> None:
    async def scenario() -> tuple[list[bytes], str | None]:
        socket = _Transport()
        transport = LingeringTransport(socket, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"never")
        transport.abort()
        await asyncio.sleep(0)
        return socket.sent, socket.ended

    assert run(scenario) == ([], "abort")


async def _echo(request: pb.HealthCheckRequest) -> pb.HealthCheckResponse:
    return pb.HealthCheckResponse(status=pb.HealthCheckResponseClientStatus.OK)


class _Service:
    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {"/t.T/Echo": unary(_echo, pb.HealthCheckRequest, pb.HealthCheckResponse)}


def test_a_unary_reply_is_one_send() -> None:
    calls = 20

    async def scenario() -> tuple[int, int]:
        server = Server([_Service()])
        await server.start("127.0.0.1", 0)
        port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        channel = Channel("127.0.0.1", port)
        try:

            async def call() -> None:
                async with channel.request(
                    "/t.T/Echo",
                    Cardinality.UNARY_UNARY,
                    pb.HealthCheckRequest,
                    pb.HealthCheckResponse,
                    timeout=10,
                ) as stream:
                    await stream.send_message(pb.HealthCheckRequest(), end=True)
                    await stream.recv_message()
                    await stream.recv_trailing_metadata()

            await call()  # the connection's set-up (SETTINGS and their acknowledgements)
            (protocol,) = list(server._protocols)
            assert isinstance(protocol, GuardedProtocol)
            lingering: Any = protocol._lingering
            writes, sends = lingering.writes, lingering.sends
            for _ in range(calls):
                await call()
            return lingering.writes - writes, lingering.sends - sends
        finally:
            channel.close()
            server.close()
            await server.wait_closed()

    writes, sends = run(scenario)
    # Each reply: HEADERS, DATA and trailers written apart (and the WINDOW_UPDATE answering
    # the request's bytes), sent together: at most one send per call.
    assert writes >= 3 * calls
    assert 1 <= sends <= calls, (writes, sends)
