"""Publishing, one message or a batch, in the one order both paths keep:

    fence → topic served here → schema check → pace → core → wait for storage → fence

The broker refuses work while it is fenced (another broker may own the topic by now), checks
schemas and paces only topics it serves (the core refuses the others with its own reasons),
calls the core (which decides the offsets and what to store), starts the step's effects and,
for a reliable topic, answers only once the WAL acknowledged the message at the topic's
durability level and the broker is still not fenced (spec/cluster.md, rule 1).

`now` is the host's clock in milliseconds, read when a decision needs it (pacing, then the
core call, which may come later if the schema check or the pace waited)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from danube.effects import Sleep
from danube.machines.node import requests
from danube.machines.node.core import BatchPublished, BrokerCore
from danube.machines.requests.effects import (
    AdmitSchema,
    Apply,
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
    "AwaitStored",
    "BatchRequest",
    "CheckFence",
    "Published",
    "SchemaInspects",
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


def stored_and_unfenced(step: Any, stored: AwaitStored | None) -> Flow:
    """Starts the step's effects; waits for its metadata, then (a reliable topic) for the WAL
    and checks the broker is still not fenced before anything is answered."""
    yield Apply(step, stored)
    if stored is not None:
        yield stored
        yield from unfenced()


def publish_one(core: BrokerCore, message: records.Record, now: Clock) -> Flow:
    """SendMessage: returns `Published`; refusals raise `DanubeError`."""
    yield from unfenced()
    topic = message.topic_name
    if core.serves(topic):
        yield AdmitSchema(topic, (message,))
        yield from paced(core, topic, 1, now)
    published = requests.publish(core, message, now())
    offset = published.step.value
    stored = AwaitStored(topic, offset) if published.stored else None
    yield from stored_and_unfenced(published.step, stored)
    return Published(offset, published.stored)


def publish_batch(core: BrokerCore, request: BatchRequest, now: Clock) -> Flow:
    """One `PublishBatch`: returns the core's `BatchPublished`; all or nothing, so a
    refusal (raised) stores none of it. The schema policy judges each message (decoded only
    when the topic's policy inspects them): all must pass before any of it is stored."""
    yield from unfenced()
    batch = request.checked = check_batch(request.frame)
    topic = request.topic
    if core.serves(topic) and (yield SchemaInspects(topic)):
        messages = [records.decode(r) for r in PackedRecords(batch.frame, batch.positions, 0)]
        yield AdmitSchema(topic, messages)
    yield from paced(core, topic, batch.count, now)
    step = core.publish_batch(request.producer_id, topic, batch, now_ms=now())
    published: BatchPublished = step.value
    stored = AwaitStored(topic, published.last_offset) if published.stored else None
    yield from stored_and_unfenced(step, stored)
    return published
