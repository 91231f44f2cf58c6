"""What a request flow asks of the broker that hosts it, beside `danube.effects` (`Sleep`,
`StoreRead`, `Work`). Each is answered as its docstring says; a failure is thrown into the
flow as a `DanubeError`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from danube.machines.wal import records
from danube.values.frozen import fast_init


@fast_init
@dataclass(frozen=True, slots=True)
class CheckFence:
    """Answered with None when this broker may acknowledge publishes, else with why not
    (cluster mode: its membership lapsed; spec/cluster.md, "Ownership fencing")."""


@fast_init
@dataclass(frozen=True, slots=True, eq=False)
class AwaitStored:
    """Answered with None once the topic's WAL acknowledged every offset up to `through` at
    the topic's durability level; a `DanubeError` (UNAVAILABLE) is thrown in when the WAL
    failed them or the topic went away.

    Compared by identity: the host registers this very value when the `Apply` carrying it
    starts, and the flow yields it afterwards to wait on that registration."""

    topic: str
    through: int


@fast_init
@dataclass(frozen=True, slots=True)
class Apply:
    """Carry out a core step's effects (`danube.machines.node.core.Step`); answered with None once
    its metadata is durable (a failed metadata write is thrown in as UNAVAILABLE).

    `stored`: the host registers that wait *before* any of the step's effects start, so an
    acknowledgement among them (or right after) cannot slip past it. The step's effects
    start when the flow yields this, in the order the core decided: a host that pipelines
    requests (a stream of batches) moves on to the next request from here."""

    step: Any
    stored: AwaitStored | None = None


@dataclass(frozen=True, slots=True)
class AwaitRoom:
    """Answered with None once the publish pool admitted `waiter` (`waiter.granted`; at once
    when it already is: the host sets `waiter.wake`, which the pool calls when it admits it)
    or once `timeout_ms` passed, whichever comes first; the flow then looks at
    `waiter.granted` (`danube.machines.memory.publish`, spec/memory.md "Back-pressure")."""

    waiter: Any
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class SchemaInspects:
    """Answered with whether the topic's schema policy may refuse or warn about a message
    (`policy.inspects` of its binding): a batch is split into messages only then."""

    topic: str


@fast_init
@dataclass(frozen=True, slots=True)
class AdmitSchema:
    """Answered with None when every message may be published to `topic`; the gate's
    refusal (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) is thrown in."""

    topic: str
    messages: Sequence[records.Record]
