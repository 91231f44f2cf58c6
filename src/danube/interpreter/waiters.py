"""The interpreter's tables of requests waiting for durability.

`Publishes`: reliable publishes waiting for the WAL acknowledgement that covers their offset
(acknowledged through an offset, failed from one). `MetadataLane`: the one writer of metadata
changes, in order, and the replies waiting until every change produced before them is
durable. Each waiter is answered exactly once: it leaves the table before it is answered.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from danube.values.errors import DanubeError, ErrorCode

MAX_REMEMBERED_FAILURES = 1024
"""A reply checks the failures of its own metadata writes; older ones interest no one."""

Answer = Callable[[Any, DanubeError | None], None]
"""Answers one waiter: (waiter, None) resolves it, (waiter, error) fails it."""


@dataclass(slots=True)
class Publishes:
    """Per topic: the highest offset acknowledged and the publishes waiting, by offset (a
    topic's queue only while publishes wait: an idle topic holds none)."""

    answer: Answer
    acked: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, deque[tuple[int, Any]]] = field(default_factory=dict)

    def wait(self, topic: str, through: int, waiter: Any) -> None:
        """`waiter` is answered once offsets up to `through` are acknowledged (at once when
        they already are), or failed when the WAL loses them."""
        if self.acked.get(topic, -1) >= through:
            self.answer(waiter, None)
            return
        self.waiting.setdefault(topic, deque()).append((through, waiter))

    def acknowledge(self, topic: str, through: int) -> int | None:
        """Answers the waiters `through` covers; returns the previous acknowledged end."""
        previous = self.acked.get(topic)
        self.acked[topic] = through if previous is None else max(previous, through)
        queue = self.waiting.get(topic)
        if queue is None:
            return previous
        while queue and queue[0][0] <= through:
            _, waiter = queue.popleft()
            self.answer(waiter, None)
        if not queue:  # an empty deque is 600 bytes an idle topic need not hold (issue 23)
            del self.waiting[topic]
        return previous

    def fail(self, topic: str, from_offset: int, reason: str) -> None:
        """Fails the waiters of offsets from `from_offset` on."""
        self.acked[topic] = min(self.acked.get(topic, -1), from_offset - 1)
        queue = self.waiting.get(topic)
        error = DanubeError(
            ErrorCode.UNAVAILABLE, f"{reason}; the message is not acknowledged, send it again"
        )
        while queue and queue[-1][0] >= from_offset:
            _, waiter = queue.pop()
            self.answer(waiter, error)
        if queue is not None and not queue:
            del self.waiting[topic]

    def forget(self, topic: str) -> None:
        self.acked.pop(topic, None)


@dataclass(slots=True)
class MetadataLane:
    """Sequence numbers of metadata changes: `submitted` so far, `durable` (written, or
    failed: a failure is remembered by number and fails the replies that waited for it)."""

    submitted: int = 0
    durable: int = 0
    writing: bool = False
    pending: deque[Any] = field(default_factory=deque)
    failures: dict[int, str] = field(default_factory=dict)
    settling: list[tuple[int, int, int, Callable[[str | None], None]]] = field(default_factory=list)
    """A heap of (target, arrival, first, then): a write looks at the waiters it settles, not
    at every waiter (with 1,000 topics, a list walked at every write took 4 % of the main
    thread, issue 28 point 3)."""
    arrivals: int = 0

    def submit(self, change: Any) -> int:
        self.pending.append(change)
        self.submitted += 1
        return self.submitted

    def written(self, failure: str | None) -> None:
        self.durable += 1
        if failure is not None:
            self.failures[self.durable] = failure
            if len(self.failures) > MAX_REMEMBERED_FAILURES:
                del self.failures[min(self.failures)]
        settling = self.settling
        if not settling or settling[0][0] > self.durable:
            return
        ready = []
        while settling and settling[0][0] <= self.durable:
            ready.append(heapq.heappop(settling))
        ready.sort(key=_arrival)  # answered in the order they came, as before
        for target, _, first, then in ready:
            then(self.failure(first, target))

    def failure(self, first: int, target: int) -> str | None:
        for sequence in range(first, target + 1):
            failure = self.failures.get(sequence)
            if failure is not None:
                return failure
        return None

    def when_durable(self, first: int, target: int, then: Callable[[str | None], None]) -> None:
        """Calls `then` with the first failure among changes `first`..`target` (None: all
        durable) once they are all written."""
        if self.durable >= target:
            then(self.failure(first, target))
        else:
            self.arrivals += 1
            heapq.heappush(self.settling, (target, self.arrivals, first, then))


def _arrival(entry: tuple[int, int, int, Callable[[str | None], None]]) -> int:
    return entry[1]
