"""Virtual time, the event queue, the one seeded RNG and the trace.

Everything in a simulation happens in an event popped from one queue, ordered by (time,
sequence number), so two runs with the same seed execute the same events in the same order.
Time is in microseconds; the broker's machines read milliseconds.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import deque
from collections.abc import Callable

US_PER_MS = 1_000
US_PER_S = 1_000_000

_push = heapq.heappush
_SEQUENCE_BITS = 40
"""An event's place in the queue is one int, its time shifted left by this many bits plus
its sequence number: (time, sequence) order, compared as one int (a heap of tuples compared
two tuples item by item at every step of every push and pop). 2**40 events is far beyond
any run (a cluster run with data planes schedules about 1,000 a simulated second)."""
_SEQUENCE_MASK = (1 << _SEQUENCE_BITS) - 1


_CHUNK = 512
"""Trace lines gathered before they go into the digest at once: hashing one joined chunk
gives the digest of hashing each line, at a fraction of the calls (a run logs a line for
most of its events). At least the lines `recent` keeps."""


class World:
    def __init__(self, seed: int, *, keep_trace: int = 200, full_trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        """Simulated microseconds since the start."""
        self._queue: list[int] = []
        """The pending events' places (`_SEQUENCE_BITS`), a heap."""
        self._actions: dict[int, Callable[[], None]] = {}
        """Place -> what runs then."""
        self._sequence = 0
        self._digest = hashlib.sha256()
        self._keep = keep_trace
        self._pending: list[str] = []
        """Trace lines not yet in the digest (at most `_CHUNK`)."""
        self._previous: list[str] = []
        """The chunk that went into the digest last (for `recent`)."""
        self._lines: list[str] | None = [] if full_trace else None
        self.events = 0
        self.answered_twice: Callable[[str], None] | None = None
        """Told when a request is answered a second time (the checker makes it a
        violation: each request gets exactly one answer)."""

    @property
    def now_ms(self) -> int:
        return self.now // US_PER_MS

    def at(self, delay_us: int, action: Callable[[], None]) -> None:
        """Runs `action` `delay_us` from now (after everything already due at that time)."""
        self._sequence = sequence = self._sequence + 1
        now = self.now
        place = (now + delay_us if delay_us > 0 else now) << _SEQUENCE_BITS | sequence
        _push(self._queue, place)
        self._actions[place] = action

    def log(self, line: str) -> None:
        """One trace line; the run's digest covers every line, so equal digests mean equal
        traces."""
        pending = self._pending
        pending.append(f"{str(self.now).rjust(12)} {line}")  # `:>12`'s text, at half its cost
        if len(pending) >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        pending.append("")  # each line ends with a newline
        self._digest.update("\n".join(pending).encode())
        pending.pop()
        if self._lines is not None:
            self._lines.extend(pending)
        self._previous, self._pending = pending, []

    @property
    def recent(self) -> list[str]:
        """The last lines of the trace, for the report of a violation."""
        pending = self._pending
        if len(pending) >= self._keep:
            return pending[len(pending) - self._keep :]
        return (self._previous + pending)[-self._keep :] if self._keep else []

    @property
    def lines(self) -> list[str] | None:
        """The whole trace, when the world keeps it (`full_trace`)."""
        if self._lines is not None:
            self._flush()
        return self._lines

    def run_until(self, end_us: int, stop: Callable[[], bool] = lambda: False) -> None:
        """Executes events up to `end_us` (or until `stop()` holds after an event)."""
        queue, take, pop = self._queue, self._actions.pop, heapq.heappop
        last = end_us << _SEQUENCE_BITS | _SEQUENCE_MASK  # the last place at `end_us`
        done = 0  # counted here, added once (also when an event raises)
        try:
            while queue and queue[0] <= last:
                place = pop(queue)
                self.now = place >> _SEQUENCE_BITS
                done += 1
                take(place)()
                if stop():
                    return
        finally:
            self.events += done
        if end_us > self.now:
            self.now = end_us

    @property
    def digest(self) -> str:
        self._flush()
        return self._digest.hexdigest()


class Timeout:
    """One pending timeout of `Timeouts`: its deadline, and what runs then (None once
    cleared)."""

    __slots__ = ("deadline", "expired")

    def __init__(self, deadline: int, expired: Callable[[], None]) -> None:
        self.deadline = deadline
        self.expired: Callable[[], None] | None = expired

    def clear(self) -> None:
        self.expired = None


class Timeouts:
    """The timeouts of one caller's requests, all of one length, on one timer.

    A timeout is almost never due: its request is answered first. One event per timeout
    was about one event in eighteen of a cluster run with data planes, each finding its
    request answered. Deadlines of one length grow in the order they are set, so one timer
    at the oldest pending deadline serves them all; an answered request's timeout is only
    cleared, and dropped when the timer passes it. A timeout fires at exactly its deadline,
    as its own event did (only its place among events of the same microsecond differs)."""

    __slots__ = ("_armed", "_pending", "length_us", "world")

    def __init__(self, world: World, length_us: int) -> None:
        self.world = world
        self.length_us = length_us
        self._pending: deque[Timeout] = deque()
        """Oldest first."""
        self._armed = False

    def start(self, expired: Callable[[], None]) -> Timeout:
        """Runs `expired` at now + `length_us` unless the timeout is cleared first."""
        world = self.world
        timeout = Timeout(world.now + self.length_us, expired)
        self._pending.append(timeout)
        if not self._armed:
            self._armed = True
            world.at(self.length_us, self._fire)
        return timeout

    def _fire(self) -> None:
        pending, now = self._pending, self.world.now
        while pending and (pending[0].expired is None or pending[0].deadline <= now):
            expired = pending.popleft().expired
            if expired is not None:
                expired()
        if pending:
            self.world.at(pending[0].deadline - now, self._fire)
        else:
            self._armed = False
