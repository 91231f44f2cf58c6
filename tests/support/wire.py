"""Raw gRPC access to a broker (below our client), for tests that need a stream our client
would handle for them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from grpclib.client import Channel, Stream
from grpclib.const import Cardinality
from grpclib.exceptions import StreamTerminatedError

from danube.proto import danube as pb

ReceiveStream = Stream[pb.ReceiveRequest, pb.StreamMessage]


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@asynccontextmanager
async def channel_to(address: str) -> AsyncIterator[Channel]:
    channel = Channel(*host_port(address))
    try:
        yield channel
    finally:
        channel.close()


@asynccontextmanager
async def receive_stream(channel: Channel, consumer_id: int) -> AsyncIterator[ReceiveStream]:
    """ReceiveMessages for `consumer_id`, yielded once the broker has attached it."""
    async with channel.request(
        "/danube.ConsumerService/ReceiveMessages",
        Cardinality.UNARY_STREAM,
        pb.ReceiveRequest,
        pb.StreamMessage,
    ) as stream:
        await stream.send_message(
            pb.ReceiveRequest(request_id=1, consumer_id=consumer_id), end=True
        )
        await stream.recv_initial_metadata()
        yield stream
        # A stream still open must be cancelled, or leaving the block waits for its end
        # (grpclib 0.4.9 is pinned, so its two state flags are safe to read).
        # The connection may already be gone (the broker stopped): nothing left to cancel.
        if not stream._cancel_done and not stream._recv_trailing_metadata_done:
            with contextlib.suppress(StreamTerminatedError):
                await stream.cancel()
