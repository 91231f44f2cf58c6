"""A consumer's receive stream, whatever its wire form: `danube.ConsumerService/ReceiveMessages`
sends one message per stream message, `danube_ext.ConsumerExt/ReceiveBatches` many."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpclib.server
from grpclib import GRPCError
from grpclib.const import Status

from danube.machines.node.stats import consumer_target
from danube.machines.requests.receive import End, Receiver, Wait
from danube.runtime.auth import STILL_ALLOWED
from danube.runtime.broker import BrokerRuntime, now_ms
from danube.runtime.grpc_util import grpc_error
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError


async def serve_consumer(
    runtime: BrokerRuntime,
    stream: grpclib.server.Stream,
    consumer_id: int,
    limit: int,
    send: Callable[[list[Any]], Awaitable[int]],
) -> None:
    """Hands the consumer's queue to `send`, up to `limit` items a turn, until the client
    leaves or the stream is superseded (takeover, topic deleted, shutdown); either way the
    core hears that it closed. The stream's decisions are
    `danube.machines.requests.receive.Receiver`'s
    (the simulator's streams make them too); items are what `BrokerCore.take` returns;
    `send` returns the bytes it sent, for the metrics. On a port with authentication each
    turn first asks `auth.STILL_ALLOWED` (an identity check unless roles or bindings changed):
    a revoked binding ends the stream PERMISSION_DENIED before it takes more messages."""
    if runtime.stopping:
        raise GRPCError(Status.UNAVAILABLE, "the broker is shutting down; reconnect shortly")
    core = runtime.core
    receiver = Receiver(core, consumer_id, limit)
    try:
        step = receiver.open(now_ms())
    except DanubeError as error:
        raise grpc_error(error) from None
    slot = runtime.attach_stream(consumer_id, step.value)
    target = consumer_target(core, consumer_id)
    metrics = runtime.metrics
    stages = metrics.stages
    reliable = _reliable(core, target)
    woken = False
    still_allowed = STILL_ALLOWED.get()
    try:
        await runtime.run(step)
        await stream.send_initial_metadata()
        while True:
            slot.wakeup.clear()
            if still_allowed is not None:
                still_allowed()
            turn = receiver.turn(ended=slot.ended)
            if isinstance(turn, End):
                break
            if isinstance(turn, Wait):
                await slot.wakeup.wait()
                woken = reliable
                continue
            if woken:  # records it waited for: `dispatch` starts at their commit's answer
                # (a stream catching up on history waited for no commit: not observed)
                stages.since_stored("dispatch")
                woken = False
            handed = time.perf_counter()
            sent = await send(turn.items)
            stages.observe("send", time.perf_counter() - handed)
            if target is not None:
                metrics.consumer_sent(target, len(turn.items), sent)
        if runtime.stopping:
            # Not OK: an OK end tells a client its session was taken over or its topic is
            # gone; this one should reconnect once the broker is back.
            raise GRPCError(Status.UNAVAILABLE, "the broker is shutting down; reconnect")
    finally:
        runtime.detach_stream(consumer_id, slot)
        closed = receiver.close(now_ms())
        if closed is not None:
            runtime.apply(closed.effects)


def _reliable(core: Any, target: tuple[str, str] | None) -> bool:
    if target is None:
        return False
    try:
        return bool(core.topic_strategy(target[0]) is DispatchStrategy.RELIABLE)
    except DanubeError:  # the topic is gone already: the stream ends at once
        return False
