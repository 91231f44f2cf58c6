"""Pages for the hot caches, carved out of anonymous `mmap` slabs, whose memory goes back to
the kernel the moment they are given back (spec/memory.md "Accounting"; issue 28 part 13).

Why: the hot caches' chunks were `bytearray`s in glibc's heap. Evicting them left free memory
the allocator keeps (fragmentation across 1,000 topics' interleaved chunks), so the process's
RSS followed the caches up and not down: the 10-minute soak ended +27.5 % over its pre-load
RSS, and a "return of memory" (a full collection and `malloc_trim`) held the loop 240-268 ms
to free a few hundred KiB. A page here is `PAGE` bytes (the system's page) of a slab mapped
private and anonymous, `SLAB_PAGES` pages a slab, kept for the process's life (its address
space, not its memory: a page never touched or given back costs no RSS). A page given back is
`madvise(MADV_DONTNEED)`-ed at once: the kernel takes its memory back then (no collection, no
trim), and it reads as zeros when it is used again. Consecutive pages given back together are
advised in one call.

A take visits only slabs that fit (issue 28 part 15): each slab's longest free run is kept, and
the slabs are bucketed by it, with a bit mask of the buckets not empty; a take of `n` pages
picks the lowest non-empty bucket of `n` or more (best fit by longest run, one bit operation)
and looks for the run in that slab alone (`find`, in C, over `SLAB_PAGES` bytes). It scanned
every partly free slab before: 251 us a take at 2,000 fragmented slabs.

A caller takes a run of `n` contiguous pages from one slab (one page for small frames; a
frame larger than a page takes the pages it needs) as a writable `memoryview` and a handle; a
run longer than a slab is a mapping of its own, unmapped when its last view goes. Nothing
read out of a page may alias it once given back: the caches copy what they return.

Not a machine: an allocator with system calls, kept beside the pools it serves. Process-wide
(`PAGES`), like malloc: the simulator's many brokers in one process share it, which decides
nothing (what to evict stays the ledger's). The machines using it are single-threaded, but a
cache collected as garbage gives its pages back from whichever thread the collector runs in (a
worker of `trio.to_thread`): a lock keeps the free maps whole.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from collections import deque
from dataclasses import dataclass

PAGE = mmap.PAGESIZE
"""Bytes a page: the system's page, the unit the kernel takes back."""
SLAB_PAGES = 256
"""Pages a slab (1 MiB with 4 KiB pages): one `mmap` call per MiB of cache at most, and a
slab's free map (`bytearray(SLAB_PAGES)`) searched in C for a run."""

_FREE, _USED = 0, 1
_USED_BYTE = b"\x01"
_FLAGS = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
"""Private: a shared anonymous mapping's pages stay in its shmem object when advised away
(RSS falls, memory does not)."""


@dataclass(slots=True)
class PageStats:
    """What the pool holds (for metrics, the memory dump and the benchmarks)."""

    slabs: int
    """Slabs mapped (each `SLAB_PAGES` pages of address space, kept)."""
    in_use: int
    """Pages handed out and not given back (slab pages only)."""
    own_mappings: int
    """Runs longer than a slab handed out as mappings of their own, alive now."""
    given_back: int
    """Pages given back over the pool's life (each advised away at once)."""
    advise_calls: int
    """`madvise` calls made (consecutive pages share one)."""


class PagePool:
    """Hands out runs of pages and takes them back (module docstring)."""

    __slots__ = (
        "_advise_calls",
        "_buckets",
        "_free",
        "_given_back",
        "_in_use",
        "_later",
        "_lock",
        "_longest",
        "_maps",
        "_mask",
        "_own",
        "_place",
        "_runs",
        "_slab_pages",
        "_views",
        "bad_give_backs",
    )

    def __init__(self, slab_pages: int = SLAB_PAGES) -> None:
        if slab_pages < 1:
            raise ValueError(f"a slab needs at least one page, got {slab_pages}")
        self._slab_pages = slab_pages
        self._maps: list[mmap.mmap] = []
        self._views: list[memoryview] = []
        """Per slab: a view of all of it, sliced for each run handed out."""
        self._free: list[bytearray] = []
        """Per slab: one byte a page, `_FREE` or `_USED` (`find` looks for a run in C)."""
        self._longest: list[int] = []
        """Per slab: its longest run of free pages."""
        self._buckets: list[list[int]] = [[] for _ in range(slab_pages + 1)]
        """By longest free run (1 to `slab_pages`): the slabs with that longest run, in no
        order (removed by moving the last into the hole: O(1); a dict or a set would do it
        too, but finding the first entry of one that had many removed walks their slots).
        Full slabs (0) are in none."""
        self._runs = tuple(bytes(n) for n in range(slab_pages + 1))
        """`_runs[n]`: a run of `n` free pages, as `find` looks for it."""
        self._place: list[int] = []
        """Per slab: its index in its bucket."""
        self._mask = 0
        """Bit `n` set: bucket `n` holds a slab."""
        self._in_use = 0
        self._given_back = 0
        self._advise_calls = 0
        self.bad_give_backs = 0
        """Spans queued by finalizers that were not all handed out (skipped, not released)."""
        self._own = 0
        self._lock = threading.Lock()
        self._later: deque[tuple[int, int]] = deque()
        """Runs given back by `give_back_later` (a finalizer), released at the next `take` or
        `give_back_runs`, under the lock."""

    @property
    def slab_pages(self) -> int:
        return self._slab_pages

    def stats(self) -> PageStats:
        with self._lock:
            self._release_later()
        return PageStats(
            len(self._maps), self._in_use, self._own, self._given_back, self._advise_calls
        )

    def take(self, pages: int = 1) -> tuple[int, memoryview]:
        """A run of `pages` contiguous pages: its handle (for `give_back`) and a writable view
        of its `pages * PAGE` bytes (zeros when never used, or reused after a give back).
        Longer than a slab: a mapping of its own, handle -1, unmapped once its view and every
        view of it are gone (nothing to give back)."""
        if pages < 1:
            raise ValueError(f"a run needs at least one page, got {pages}")
        if pages > self._slab_pages:
            return -1, self._own_mapping(pages)
        with self._lock:
            self._release_later()
            return self._take(pages)

    def _take(self, pages: int) -> tuple[int, memoryview]:
        fitting = self._mask >> pages
        if fitting:
            slab = self._buckets[pages + ((fitting & -fitting).bit_length() - 1)][-1]
            free = self._free[slab]
            at = free.find(self._runs[pages])  # found: the slab's longest run fits
            if at < 0:  # the record said it fits: bookkeeping broken, fail before corrupting
                raise RuntimeError(f"page pool: slab {slab}'s longest free run is stale")
        else:
            slab = self._new_slab()
            free = self._free[slab]
            at = 0
        # `at` starts the first run that fits (the first `pages` free bytes in a row)
        end = free.find(_USED_BYTE, at)
        run = (self._slab_pages if end < 0 else end) - at
        free[at : at + pages] = _USED_BYTE * pages
        was = self._longest[slab]
        if run == was and free.find(self._runs[was]) < 0:  # the one longest run was cut
            self._refile(slab, self._longest_from(free, run - pages, was - 1))
        self._in_use += pages
        start = at * PAGE
        return slab * self._slab_pages + at, self._views[slab][start : start + pages * PAGE]

    def _longest_from(self, free: bytearray, low: int, high: int) -> int:
        """The longest free run of a slab's map known to be `low` to `high` pages: a binary
        search of `find`s (in C, at most log2(`SLAB_PAGES`) of them)."""
        runs = self._runs
        while low < high:  # a run of `low` fits, one of `high + 1` does not
            middle = (low + high + 1) // 2
            if free.find(runs[middle]) >= 0:
                low = middle
            else:
                high = middle - 1
        return low

    def _refile(self, slab: int, now: int) -> None:
        """The slab's longest free run is `now` pages: kept, and the slab moved to that run's
        bucket."""
        was = self._longest[slab]
        if now == was:
            return
        self._longest[slab] = now
        buckets, place = self._buckets, self._place
        if was:
            bucket = buckets[was]
            last = bucket.pop()
            if last != slab:
                bucket[place[slab]] = last
                place[last] = place[slab]
            if not bucket:
                self._mask &= ~(1 << was)
        if now:
            bucket = buckets[now]
            place[slab] = len(bucket)
            bucket.append(slab)
            self._mask |= 1 << now

    def give_back(self, handle: int, pages: int) -> None:
        """The run `take` handed out as `handle` is free: its memory goes back to the kernel
        now. Its views must no longer be read (the pages will be handed out again)."""
        if handle >= 0:
            self.give_back_runs(((handle, pages),))

    def give_back_runs(self, runs: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> None:
        """`give_back` of several runs, consecutive pages of one slab advised in one call."""
        spans = sorted((h, n) for h, n in runs if h >= 0)
        with self._lock:
            self._release_later()
            self._release_spans(spans)

    def give_back_later(self, runs: list[tuple[int, int]]) -> None:
        """`give_back_runs` for a finalizer (`HotCache.__del__`): queued without the lock and
        released at the next `take` or `give_back_runs`. The cyclic collector runs finalizers
        inside whatever allocation crosses its threshold, including those `take` makes while
        it holds the (non-reentrant) lock: a finalizer that took the lock there waited for its
        own thread for ever (review finding, reproduced with a lowered threshold)."""
        self._later.extend([run for run in runs if run[0] >= 0])

    def _release_later(self) -> None:
        later = self._later
        if later:
            spans: list[tuple[int, int]] = []
            while later:  # a finalizer may append while this runs: popleft is atomic
                spans.append(later.popleft())
            spans.sort()
            self._release_spans(spans, tolerant=True)

    def _release_spans(self, spans: list[tuple[int, int]], tolerant: bool = False) -> None:
        """`tolerant`: a bad span (queued by a finalizer) is counted and skipped, the others
        released, instead of failing the unrelated `take` that released the queue."""
        index = 0
        while index < len(spans):
            first, count = spans[index]
            index += 1
            while (
                index < len(spans)
                and spans[index][0] == first + count
                and (first // self._slab_pages == spans[index][0] // self._slab_pages)
            ):
                count += spans[index][1]
                index += 1
            if not tolerant:
                self._release(first, count)
                continue
            try:
                self._release(first, count)
            except ValueError:
                self.bad_give_backs += 1  # counted (a machine does not log); pages kept

    def _release(self, first: int, count: int) -> None:
        slab, at = divmod(first, self._slab_pages)
        free = self._free[slab]
        if at + count > self._slab_pages or free.find(_FREE, at, at + count) >= 0:
            raise ValueError(f"pages {first}..{first + count - 1} were not all handed out")
        self._maps[slab].madvise(mmap.MADV_DONTNEED, at * PAGE, count * PAGE)
        self._advise_calls += 1
        free[at : at + count] = bytes(count)
        self._in_use -= count
        self._given_back += count
        # the run now free around them: from the used page before to the used page after
        end = free.find(_USED_BYTE, at + count)
        run = (self._slab_pages if end < 0 else end) - (free.rfind(_USED_BYTE, 0, at) + 1)
        if run > self._longest[slab]:
            self._refile(slab, run)

    def _new_slab(self) -> int:
        slab = len(self._maps)
        mapped = mmap.mmap(-1, self._slab_pages * PAGE, flags=_FLAGS)
        self._maps.append(mapped)
        self._views.append(memoryview(mapped))
        self._free.append(bytearray(self._slab_pages))
        self._longest.append(0)
        self._place.append(0)
        self._refile(slab, self._slab_pages)
        return slab

    def _own_mapping(self, pages: int) -> memoryview:
        mapped = mmap.mmap(-1, pages * PAGE, flags=_FLAGS)
        self._own += 1
        # Unmapped when its last view goes; the count follows (nothing else would tell).
        weakref.finalize(mapped, _own_gone, self)
        return memoryview(mapped)


def _own_gone(pool: PagePool) -> None:
    pool._own -= 1


PAGES = PagePool()
"""The process's pool: every hot cache's pages."""
