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


class World:
    def __init__(self, seed: int, *, keep_trace: int = 200, full_trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        """Simulated microseconds since the start."""
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._sequence = 0
        self._digest = hashlib.sha256()
        self.recent: deque[str] = deque(maxlen=keep_trace)
        """The last lines of the trace, for the report of a violation."""
        self.lines: list[str] | None = [] if full_trace else None
        self.events = 0
        self.answered_twice: Callable[[str], None] | None = None
        """Told when a request is answered a second time (the checker makes it a
        violation: each request gets exactly one answer)."""

    @property
    def now_ms(self) -> int:
        return self.now // US_PER_MS

    def at(self, delay_us: int, action: Callable[[], None]) -> None:
        """Runs `action` `delay_us` from now (after everything already due at that time)."""
        self._sequence += 1
        heapq.heappush(self._queue, (self.now + max(delay_us, 0), self._sequence, action))

    def log(self, line: str) -> None:
        """One trace line; the run's digest covers every line, so equal digests mean equal
        traces."""
        text = f"{self.now:>12} {line}"
        self._digest.update(text.encode())
        self._digest.update(b"\n")
        self.recent.append(text)
        if self.lines is not None:
            self.lines.append(text)

    def run_until(self, end_us: int, stop: Callable[[], bool] = lambda: False) -> None:
        """Executes events up to `end_us` (or until `stop()` holds after an event)."""
        queue = self._queue
        while queue and queue[0][0] <= end_us:
            time, _, action = heapq.heappop(queue)
            self.now = time
            self.events += 1
            action()
            if stop():
                return
        self.now = max(self.now, end_us)

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()
