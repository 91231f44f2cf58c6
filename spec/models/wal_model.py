"""Reference model of the WAL's promises (spec/durability.md): the oracle of tests/wal.

It knows nothing of segments, frames, caches or group commit. A topic is a list of records
(offset = index); each record has reached a level: assigned an offset, written (the OS has
it), or synced (on disk). The test harness reports what its simulated disk really did; the
model then says whether an `Acknowledge` or `Readable` claim was allowed, and what must,
may and may not be found after each kind of crash.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Level(enum.IntEnum):
    ASSIGNED = 0
    WRITTEN = 1
    """In the OS page cache: survives a process crash, not a power failure."""
    SYNCED = 2
    """On disk: survives both."""


class Crash(enum.Enum):
    PROCESS = "process"
    """The broker dies, the OS lives on: written data survives."""
    POWER = "power"
    """The machine loses power: only synced data survives (and maybe some of the rest)."""


class WalModel:
    """What one topic's WAL may claim and must keep."""

    def __init__(self, fsync_mode: bool) -> None:
        self.fsync_mode = fsync_mode
        self.records: list[bytes] = []
        self.levels: list[Level] = []
        self.first = 0
        """Offsets below this were deleted by retention."""
        self.acknowledged = 0
        """Every append ending below this offset has been acknowledged."""
        self.readable = 0
        """Offsets below this may have been delivered."""
        self.lost: list[int] = []
        """Acknowledged offsets lost in the windows the durability mode documents."""

    @property
    def next_offset(self) -> int:
        return len(self.records)

    @property
    def promised(self) -> Level:
        """The level a record must reach before it is acknowledged or delivered."""
        return Level.SYNCED if self.fsync_mode else Level.WRITTEN

    # -- what happened --------------------------------------------------------------------------

    def append(self, records: Iterable[bytes]) -> int:
        first = len(self.records)
        for record in records:
            self.records.append(record)
            self.levels.append(Level.ASSIGNED)
        return first

    def reached(self, offsets: Iterable[int], level: Level) -> None:
        """The disk reports that these records reached `level`."""
        for offset in offsets:
            self.levels[offset] = max(self.levels[offset], level)

    def retain_from(self, first: int) -> None:
        """Retention deleted every record below `first`; it may only delete synced ones."""
        assert first >= self.first, f"retention moved back from {self.first} to {first}"
        for offset in range(self.first, first):
            assert self.levels[offset] is Level.SYNCED, f"deleted unsynced offset {offset}"
        self.first = first

    def truncate(self, next_offset: int) -> None:
        """Records from `next_offset` on were cut off (after a failed write or fsync). Only
        `FLUSH` mode may lose acknowledged records this way."""
        for offset in range(next_offset, min(self.acknowledged, len(self.records))):
            assert not self.fsync_mode, f"truncation lost acknowledged offset {offset}"
            self.lost.append(offset)
        del self.records[next_offset:], self.levels[next_offset:]
        self.acknowledged = min(self.acknowledged, next_offset)
        self.readable = min(self.readable, next_offset)

    # -- what the WAL claims --------------------------------------------------------------------

    def acknowledge(self, through: int) -> None:
        assert through + 1 >= self.acknowledged, "Acknowledge went backwards"
        self._check_promised(through, "acknowledged")
        self.acknowledged = through + 1

    def make_readable(self, through: int) -> None:
        assert through + 1 >= self.readable, "Readable went backwards"
        self._check_promised(through, "readable")
        self.readable = through + 1

    def _check_promised(self, through: int, what: str) -> None:
        assert through < len(self.records), f"{what} offset {through} was never assigned"
        for offset in range(self.first, through + 1):
            assert self.levels[offset] >= self.promised, (
                f"offset {offset} {what} at level {self.levels[offset].name}"
            )

    # -- crashes --------------------------------------------------------------------------------

    def must_survive(self, crash: Crash) -> list[int]:
        needed = Level.WRITTEN if crash is Crash.PROCESS else Level.SYNCED
        return [o for o in range(self.first, len(self.records)) if self.levels[o] >= needed]

    def recover(self, crash: Crash, first: int, records: list[bytes]) -> None:
        """Checks what recovery found (`records` from offset `first` on) and continues from
        it. Found records must be the ones assigned, at their offsets; nothing that had to
        survive may be missing; an acknowledged record may be missing only after a power
        failure in `FLUSH` mode (its documented loss window)."""
        assert first == self.first, f"recovery starts at {first}, retention kept {self.first}"
        end = first + len(records)
        assert end <= len(self.records), f"recovery found offsets up to {end - 1}, never assigned"
        for offset, record in enumerate(records, first):
            assert record == self.records[offset], f"offset {offset} recovered different bytes"
        missing = [o for o in self.must_survive(crash) if o >= end]
        assert not missing, f"{crash.value} crash lost offsets {missing[:5]}..."
        for offset in range(end, min(self.acknowledged, len(self.records))):
            assert crash is Crash.POWER and not self.fsync_mode, f"lost acked offset {offset}"
            self.lost.append(offset)
        del self.records[end:], self.levels[end:]
        # Recovery syncs what it keeps, and everything it keeps is readable at once.
        self.levels = [Level.SYNCED] * len(self.records)
        self.acknowledged = self.readable = end
