"""A topic's hot cache: the recent records its WAL machine serves from memory (spec/memory.md).

Batches go in as they are appended, oldest first out. What bounds it: the topic's own
`WalConfig.cache_bytes`, retention (nothing below the first retained offset stays), and, when
the broker gives one, the broker-wide `CacheLedger` (`danube.machines.memory.ledger`) that
every topic's cache reports to and that evicts the broker's oldest batches, whichever topic
holds them, once the hot-cache pool is full. Sizes are the accounted ones
(`danube.machines.memory.accounting`): what a batch really costs in memory, not only its
payload bytes.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from danube.machines.memory.ledger import CacheLedger
from danube.values.frozen import fast_init


@fast_init
@dataclass(frozen=True, slots=True)
class CachedBatch:
    first_offset: int
    records: Sequence[bytes]
    size: int
    """Accounted bytes (what the batch costs in memory)."""


def _first_offset(batch: CachedBatch) -> int:
    return batch.first_offset


class HotCache:
    """One topic's batches in offset order. Single-threaded, like its WAL machine."""

    __slots__ = ("_batches", "_head", "_ledger", "_limit", "bytes", "topic")

    def __init__(self, limit: int, topic: str = "", ledger: CacheLedger | None = None) -> None:
        """`ledger`: the broker's, which every batch added and dropped is reported to."""
        self.topic = topic
        self._ledger = ledger
        self._batches: list[CachedBatch] = []
        self._head = 0
        """Batches before this index are evicted (compacted away in bulk)."""
        self._limit = limit
        self.bytes = 0
        """Accounted bytes of the batches held."""

    @property
    def oldest(self) -> int | None:
        """The first offset of the oldest batch held, None when empty."""
        if self._head < len(self._batches):
            return self._batches[self._head].first_offset
        return None

    def put(self, first: int, records: Sequence[bytes], size: int) -> None:
        """Adds the newest batch, then drops the oldest while over the topic's limit."""
        self._batches.append(CachedBatch(first, records, size))
        self.bytes += size
        ledger = self._ledger
        if ledger is not None:
            ledger.added(self, first, size)
        limit = self._limit
        while self.bytes > limit and self._drop_oldest():
            pass
        self._compact()
        if ledger is not None and ledger.total > ledger.pool:
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
        batches = self._batches
        while self._head < len(batches) and batches[self._head].first_offset < first_retained:
            self._drop_oldest()
        self._compact()

    def holds(self, offset: int) -> bool:
        """Whether `offset` is at or after the oldest batch held (reads start here)."""
        oldest = self.oldest
        return oldest is not None and oldest <= offset

    def read(self, from_offset: int, limit: int, max_bytes: int) -> tuple[bytes, ...]:
        """Records `from_offset` ... below `limit`, at least one, then while they fit
        `max_bytes`. The caller checked `holds(from_offset)`."""
        batches = self._batches
        index = bisect_right(batches, from_offset, self._head, key=_first_offset) - 1
        records: list[bytes] = []
        size = 0
        offset = from_offset
        for batch in itertools.islice(batches, index, None):
            batch_records = batch.records
            for position in range(offset - batch.first_offset, len(batch_records)):
                record = batch_records[position]
                if offset >= limit or (records and size + len(record) > max_bytes):
                    return tuple(records)
                records.append(record)
                size += len(record)
                offset += 1
        return tuple(records)

    def _drop_oldest(self) -> bool:
        """Drops the oldest batch; False when there is none."""
        if self._head >= len(self._batches):
            return False
        size = self._batches[self._head].size
        self.bytes -= size
        self._head += 1
        if self._ledger is not None:
            self._ledger.dropped(self, size)
        return True

    def _compact(self) -> None:
        if self._head > len(self._batches) // 2:
            del self._batches[: self._head]
            self._head = 0
