"""Ids of producers gone from this broker, and why (spec/memory.md, "Departed clients").

A publish with the id of a producer that is gone is answered by why it went: its topic moved
to another broker or the producer expired for idleness (UNAVAILABLE, which Danube's clients
recover from by looking the topic up and creating the producer again), or its topic was
deleted here (NOT_FOUND, even once a topic of that name is created again). An id not
remembered gets what an unknown id gets (`Producers._publisher`).

Up to `MAX_REMEMBERED` are remembered, the oldest forgotten first. They were dicts of
Python ints (and a tuple each for the moved and expired), 107 bytes an id by tracemalloc
(`python -m bench.departed_sweep --remembered 100000`), 10 MiB at the bound for each of the
two dicts, outside any pool. Now they are parallel arrays sorted by id: the id (8 bytes),
when it was remembered (8, for the oldest-first order), why (1) and its topic's name (a
reference, 8; the string is its topic record's, shared by every id of that topic), charged
to the state pool at `danube.machines.memory.state.REMEMBERED_ID_BYTES` each
(`StatePool.remembered`, fed at each tick). A sorted insert copies the arrays, so new ids wait
in a small dict (`PENDING` at most) and go in together: a topic's producers, one idle
sweep's, a shutdown's thousand topics cost a copy per `PENDING` ids, not one per topic.

Pure: ids in, answers out.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import numpy as np

MAX_REMEMBERED = 100_000
"""Ids remembered at most (and up to `PENDING` more, not yet merged): a client that comes back
after 100,000 other producers went gets what an unknown id gets."""
PENDING = 4_096
"""New ids kept in a dict before they are merged into the arrays (about 150 bytes each
there: at most 600 KiB)."""


class Gone(enum.IntEnum):
    """Why a remembered producer is gone."""

    DELETED = 1
    """Its topic was deleted here."""
    MOVED = 2
    """Its topic moved to another broker."""
    EXPIRED = 3
    """It neither published nor was health-checked for the idle timeout."""


class RememberedProducers:
    """The remembered ids (module docstring): sorted by id, with parallel arrays."""

    __slots__ = ("_ids", "_kinds", "_next", "_pending", "_seqs", "_topics", "limit")

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self._ids = np.zeros(0, dtype=np.uint64)
        self._seqs = np.zeros(0, dtype=np.int64)
        """When each was remembered (a running count): the smallest go first."""
        self._kinds = np.zeros(0, dtype=np.uint8)
        self._topics = np.zeros(0, dtype=object)
        """The topic's name (a reference to its record's string; "" for a deleted topic)."""
        self._next = 0
        self._pending: dict[int, tuple[Gone, str]] = {}
        """Remembered since the last merge, newest last (they override the arrays)."""

    def __len__(self) -> int:
        """Ids remembered (one remembered again before a merge counts twice until it)."""
        return len(self._ids) + len(self._pending)

    def __contains__(self, producer_id: int) -> bool:
        return self.why(producer_id) is not None

    def why(self, producer_id: int) -> tuple[Gone, str] | None:
        """Why the producer is gone and its topic, or None when the id is not remembered."""
        pending = self._pending.get(producer_id)
        if pending is not None:
            return pending
        at = self._find(producer_id)
        if at is None:
            return None
        return Gone(int(self._kinds[at])), str(self._topics[at])

    def remember(self, producer_ids: Iterable[int], why: Gone, topic: str = "") -> None:
        """These producers are gone for `why` (remembered again if they were: as the newest,
        with the new reason); the oldest beyond `limit` are forgotten."""
        pending = self._pending
        for producer_id in producer_ids:
            pending.pop(producer_id, None)  # the newest last
            pending[producer_id] = (why, topic)
        if len(pending) >= min(PENDING, self.limit):
            self.merge()

    def merge(self) -> None:
        """The pending ids go into the arrays, in one sorted insert."""
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        ids = np.fromiter(pending, dtype=np.uint64, count=len(pending))
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        kinds = np.fromiter((w for w, _ in pending.values()), dtype=np.uint8, count=len(ids))
        names = np.empty(len(ids), dtype=object)
        names[:] = [t for _, t in pending.values()]
        seqs = np.arange(self._next, self._next + len(ids), dtype=np.int64)
        self._next += len(ids)
        known = np.isin(self._ids, ids, assume_unique=True)
        if known.any():  # remembered again: the new reason, as the newest
            keep = ~known
            self._ids, self._seqs = self._ids[keep], self._seqs[keep]
            self._kinds, self._topics = self._kinds[keep], self._topics[keep]
        at = np.searchsorted(self._ids, ids)
        self._ids = np.insert(self._ids, at, ids)
        self._seqs = np.insert(self._seqs, at, seqs[order])
        self._kinds = np.insert(self._kinds, at, kinds[order])
        self._topics = np.insert(self._topics, at, names[order])
        self._forget_oldest()

    def remember_deleted(self, producer_ids: Iterable[int]) -> None:
        """Producers of a deleted topic, except those remembered as moved or expired (a
        client told to look its topic up keeps being told so)."""
        self.remember((p for p in producer_ids if p not in self), Gone.DELETED)

    def _forget_oldest(self) -> None:
        over = len(self._ids) - self.limit
        if over <= 0:
            return
        cutoff = np.partition(self._seqs, over - 1)[over - 1]  # the over-th oldest
        keep = self._seqs > cutoff
        self._ids, self._seqs = self._ids[keep], self._seqs[keep]
        self._kinds, self._topics = self._kinds[keep], self._topics[keep]

    def _find(self, producer_id: int) -> int | None:
        if not 0 < producer_id < 1 << 64:
            return None
        key = np.uint64(producer_id)
        at = int(np.searchsorted(self._ids, key))
        return at if at < len(self._ids) and self._ids[at] == key else None

    def nbytes(self) -> int:
        """Bytes the arrays hold (their buffers, not the shared topic names); `merge` first
        to count the pending ones."""
        arrays = (self._ids, self._seqs, self._kinds, self._topics)
        return sum(a.nbytes for a in arrays)
