"""The hot caches' page pool (`danube.machines.memory.pages`, issue 28 part 13): pages carved
out of mmap slabs, reused, and given back to the kernel at once (RSS falls, no collection, no
malloc_trim)."""

from __future__ import annotations

import gc
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.memory.pages import PAGE, PagePool

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_SIZE


def test_a_page_given_back_is_handed_out_again_and_reads_as_zeros() -> None:
    pool = PagePool(slab_pages=4)
    handle, view = pool.take()
    view[:5] = b"hello"
    pool.give_back(handle, 1)
    again, reused = pool.take()
    assert again == handle, "the freed page is reused before a new one is touched"
    assert bytes(reused[:5]) == bytes(5), "advised away: a private page comes back as zeros"
    assert pool.stats().slabs == 1 and pool.stats().in_use == 1


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_rss_falls_as_soon_as_touched_pages_are_given_back() -> None:
    pool = PagePool()
    mib = 1 << 20
    runs = [pool.take() for _ in range(16 * mib // PAGE)]
    for _, view in runs:
        view[:] = b"\xa5" * PAGE  # touched: resident
    touched = _rss()
    pool.give_back_runs([(handle, 1) for handle, _ in runs])
    given = touched - _rss()
    assert given >= 15 * mib, f"only {given / mib:.1f} MiB of 16 went back"
    stats = pool.stats()
    assert stats.in_use == 0 and stats.given_back == 16 * mib // PAGE
    assert stats.advise_calls <= stats.slabs, "consecutive pages are advised in one call"


def test_a_run_is_contiguous_within_a_slab_and_a_longer_one_is_a_mapping_of_its_own() -> None:
    pool = PagePool(slab_pages=8)
    first, _ = pool.take(1)
    handle, run = pool.take(3)
    assert len(run) == 3 * PAGE and handle == first + 1
    pool.give_back(first, 1)
    handle2, _ = pool.take(2)
    assert handle2 == handle + 3, "a run of two does not fit the one free page before it"
    own, big = pool.take(9)
    assert own == -1 and len(big) == 9 * PAGE and pool.stats().own_mappings == 1
    big[-1] = 7
    del big
    gc.collect()
    assert pool.stats().own_mappings == 0, "unmapped once its view is gone"
    pool.give_back(own, 9)  # nothing to give back: no error


def test_giving_back_a_page_not_handed_out_is_refused() -> None:
    pool = PagePool(slab_pages=4)
    handle, _ = pool.take(2)
    pool.give_back(handle, 2)
    with pytest.raises(ValueError, match="not all handed out"):
        pool.give_back(handle, 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("take"), st.integers(1, 6)),
            st.tuples(st.just("give"), st.integers(0, 50), st.integers(1, 3)),
        ),
        max_size=80,
    )
)
def test_no_page_is_handed_out_twice(steps: list[tuple]) -> None:
    pool = PagePool(slab_pages=8)
    held: list[tuple[int, int, memoryview]] = []
    marks: dict[int, int] = {}
    in_use: set[int] = set()
    taken = 0
    for step in steps:
        if step[0] == "take":
            handle, view = pool.take(step[1])
            pages = set(range(handle, handle + step[1]))
            assert len(view) == step[1] * PAGE
            assert handle // 8 == (handle + step[1] - 1) // 8, "a run stays in one slab"
            assert not pages & in_use, "a page handed out twice"
            in_use |= pages
            taken += 1
            view[0] = marks[handle] = taken % 256
            held.append((handle, step[1], view))
        elif held:
            index, count = step[1] % len(held), min(step[2], len(held) - step[1] % len(held))
            given = held[index : index + count]
            del held[index : index + count]
            pool.give_back_runs([(h, n) for h, n, _ in given])
            for h, n, _ in given:
                in_use -= set(range(h, h + n))
        assert pool.stats().in_use == len(in_use)
        for handle, _, view in held:
            assert view[0] == marks[handle], "a page held was written by another taker"
    for handle, pages, view in held:
        assert bytes(view[1:]) == bytes(len(view) - 1), "nobody else wrote into a page held"
        pool.give_back(handle, pages)
    assert pool.stats().in_use == 0


def _fits(pool: PagePool, slab: int, pages: int) -> bool:
    """The slow scan's answer (the pool before part 15): the slab's free map holds a run."""
    return pool._free[slab].find(bytes(pages)) >= 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("take"), st.integers(1, 8)),
            st.tuples(st.just("give"), st.integers(0, 80), st.integers(1, 4)),
        ),
        max_size=120,
    )
)
def test_a_take_picks_a_slab_the_slow_scan_would_accept(steps: list[tuple]) -> None:
    """Issue 28 part 15: a take visits only the slabs whose longest free run fits. It picks a
    slab the linear scan would have accepted, opens a new slab only when no slab fits, and the
    buckets it picks from always match the free maps."""
    pool = PagePool(slab_pages=8)
    held: list[tuple[int, int]] = []
    for step in steps:
        if step[0] == "take":
            pages = step[1]
            slabs = len(pool._maps)
            accepted = {slab for slab in range(slabs) if _fits(pool, slab, pages)}
            handle, _ = pool.take(pages)
            slab = handle // 8
            if accepted:
                assert slab in accepted, f"slab {slab} picked, the scan accepted {accepted}"
                assert len(pool._maps) == slabs, "a new slab while one fitted"
            else:
                assert slab == slabs, "no slab fitted: a new one"
            held.append((handle, pages))
        elif held:
            index = step[1] % len(held)
            given = held[index : index + step[2]]
            del held[index : index + step[2]]
            pool.give_back_runs(given)
        for slab, free in enumerate(pool._free):
            longest = max(map(len, free.split(b"\x01")))
            assert pool._longest[slab] == longest
            for run, bucket in enumerate(pool._buckets):
                assert (slab in bucket) == (run == longest and run > 0)
                if slab in bucket:
                    assert bucket[pool._place[slab]] == slab
        assert pool._mask == sum(1 << run for run, b in enumerate(pool._buckets) if b)


def test_a_cache_finalized_while_its_pool_is_locked_does_not_wait_for_the_lock() -> None:
    """The cyclic collector runs a dropped cache's `__del__` inside whatever allocation crosses
    its threshold, including those `PagePool.take` makes while it holds its lock: the finalizer
    then waited on a lock its own thread held, for ever (review finding). Here the lock is held
    by the thread that drops the cache; the give back is queued and done at the next take."""
    import threading

    from danube.machines.wal.cache import HotCache

    pool = PagePool(slab_pages=32)
    cache = HotCache(1 << 20, pool=pool)
    cache.put(0, [b"x" * 100], 104)
    assert pool.stats().in_use > 0
    held = pool.stats().in_use
    done = threading.Event()

    def drop_while_locked() -> None:
        nonlocal cache
        with pool._lock:
            del cache  # the last reference: `__del__` runs here, in this thread
        done.set()

    worker = threading.Thread(target=drop_while_locked, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert done.is_set(), "the finalizer waited for a lock its own thread held"
    assert sum(pages for _, pages in pool._later) == held, "queued, not released there"
    pool.take()
    assert not pool._later and pool.stats().in_use == 1, "released at the next take"


def test_a_bad_span_queued_by_a_finalizer_does_not_fail_an_unrelated_take() -> None:
    """Review finding: the finalizers' queue is released inside the next `take`; a span that
    was not handed out is counted and skipped, the good spans beside it released."""
    pool = PagePool(slab_pages=8)
    first, _ = pool.take(2)
    second, _ = pool.take(2)
    pool.give_back_later([(first, 2), (first + 6, 2), (second, 2)])  # the middle one: bad
    handle, _ = pool.take(1)
    assert pool.bad_give_backs == 1
    assert handle == first, "the good spans were released and reused"
