"""A consumer's receive stream, whatever its wire form: `danube.ConsumerService/ReceiveMessages`
sends one message per stream message, `danube_ext.ConsumerExt/ReceiveBatches` many."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpclib.server
from grpclib import GRPCError
from grpclib.const import Status

from danube.broker.grpc_util import grpc_error
from danube.broker.runtime import BrokerRuntime, now_ms
from danube.core.errors import DanubeError
from danube.node.stats import consumer_target


async def serve_consumer(
    runtime: BrokerRuntime,
    stream: grpclib.server.Stream,
    consumer_id: int,
    limit: int,
    send: Callable[[list[Any]], Awaitable[int]],
) -> None:
    """Hands the consumer's queue to `send`, up to `limit` items a turn, until the client
    leaves or the stream is superseded (takeover, topic deleted, shutdown); either way the
    core hears that it closed. Items are what `BrokerCore.take` returns; `send` returns the
    bytes it sent, for the metrics."""
    if runtime.stopping:
        raise GRPCError(Status.UNAVAILABLE, "the broker is shutting down; reconnect shortly")
    core = runtime.core
    try:
        step = core.open_stream(consumer_id, now_ms=now_ms())
    except DanubeError as error:
        raise grpc_error(error) from None
    slot = runtime.attach_stream(consumer_id, step.value)
    target = consumer_target(core, consumer_id)
    metrics = runtime.metrics
    try:
        await runtime.run(step)
        await stream.send_initial_metadata()
        while not slot.ended:
            slot.wakeup.clear()
            items = core.take(consumer_id, slot.generation, limit)
            if items is None:
                break
            if not items:
                await slot.wakeup.wait()
                continue
            sent = await send(items)
            if target is not None:
                metrics.consumer_sent(target, len(items), sent)
        if runtime.stopping:
            # Not OK: an OK end tells a client its session was taken over or its topic is
            # gone; this one should reconnect once the broker is back.
            raise GRPCError(Status.UNAVAILABLE, "the broker is shutting down; reconnect")
    finally:
        runtime.detach_stream(consumer_id, slot)
        closed = core.close_stream(consumer_id, slot.generation, now_ms=now_ms())
        runtime.apply(closed.effects)
