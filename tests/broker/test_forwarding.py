"""The admin forwarder (danube.runtime.forwarding), with in-process grpclib servers: a call is
answered by the broker it is forwarded to, errors keep their status, a broker that cannot be
reached is UNAVAILABLE naming its address, and a forwarded call is never forwarded again."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import grpclib.const
import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.proto import danube_admin as pb
from danube.runtime.forwarding import forward
from danube.runtime.grpc_util import FORWARDED_HEADER, Server, unary
from danube.values.errors import DanubeError, ErrorCode, not_found

PATH = "/danube_admin.TopicAdmin/UnloadTopic"


class _Service:
    def __init__(self, call: Callable[[pb.TopicRequest], Awaitable[pb.TopicResponse]]) -> None:
        self._handler = unary(call, pb.TopicRequest, pb.TopicResponse)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {PATH: self._handler}


async def _serve(call: Callable[[pb.TopicRequest], Awaitable[pb.TopicResponse]]) -> Server:
    server = Server([_Service(call)])
    await server.start("127.0.0.1", 0)
    return server


def _url(server: Server) -> str:
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def _ask(url: str, request: pb.TopicRequest, *, forwarded: bool = False) -> Any:
    host, port = url.removeprefix("http://").split(":")
    channel = Channel(host, int(port))
    try:
        metadata = {FORWARDED_HEADER: "1"} if forwarded else None
        async with channel.request(
            PATH, grpclib.const.Cardinality.UNARY_UNARY, pb.TopicRequest, pb.TopicResponse,
            timeout=5, metadata=metadata,
        ) as stream:  # fmt: skip
            await stream.send_message(request, end=True)
            return await stream.recv_message()
    finally:
        channel.close()


async def _owner(request: pb.TopicRequest) -> pb.TopicResponse:
    if request.name == "/default/missing":
        raise not_found("topic /default/missing does not exist")
    return pb.TopicResponse(success=True)


def _chain(ask: Callable[[str], Awaitable[Any]]) -> Any:
    """A broker that forwards every call to the owner; `ask` gets the forwarder's URL."""

    async def run() -> Any:
        owner = await _serve(_owner)

        async def relay(request: pb.TopicRequest) -> pb.TopicResponse:
            return await forward(_url(owner), PATH, request, pb.TopicResponse, timeout=5)

        forwarder = await _serve(relay)
        try:
            return await ask(_url(forwarder))
        finally:
            for server in (forwarder, owner):
                server.close()
                await server.wait_closed()

    return asyncio.run(run())


def test_a_forwarded_call_gets_the_owners_answer() -> None:
    answer = _chain(lambda url: _ask(url, pb.TopicRequest("/default/t")))
    assert answer == pb.TopicResponse(success=True)


def test_the_owners_error_passes_through_with_its_status_and_message() -> None:
    with pytest.raises(GRPCError) as caught:
        _chain(lambda url: _ask(url, pb.TopicRequest("/default/missing")))
    assert caught.value.status is Status.NOT_FOUND
    assert caught.value.message == "topic /default/missing does not exist"


def test_a_call_that_arrived_forwarded_is_not_forwarded_again() -> None:
    with pytest.raises(GRPCError) as caught:
        _chain(lambda url: _ask(url, pb.TopicRequest("/default/t"), forwarded=True))
    assert caught.value.status is Status.UNAVAILABLE
    assert "views are changing; retry" in str(caught.value.message)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_broker_that_cannot_be_reached_is_unavailable_naming_its_address() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(DanubeError) as caught:
        asyncio.run(forward(url, PATH, pb.TopicRequest("/default/t"), pb.TopicResponse))
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert url in caught.value.message


def test_a_broker_that_does_not_answer_in_time_is_unavailable() -> None:
    async def run() -> None:
        async def silent(request: pb.TopicRequest) -> pb.TopicResponse:
            await asyncio.sleep(10)
            return pb.TopicResponse(success=True)

        server = await _serve(silent)
        try:
            await forward(
                _url(server), PATH, pb.TopicRequest("/d/t"), pb.TopicResponse, timeout=0.2
            )
        finally:
            server.close()
            await server.wait_closed()

    with pytest.raises(DanubeError) as caught:
        asyncio.run(run())
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert "did not answer" in caught.value.message


def test_an_unusable_admin_address_is_unavailable() -> None:
    with pytest.raises(DanubeError) as caught:
        asyncio.run(forward("http://nowhere", PATH, pb.TopicRequest("/d/t"), pb.TopicResponse))
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert "nowhere" in caught.value.message
