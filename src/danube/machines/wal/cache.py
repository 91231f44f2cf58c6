"""A topic's hot cache: the recent records its WAL machine serves from memory (spec/memory.md).

Batches go in as they are appended, oldest first out. What bounds it: the topic's own
`WalConfig.cache_bytes`, retention (nothing below the first retained offset stays), and, when
the broker gives one, the broker-wide `CacheLedger` (`danube.machines.memory.ledger`) that
every topic's cache reports to and that evicts the broker's oldest batches, whichever topic
holds them, once the hot-cache pool is full. Sizes are the accounted ones
(`danube.machines.memory.accounting`): what a batch really costs in memory, not only its
payload bytes.

How a batch is held (issue 28): no Python object per record nor per batch. A batch is the
record region of its WAL frame (each record's 4-byte length, then its bytes), copied into the
cache's newest chunk, frames one after the other: a chunk is a run of `CHUNK_PAGES` pages
(more for a frame larger than that) of the process's page pool (`danube.machines.memory.
pages`), anonymous memory outside every allocator's heap. Where each batch and record lies is
kept in flat `array`s (first offset, accounted size, chunk, first record of each batch; each
record's position in its chunk). Reads slice records out on demand (copies the dispatcher
sends and drops: nothing read aliases a page, which another cache may get once it is given
back). As the oldest batches are evicted, the pages wholly before the oldest batch held go
back to the kernel at once (`madvise`), and the rest of a chunk when its last batch goes:
RSS follows the caches down as well as up, with no collection and no trim. Before, chunks
were `bytearray`s of 4 KiB (and frames of 1 KiB or more their own `bytes`) in glibc's heap,
which kept what eviction freed (fragmentation across 1,000 topics): evicting 1,000 caches of
52 MiB gave back 16.4 MiB of their 71 at once (bench/RESULTS.md, issue 28 part 13); and
before that, small objects in CPython's arenas, pinned by long-lived neighbours (the hunt:
evicting 10.5 MiB of cached objects gave back 1.4 MiB of RSS).
"""

from __future__ import annotations

import copy
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from danube.machines.memory.ledger import CacheLedger
from danube.machines.memory.pages import PAGE, PAGES, PagePool
from danube.machines.wal.layout import FRAME_HEADER

CHUNK_PAGES = 16
"""Pages a chunk (64 KiB): frames fill it one after the other, across its pages, so a frame
wastes nothing at a page's end, and at a chunk's end only the rest of the page it stopped in
(a page never written costs no RSS). A chunk's size is not what an evicted batch keeps alive:
pages go back as the batches before them go (`_give_back_front`), so a topic holds at most
two partly used pages beyond its batches (its oldest and its newest). Measured against one
page a chunk (a frame that does not fit the page's rest opens the next): 2 KiB and 4 KiB
single-record batches cost 2.1 times their accounted bytes there (one frame a page, or a
frame just over a page taking two), about 1.0 here (`bench/cache_memory.py`,
bench/RESULTS.md issue 28 part 13)."""
CHUNK_BYTES = CHUNK_PAGES * PAGE

_U32 = struct.Struct("<I")

_NO_BATCHES = array("q")
_NO_RECORDS = array("I")
"""Shared by every empty cache, never written: an empty cache's five arrays cost about
500 bytes, which every idle topic would carry (issue 23's bytes per idle topic). A cache
gets its own arrays at its first batch and goes back to these once it holds none."""


_FEW_POSITIONS = 32
"""Up to this many records a batch, `put_frame` shifts their positions as a list: faster than
numpy's three calls below about 30 (the same values: positions and shift are ints and
every start fits an unsigned 32-bit item)."""


def record_positions(frame: bytes, count: int) -> list[int]:
    """Where each of a frame's `count` records (its length prefix) starts in `frame`."""
    positions = []
    cursor = FRAME_HEADER
    unpack = _U32.unpack_from
    for _ in range(count):
        positions.append(cursor)
        cursor += 4 + unpack(frame, cursor)[0]
    return positions


class HotCache:
    """One topic's batches in offset order. Single-threaded, like its WAL machine."""

    __slots__ = (
        "_chunk_base",
        "_chunk_of",
        "_chunks",
        "_fill",
        "_firsts",
        "_front_given",
        "_head",
        "_ledger",
        "_limit",
        "_next_record",
        "_pool",
        "_record_base",
        "_records_at",
        "_runs",
        "_sizes",
        "_starts",
        "added_batches",
        "bytes",
        "dropped_batches",
        "ledger_popped",
        "topic",
    )

    def __init__(
        self,
        limit: int,
        topic: str = "",
        ledger: CacheLedger | None = None,
        pool: PagePool = PAGES,
    ) -> None:
        """`ledger`: the broker's, which every batch added and dropped is reported to;
        `pool`: where the chunks' pages come from (the process's)."""
        self.topic = topic
        self._ledger = ledger
        self._pool = pool
        self._limit = limit
        self.bytes = 0
        """Accounted bytes of the batches held."""
        self._chunks: list[bytes | memoryview] = []
        """Runs of pages (`memoryview`s of the pool's; `bytes` in a deep copy)."""
        self._runs = _NO_BATCHES
        """Per chunk: its pages, `handle << 16 | pages` for `PagePool.give_back`, or -1
        (a run longer than a slab, a mapping of its own, or a deep copy's `bytes`: nothing
        to give back)."""
        self._chunk_base = 0
        """The sequence number of `_chunks[0]` (chunks are numbered as they are opened)."""
        self._fill = 0
        """Bytes written into the newest chunk."""
        self._front_given = 0
        """Pages at the start of the oldest chunk given back already (`_give_back_front`)."""
        self._firsts = _NO_BATCHES
        """Per batch: its first offset."""
        self._sizes = _NO_BATCHES
        """Per batch: its accounted bytes."""
        self._chunk_of = _NO_BATCHES
        """Per batch: the sequence number of the chunk holding it."""
        self._records_at = _NO_BATCHES
        """Per batch: the number (counted over the cache's life) of its first record."""
        self._head = 0
        """Batches before this index are evicted (compacted away in bulk)."""
        self._starts = _NO_RECORDS
        """Per record: where its length prefix starts in its chunk."""
        self._record_base = 0
        """The number of the record `_starts[0]` is about."""
        self._next_record = 0
        self.added_batches = 0
        self.dropped_batches = 0
        """Batches added and dropped over the cache's life (the ledger's bookkeeping)."""
        self.ledger_popped = 0
        """The ledger's: how many of this cache's entries it has taken off its order."""

    @property
    def oldest(self) -> int | None:
        """The first offset of the oldest batch held, None when empty."""
        if self._head < len(self._firsts):
            return self._firsts[self._head]
        return None

    @property
    def chunk_count(self) -> int:
        """Buffers held (for tests and the memory dump)."""
        return len(self._chunks)

    def put(self, first: int, records: Sequence[bytes], size: int) -> None:
        """Adds the newest batch given as records (joined into one frame-shaped region)."""
        region = b"".join(part for r in records for part in (_U32.pack(len(r)), r))
        self.put_frame(first, bytes(FRAME_HEADER) + region, size, len(records))

    def put_frame(
        self,
        first: int,
        frame: bytes,
        size: int,
        count: int,
        positions: np.ndarray | Iterable[int] | None = None,
    ) -> None:
        """Adds the newest batch, the `count` records of a WAL `frame` (`positions`: where
        each record's length prefix starts in it, found from the frame when not given),
        then drops the oldest while over the topic's limit."""
        if positions is None:
            positions = record_positions(frame, count)
        if self._firsts is _NO_BATCHES:
            self._firsts, self._sizes = array("q"), array("q")
            self._chunk_of, self._records_at = array("q"), array("q")
            self._starts = array("I")
        chunks = self._chunks
        if self._runs is _NO_BATCHES:
            self._runs = array("q")
        region = len(frame) - FRAME_HEADER
        current = chunks[-1] if chunks else None
        fill = self._fill
        end = fill + region
        if type(current) is not memoryview or end > len(current):
            pages = max(CHUNK_PAGES, -(-region // PAGE))
            handle, current = self._pool.take(pages)
            chunks.append(current)
            self._runs.append(handle << 16 | pages if handle >= 0 else -1)
            fill, end = 0, region
        shift = fill - FRAME_HEADER
        current[fill:end] = memoryview(frame)[FRAME_HEADER:]
        self._fill = end
        if isinstance(positions, np.ndarray):
            if len(positions) > _FEW_POSITIONS:
                self._starts.frombytes((positions + shift).astype(np.uint32).tobytes())
            else:  # numpy's add, cast and copy cost more than a short list's (about 1 µs)
                self._starts.extend([p + shift for p in positions.tolist()])
        else:
            self._starts.extend(p + shift for p in positions)
        self._firsts.append(first)
        self._sizes.append(size)
        self._chunk_of.append(self._chunk_base + len(chunks) - 1)
        self._records_at.append(self._next_record)
        self._next_record += count
        self.added_batches += 1
        self.bytes += size
        ledger = self._ledger
        if ledger is not None:
            ledger.added(self, size)
        limit = self._limit
        while self.bytes > limit and self._drop_oldest():
            pass
        self._compact()
        if ledger is not None and ledger.total > ledger.limit:
            ledger.fit()

    def drop_oldest_for_ledger(self) -> None:
        """The ledger's eviction: the oldest batch goes (reported back to the ledger)."""
        self._drop_oldest()
        self._compact()

    def release(self) -> None:
        """The WAL machine is dropped (unload, repair, removal): everything goes, and the
        ledger stops counting it."""
        while self._drop_oldest():
            pass
        self._compact()

    def evict_below(self, first_retained: int) -> None:
        """Drops every batch that starts below `first_retained` (retention deleted it)."""
        firsts = self._firsts
        while self._head < len(firsts) and firsts[self._head] < first_retained:
            self._drop_oldest()
        self._compact()

    def holds(self, offset: int) -> bool:
        """Whether `offset` is at or after the oldest batch held (reads start here)."""
        oldest = self.oldest
        return oldest is not None and oldest <= offset

    def read(self, from_offset: int, limit: int, max_bytes: int) -> tuple[bytes, ...]:
        """Records `from_offset` ... below `limit`, at least one, then while they fit
        `max_bytes`. The caller checked `holds(from_offset)`."""
        firsts = self._firsts
        batch = bisect_right(firsts, from_offset, self._head) - 1
        batches = len(firsts)
        starts = self._starts
        unpack = _U32.unpack_from
        records: list[bytes] = []
        size = 0
        offset = from_offset
        while batch < batches and offset < limit:
            chunk = self._chunks[self._chunk_of[batch] - self._chunk_base]
            number = self._records_at[batch] + offset - firsts[batch]
            end = self._records_at[batch + 1] if batch + 1 < batches else self._next_record
            with memoryview(chunk) as view:
                while number < end:
                    start = starts[number - self._record_base]
                    length = unpack(chunk, start)[0]
                    if offset >= limit or (records and size + length > max_bytes):
                        return tuple(records)
                    records.append(bytes(view[start + 4 : start + 4 + length]))
                    size += length
                    offset += 1
                    number += 1
            batch += 1
        return tuple(records)

    def _drop_oldest(self) -> bool:
        """Drops the oldest batch, and the chunks no batch left uses; False when empty."""
        head = self._head
        if head >= len(self._firsts):
            return False
        size = self._sizes[head]
        self.bytes -= size
        self._head = head = head + 1
        self.dropped_batches += 1
        if head < len(self._firsts):
            unused = self._chunk_of[head] - self._chunk_base
        else:
            unused = len(self._chunks)
        if unused:
            self._give_back(unused)
        if self._ledger is not None:
            self._ledger.dropped(self, size)
        return True

    def _give_back(self, count: int, later: bool = False) -> None:
        """The `count` oldest chunks hold no batch: their pages go back to the kernel now
        (those of the oldest that `_give_back_front` gave back already excepted); `later`:
        from a finalizer, which must not take the pool's lock (`PagePool.give_back_later`)."""
        runs = self._runs
        given = [(run >> 16, run & 0xFFFF) for run in runs[:count] if run >= 0]
        if given and runs[0] >= 0 and self._front_given:
            handle, pages = given[0]
            given[0] = (handle + self._front_given, pages - self._front_given)
        self._front_given = 0
        del self._chunks[:count]
        self._chunk_base += count
        if len(self._chunks):
            del runs[:count]
        else:
            self._runs = _NO_BATCHES
        if given:
            if later:
                self._pool.give_back_later(given)
            else:
                self._pool.give_back_runs(given)

    def __deepcopy__(self, memo: dict[int, Any]) -> HotCache:
        """A copy (tests compare a machine's state before and after a call) holds its chunks as
        `bytes` and none of the original's pages, which it must never give back; a frame put
        into it later opens pages of its own."""
        clone = HotCache.__new__(HotCache)
        memo[id(self)] = clone
        for name in HotCache.__slots__:
            value = getattr(self, name)
            if name == "_chunks":
                value = [bytes(chunk) for chunk in value]
            elif name == "_runs":
                value = array("q", [-1] * len(value)) if len(value) else _NO_BATCHES
            elif name == "_front_given":
                value = 0
            elif name != "_pool" and not (value is _NO_BATCHES or value is _NO_RECORDS):
                value = copy.deepcopy(value, memo)
            setattr(clone, name, value)
        return clone

    def __del__(self) -> None:
        """A cache dropped without `release` (a machine thrown away, a simulated broker
        discarded) still gives its pages back: the pool would keep them otherwise."""
        try:
            if self._chunks:
                self._give_back(len(self._chunks), later=True)
            # Empty from here on, batches included: the collector finalizes every object of a
            # garbage cycle before it clears any, so the cycle's other objects may still use
            # this cache (a closed publish generator's `finally` releasing its pool room made
            # the ledger evict from it, and the batches left without chunks raised IndexError;
            # tests/sim run of the cluster data simulator). Its ledger is in the same garbage
            # (it references every cache it counts) and is not told.
            self._firsts = self._sizes = self._chunk_of = self._records_at = _NO_BATCHES
            self._starts = _NO_RECORDS
            self._head = 0
            self._record_base = self._next_record
            self.bytes = 0
        except Exception:
            if not sys.is_finalizing():  # the pool may be gone at shutdown; otherwise a bug
                raise

    def _give_back_front(self) -> None:
        """The pages of the oldest chunk wholly before its oldest batch held go back now: an
        evicted batch keeps at most the page it shares with the next (a chunk is many pages,
        `CHUNK_PAGES`, given back as its batches go, not when its last one does)."""
        head = self._head
        if head >= len(self._firsts) or self._chunk_of[head] != self._chunk_base:
            return
        run = self._runs[0]
        at = self._records_at[head] - self._record_base
        if run < 0 or at >= len(self._starts):
            return
        below = self._starts[at] // PAGE
        if below > self._front_given:
            self._pool.give_back((run >> 16) + self._front_given, below - self._front_given)
            self._front_given = below

    def _compact(self) -> None:
        """Gives back the pages evicted batches left wholly unused, then forgets the evicted
        batches' entries in bulk, once they are half of them."""
        self._give_back_front()
        head = self._head
        if not head or head <= len(self._firsts) // 2:
            return
        if head >= len(self._firsts):  # nothing held: back to the shared empty arrays
            self._firsts = self._sizes = self._chunk_of = self._records_at = _NO_BATCHES
            self._starts = _NO_RECORDS
            self._record_base = self._next_record
            self._head = 0
            return
        kept = self._records_at[head] if head < len(self._firsts) else self._next_record
        del self._firsts[:head]
        del self._sizes[:head]
        del self._chunk_of[:head]
        del self._records_at[:head]
        del self._starts[: kept - self._record_base]
        self._record_base = kept
        self._head = 0
