"""Publishing, one message or a batch, in the one order both paths keep:

    fence → topic served here → schema check → pace → room in the publish pool → core →
    wait for storage → fence → the pool's room given back

The broker refuses work while it is fenced (another broker may own the topic by now), checks
schemas and paces only topics it serves (the core refuses the others with its own reasons),
calls the core (which decides the offsets and what to store), starts the step's effects and,
for a reliable topic, answers only once the WAL acknowledged the message at the topic's
durability level and the broker is still not fenced (spec/cluster.md, rule 1).

`now` is the host's wall clock in milliseconds, read when a decision needs it (pacing, then
the core call, which may come later if the schema check or the pace waited). `monotonic` is
the host's monotonic clock in milliseconds, which times the wait for room: a wall clock
stepped back an hour made a waiting publish wait an hour and its paused time negative
(review finding, issue 28).

The publish pool (`danube.machines.memory.publish`, spec/memory.md "Back-pressure") holds what
a publish costs from its admission until it is answered, acknowledged or refused: the flow
gives the room back in a `finally`, so no way out of it (a refusal, a failed write, a client
that left and whose flow is closed) keeps it."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from danube.effects import Sleep
from danube.machines.memory.publish import PublishPool, batch_cost, send_cost
from danube.machines.node import requests
from danube.machines.node.core import BatchPublished, BrokerCore
from danube.machines.requests.effects import (
    AdmitSchema,
    Apply,
    AwaitRoom,
    AwaitStored,
    CheckFence,
    SchemaInspects,
)
from danube.machines.wal import records
from danube.machines.wal.batches import ClientBatch, PackedRecords, check_batch
from danube.values.errors import DanubeError, ErrorCode

__all__ = [
    "AdmitSchema",
    "Apply",
    "AwaitRoom",
    "AwaitStored",
    "BatchRequest",
    "CheckFence",
    "Published",
    "SchemaInspects",
    "admitted",
    "publish_batch",
    "publish_one",
]

Clock = Callable[[], int]
Flow = Generator[Any, Any, Any]


@dataclass(frozen=True, slots=True)
class Published:
    """A published message: its offset, and whether it was stored (a reliable topic)."""

    offset: int
    stored: bool


@dataclass(slots=True)
class BatchRequest:
    """A `PublishBatch` as the flow reads it. `checked` is filled in by the flow once the
    frame passed `check_batch`, so the service can count a later refusal's messages."""

    producer_id: int
    topic: str
    frame: bytes
    checked: ClientBatch | None = None


def unfenced() -> Flow:
    """Refuses (UNAVAILABLE) while the host says this broker is fenced."""
    reason = yield CheckFence()
    if reason is not None:
        raise DanubeError(
            ErrorCode.UNAVAILABLE,
            f"this broker is fenced ({reason}); look the topic up and send again",
        )


def paced(core: BrokerCore, topic: str, count: int, now: Clock) -> Flow:
    """Holds `count` messages as long as the topic's `max_publish_rate` asks
    (`BrokerCore.publish_pace`; too long a wait is refused there)."""
    delay_ms = core.publish_pace(topic, count, now())
    if delay_ms:
        yield Sleep(delay_ms)


def admitted(core: BrokerCore, size: int, monotonic: Clock, *, stream: bool) -> Flow:
    """Waits for `size` bytes of room in the broker's publish pool and returns the pool that
    holds them (None: the core has no budget), for the caller to release once the publish is
    answered. A plain `SendMessage` waits `wait_ms`, a batch of a stream `stream_wait_ms` (its
    stream is not read meanwhile), then is refused RESOURCE_EXHAUSTED; what can never fit is
    refused at once. The time waited is counted (`PublishPool.paused_ms`). `monotonic` times
    the wait: never the wall clock, which may step."""
    pool = core.publish_pool
    if pool is None:
        return None
    if size > pool.ceiling:
        raise DanubeError(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"this publish needs {size} bytes of the broker's publish pool, which holds at most "
            f"{pool.ceiling} (budget {_budget(core)}); send smaller batches or raise "
            "--memory-budget",
        )
    if pool.reserve(size):
        return pool
    waiter = pool.enqueue(size)
    if waiter is None:
        pool.waited(0, refused=True)
        raise _too_many_waiting(core, pool, size)
    started = monotonic()
    patience = pool.stream_wait_ms if stream else pool.wait_ms
    try:
        while not waiter.granted:
            waited = monotonic() - started
            if waited >= patience:
                pool.waited(waited, refused=True)
                raise _pool_full(core, pool, size, waited)
            yield AwaitRoom(waiter, patience - waited)
    except BaseException:
        pool.withdraw(waiter)  # refused, or the client left: out of the queue, room given back
        raise
    pool.waited(monotonic() - started, refused=False)
    return pool


def _budget(core: BrokerCore) -> str:
    memory = core.memory
    return f"{memory.budget} bytes, --memory-budget" if memory is not None else "unknown"


def _pool_full(core: BrokerCore, pool: PublishPool, size: int, waited: int) -> DanubeError:
    return DanubeError(
        ErrorCode.RESOURCE_EXHAUSTED,
        f"the broker's publish pool is full: {pool.used} of {pool.capacity} bytes are held by "
        f"publishes not yet stored (budget {_budget(core)}); this publish of {size} bytes "
        f"waited {waited} ms. Nothing of it was stored: retry later, slow the producer down, "
        "or give the broker a larger --memory-budget or a faster disk",
    )


def _too_many_waiting(core: BrokerCore, pool: PublishPool, size: int) -> DanubeError:
    return DanubeError(
        ErrorCode.RESOURCE_EXHAUSTED,
        f"the broker's publish pool is full: {pool.used} of {pool.capacity} bytes are held by "
        f"publishes not yet stored and {pool.waiting} more already wait for room, holding "
        f"{pool.waiting_bytes} bytes (at most {pool.max_waiters} publishes and "
        f"{pool.max_waiting_bytes} bytes may wait; budget {_budget(core)}); this publish of "
        f"{size} bytes was not queued. Nothing of it was "
        "stored: retry later, slow the producer down, or give the broker a larger "
        "--memory-budget or a faster disk",
    )


def stored_and_unfenced(step: Any, stored: AwaitStored | None) -> Flow:
    """Starts the step's effects; waits for its metadata, then (a reliable topic) for the WAL
    and checks the broker is still not fenced before anything is answered."""
    yield Apply(step, stored)
    if stored is not None:
        yield stored
        yield from unfenced()


def publish_one(core: BrokerCore, message: records.Record, now: Clock, *, monotonic: Clock) -> Flow:
    """SendMessage: returns `Published`; refusals raise `DanubeError`."""
    core.producer_active(message.producer_id)  # from its arrival, a wait included
    yield from unfenced()
    topic = message.topic_name
    if core.serves(topic):
        yield AdmitSchema(topic, (message,))
        yield from paced(core, topic, 1, now)
    size = send_cost(len(message.payload))
    pool = yield from admitted(core, size, monotonic, stream=False)
    try:
        published = requests.publish(core, message, now())
        offset = published.step.value
        stored = AwaitStored(topic, offset) if published.stored else None
        yield from stored_and_unfenced(published.step, stored)
        return Published(offset, published.stored)
    finally:
        if pool is not None:
            pool.release(size)


def publish_batch(core: BrokerCore, request: BatchRequest, now: Clock, *, monotonic: Clock) -> Flow:
    """One `PublishBatch`: returns the core's `BatchPublished`; all or nothing, so a
    refusal (raised) stores none of it. The schema policy judges each message (decoded only
    when the topic's policy inspects them): all must pass before any of it is stored."""
    core.producer_active(request.producer_id)  # from its arrival, a wait included
    yield from unfenced()
    batch = request.checked = check_batch(request.frame)
    topic = request.topic
    if core.serves(topic) and (yield SchemaInspects(topic)):
        messages = [records.decode(r) for r in PackedRecords(batch.frame, batch.positions, 0)]
        yield AdmitSchema(topic, messages)
    yield from paced(core, topic, batch.count, now)
    size = batch_cost(len(batch.frame), batch.count)
    pool = yield from admitted(core, size, monotonic, stream=True)
    try:
        step = core.publish_batch(request.producer_id, topic, batch, now_ms=now())
        published: BatchPublished = step.value
        stored = AwaitStored(topic, published.last_offset) if published.stored else None
        yield from stored_and_unfenced(step, stored)
        return published
    finally:
        if pool is not None:
            pool.release(size)
