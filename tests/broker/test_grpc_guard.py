"""Every call the broker's `grpc_util.Server` serves is guarded (issue 20): whatever a handler
raises, the status message that goes out is at most `STATUS_MESSAGE_LIMIT` bytes (grpclib
HPACK-encodes it on the event loop, in time that grows faster than its length), and an
unforeseen exception is INTERNAL with one traceback per rpc and kind in the log, not one per
call. In process, on a loopback port."""

from __future__ import annotations

import logging

import grpclib.const
import grpclib.server
import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality, Status

from danube.proto import danube as pb
from danube.runtime import grpc_util
from danube.runtime.grpc_util import STATUS_MESSAGE_LIMIT, Server, capped, unary
from danube.values.errors import invalid
from tests.support.aio import run


async def _long_status(stream: grpclib.server.Stream) -> None:
    await stream.recv_message()
    raise GRPCError(Status.INVALID_ARGUMENT, "é" * 20_000)


async def _broken_stream(stream: grpclib.server.Stream) -> None:
    await stream.recv_message()
    raise KeyError("a bug")


async def _long_refusal(request: pb.HealthCheckRequest) -> pb.HealthCheckResponse:
    raise invalid("q" * 50_000)


class _Service:
    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/t.T/LongStatus": grpclib.const.Handler(
                _long_status,
                Cardinality.UNARY_UNARY,
                pb.HealthCheckRequest,
                pb.HealthCheckResponse,
            ),
            "/t.T/Broken": grpclib.const.Handler(
                _broken_stream,
                Cardinality.UNARY_STREAM,
                pb.HealthCheckRequest,
                pb.HealthCheckResponse,
            ),
            "/t.T/LongRefusal": unary(_long_refusal, pb.HealthCheckRequest, pb.HealthCheckResponse),
        }


async def _status(channel: Channel, path: str, cardinality: Cardinality) -> GRPCError:
    async with channel.request(
        path, cardinality, pb.HealthCheckRequest, pb.HealthCheckResponse, timeout=30
    ) as stream:
        await stream.send_message(pb.HealthCheckRequest(), end=True)
        try:
            await stream.recv_message()
            await stream.recv_trailing_metadata()
        except GRPCError as error:
            return error
    raise AssertionError(f"{path} answered OK")


def test_status_messages_are_cut_and_bugs_log_one_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grpc_util._LOGGED_INTERNAL.clear()

    async def scenario() -> list[GRPCError]:
        server = Server([_Service()])
        await server.start("127.0.0.1", 0)
        port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        channel = Channel("127.0.0.1", port)
        try:
            return [
                await _status(channel, "/t.T/LongStatus", Cardinality.UNARY_UNARY),
                await _status(channel, "/t.T/LongRefusal", Cardinality.UNARY_UNARY),
                await _status(channel, "/t.T/Broken", Cardinality.UNARY_STREAM),
                await _status(channel, "/t.T/Broken", Cardinality.UNARY_STREAM),
                await _status(channel, "/t.T/Broken", Cardinality.UNARY_STREAM),
            ]
        finally:
            channel.close()
            server.close()
            await server.wait_closed()

    with caplog.at_level(logging.INFO):
        long_status, long_refusal, *broken = run(scenario)
    for error in (long_status, long_refusal):
        assert error.status is Status.INVALID_ARGUMENT
        assert error.message is not None
        assert 100 < len(error.message.encode()) <= STATUS_MESSAGE_LIMIT
    assert long_refusal.message is not None and long_refusal.message.startswith("qqq")
    assert all(error.status is Status.INTERNAL for error in broken)
    records = [r for r in caplog.records if "internal_error" in r.getMessage()]
    assert len(records) == 3
    assert records[0].exc_info is not None
    assert all(r.exc_info is None for r in records[1:])
    assert not [r for r in caplog.records if r.getMessage() == "Application error"]


@pytest.mark.parametrize("text", ["x" * 5000, "é" * 5000, "€" * 1000 + "x", "short"])
def test_capped_cuts_on_a_character_boundary(text: str) -> None:
    cut = capped(text)
    assert len(cut.encode()) <= STATUS_MESSAGE_LIMIT
    assert cut == text or (cut.endswith("…") and text.startswith(cut[:-1]))
