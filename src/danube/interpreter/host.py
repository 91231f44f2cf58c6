"""What the interpreter needs from the world it runs in: the port.

Three ports implement `Host`: the production port (`danube.runtime.io_port`: trio threads,
etcd, S3, the asyncio loop of the gRPC handlers), the simulator (`sim/broker.py`: simulated
disk, store and network with their latencies and faults) and the instant in-memory port of
`danube.testing`. A port performs I/O and delivers answers; it decides nothing (spec/effects.md).
"""

from __future__ import annotations

from typing import Any, Protocol

from danube.effects import IoEffect
from danube.values.errors import DanubeError


class Done(Protocol):
    """How a port answers one `IoEffect`: exactly once, with the answer or the failure, at
    once (inside `perform`) or later. Answers that arrive after the interpreter closed are
    dropped."""

    def __call__(self, answer: Any = None, error: BaseException | None = None) -> None: ...


class Host(Protocol):
    def perform(self, effect: IoEffect, done: Done) -> None:
        """Carries out `effect` and calls `done` with its answer (see `danube.effects`)."""

    def now_ms(self) -> int:
        """The broker's wall clock, in milliseconds (what the core is given)."""

    def event(self, name: str, **fields: Any) -> None:
        """Something happened worth a log line (and, in the simulator, the checker's ear):
        `acknowledged`, `wal_loaded`, `topic_stopped`, `object_served`, … (the names are
        listed in spec/effects.md)."""

    def wake(self, consumer_id: int) -> None:
        """The consumer's queue has messages: its stream writer should send them."""

    def end_stream(self, generation: int) -> None:
        """The receive stream of this generation is over (status OK)."""

    def return_memory(self, freed: int, full: bool = True) -> None:
        """The pools' accounted use fell by `freed` bytes (`ReturnMemory`): give freed memory
        back to the system (production: a collection, of every generation when `full`, else
        of the young ones, and glibc's `malloc_trim`; the simulator and the test port record
        it)."""

    def resolve(self, waiter: Any) -> None:
        """A waiter (a publish waiting for durability, a reply waiting for its metadata)
        succeeded."""

    def fail(self, waiter: Any, error: DanubeError) -> None:
        """A waiter failed with `error`."""

    def restart_topic(self, topic: str) -> None:
        """The core stopped a replicated topic to serve it again under a new epoch
        (`TopicStopped.restart`): a cluster broker hands it to its ownership machine
        (`Ownership.restart`); a standalone broker has no replicated topic to restart."""
