"""The hot cache holds batches as frame regions in shared buffers, not a `bytes` per record
(issue 28): whatever the puts (as records, as frames, packed with positions, large frames
kept whole), evictions and reads, it returns exactly what a list-of-records cache would."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.memory.ledger import CacheLedger
from danube.machines.memory.pages import PAGE, PagePool
from danube.machines.wal import format
from danube.machines.wal.cache import CHUNK_BYTES, CHUNK_PAGES, HotCache, record_positions


class ListCache:
    """The model: batches of records in a list, the same bounds."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.batches: list[tuple[int, list[bytes], int]] = []

    @property
    def bytes(self) -> int:
        return sum(size for _, _, size in self.batches)

    def put(self, first: int, records: list[bytes], size: int) -> None:
        self.batches.append((first, records, size))
        while self.bytes > self.limit and self.batches:
            self.batches.pop(0)

    def drop_oldest(self) -> None:
        if self.batches:
            self.batches.pop(0)

    def evict_below(self, first_retained: int) -> None:
        while self.batches and self.batches[0][0] < first_retained:
            self.batches.pop(0)

    @property
    def oldest(self) -> int | None:
        return self.batches[0][0] if self.batches else None

    def read(self, from_offset: int, limit: int, max_bytes: int) -> tuple[bytes, ...]:
        flat = [
            (first + i, record)
            for first, records, _ in self.batches
            for i, record in enumerate(records)
        ]
        out: list[bytes] = []
        size = 0
        for offset, record in flat:
            if offset < from_offset:
                continue
            if offset >= limit or (out and size + len(record) > max_bytes):
                break
            out.append(record)
            size += len(record)
        return tuple(out)


record = st.binary(min_size=0, max_size=300) | st.binary(min_size=1000, max_size=3000)
batch = st.lists(record, min_size=1, max_size=12)
step = st.one_of(
    st.tuples(st.just("put"), batch, st.sampled_from(["records", "frame", "packed"])),
    st.tuples(st.just("evict"), st.integers(0, 3)),
    st.tuples(st.just("retain"), st.integers(0, 40)),
    st.tuples(st.just("read"), st.integers(0, 80), st.integers(1, 30), st.integers(1, 9000)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=60), st.sampled_from([2_000, 20_000, 1 << 40]))
def test_any_puts_evictions_and_reads_return_what_a_list_cache_would(
    steps: list[tuple], limit: int
) -> None:
    ledger = CacheLedger(pool=1 << 40)
    cache, model = HotCache(limit, "t", ledger), ListCache(limit)
    offset = 0
    for action, *args in steps:
        if action == "put":
            records, how = args
            size = sum(len(r) for r in records) + 8 * len(records) + 48
            frame = format.encode_frame(offset, 0, records)
            if how == "records":
                cache.put(offset, records, size)
            elif how == "frame":
                cache.put_frame(offset, frame, size, len(records))
            else:
                positions = np.array(record_positions(frame, len(records)), dtype=np.int64)
                cache.put_frame(offset, frame, size, len(records), positions)
            model.put(offset, list(records), size)
            offset += len(records)
        elif action == "evict":
            for _ in range(args[0]):
                cache.drop_oldest_for_ledger()
                model.drop_oldest()
        elif action == "retain":
            cache.evict_below(args[0])
            model.evict_below(args[0])
        else:
            start, count, max_bytes = args
            oldest = model.oldest
            if oldest is not None and start >= oldest:
                assert cache.holds(start)
                got = cache.read(start, min(offset, start + count), max_bytes)
                want = model.read(start, min(offset, start + count), max_bytes)
                assert got == want
                assert all(type(r) is bytes for r in got)
        assert cache.oldest == model.oldest
        assert cache.bytes == model.bytes == ledger.total
    cache.release()
    assert cache.bytes == 0 and cache.chunk_count == 0 and ledger.total == 0


def test_small_frames_share_a_buffer_and_an_evicted_buffer_is_let_go() -> None:
    """Many one-record batches: a few chunks of at most CHUNK_BYTES, no object per batch;
    evicting every batch in a chunk drops that chunk."""
    cache = HotCache(1 << 40)
    records = [bytes([i % 256]) * 100 for i in range(1000)]
    for offset, body in enumerate(records):
        cache.put_frame(offset, format.encode_frame(offset, 0, [body]), 156, 1)
    assert cache.chunk_count == -(-1000 * 104 // CHUNK_BYTES)
    assert cache.read(500, 1000, 1 << 30) == tuple(records[500:])
    for _ in range(CHUNK_BYTES // 104 + 1):
        cache.drop_oldest_for_ledger()
    assert cache.chunk_count == -(-1000 * 104 // CHUNK_BYTES) - 1
    assert cache.read(cache.oldest or 0, 1000, 1 << 30) == tuple(records[cache.oldest or 0 :])


def test_a_frame_larger_than_a_chunk_gets_pages_of_its_own_and_fills_their_rest() -> None:
    """Issue 28 part 13: frames of 1 KiB or more were kept as the WAL's `bytes`, in glibc's
    heap, which kept them once evicted; every frame is now copied into pages."""
    body = b"x" * CHUNK_BYTES
    frame = format.encode_frame(7, 0, [body, b"y"])
    cache = HotCache(1 << 40)
    cache.put_frame(7, frame, len(frame), 2)
    assert type(cache._chunks[0]) is memoryview and len(cache._chunks[0]) == CHUNK_BYTES + PAGE
    assert cache.read(7, 9, 1) == (body,)  # at least one record, then what fits
    assert cache.read(8, 9, 1) == (b"y",)
    cache.put(9, [b"z" * 100], 200)
    assert cache.chunk_count == 1, "a small frame after it fills the rest of its pages"
    assert cache.read(9, 10, 1 << 20) == (b"z" * 100,)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2), st.sampled_from(["put", "retain", "release"]), st.integers(1, 3)
        ),
        max_size=80,
    ),
    st.integers(0, 1500),
)
def test_the_ledger_evicts_the_brokers_oldest_batches(
    steps: list[tuple[int, str, int]], pool: int
) -> None:
    """An entry of the ledger's order is the cache alone (no tuple, no offset per batch): it
    still evicts exactly the broker's oldest batches, skipping those a cache dropped itself
    (compacting its order on the way)."""
    ledger = CacheLedger(pool)
    caches = [HotCache(1 << 40, f"t{i}", ledger) for i in range(3)]
    held: list[tuple[int, int, int]] = []  # (cache, first offset, size), oldest first
    offsets = [0, 0, 0]
    for index, action, count in steps:
        cache = caches[index]
        if action == "put":
            for _ in range(count * 10):
                cache.put(offsets[index], [b"r" * 40], 100)
                held.append((index, offsets[index], 100))
                offsets[index] += 1
                while sum(size for _, _, size in held) > pool:
                    held.pop(0)
        elif action == "retain":
            cache.evict_below(offsets[index] - count)
            held = [h for h in held if h[0] != index or h[1] >= offsets[index] - count]
        else:
            cache.release()
            held = [h for h in held if h[0] != index]
        for i, each in enumerate(caches):
            mine = [first for c, first, _ in held if c == i]
            assert each.oldest == (mine[0] if mine else None)
        assert ledger.total == sum(size for _, _, size in held)


def test_an_empty_cache_shares_its_arrays_and_gets_its_own_at_its_first_batch() -> None:
    idle, other = HotCache(1 << 20, "a"), HotCache(1 << 20, "b")
    assert idle._firsts is other._firsts  # an idle topic carries no arrays of its own
    idle.put(0, [b"x", b"yy"], 64)
    assert idle._firsts is not other._firsts and other.oldest is None
    idle.release()  # everything evicted: back to the shared ones, which stay empty
    assert idle._firsts is other._firsts and len(other._firsts) == 0
    idle.put(2, [b"z"], 32)
    assert idle.read(2, 3, 1 << 20) == (b"z",) and not other.holds(0)


def test_a_shared_chunk_is_allocated_whole_and_never_reallocated_as_it_fills() -> None:
    """Issue 28 point 1: chunks grown by `+=` were reallocated at every size up to 16 KiB,
    which across 1,000 topics left glibc's heap fragmented (RSS 1.7 times the accounted
    bytes); a chunk is now one allocation of `CHUNK_BYTES`, filled in place."""
    import sys

    cache = HotCache(1 << 20, "t")
    cache.put(0, [b"A" * 100], 200)
    chunk = cache._chunks[0]
    assert len(chunk) == CHUNK_BYTES
    allocated = sys.getsizeof(chunk)
    for offset in range(1, 20):
        cache.put(offset, [bytes([65 + offset]) * 100], 200)
    assert cache._chunks[0] is chunk and sys.getsizeof(chunk) == allocated
    assert cache.read(0, 20, 1 << 20) == tuple(bytes([65 + i]) * 100 for i in range(20))
    per_chunk = CHUNK_BYTES // 104
    for offset in range(20, per_chunk + 1):
        cache.put(offset, [b"z" * 100], 200)
    assert cache.chunk_count == 2, "the next frame did not fit: a new chunk"
    assert cache.read(per_chunk, per_chunk + 1, 1 << 20) == (b"z" * 100,)


def test_evicted_batches_give_their_pages_back_at_once() -> None:
    """Issue 28 part 13: a chunk is a run of pages of the page pool; as the oldest batches
    are evicted (by the ledger, the topic's own bound, retention or a release) the pages
    wholly before the oldest batch held go back to the pool, which hands the memory to the
    kernel, and the rest of a chunk when its last batch goes; the pool reuses them."""
    pool = PagePool(slab_pages=64)
    ledger = CacheLedger(pool=1 << 40)
    cache = HotCache(1 << 40, "t", ledger, pool)
    per_chunk = CHUNK_BYTES // 104
    per_page = PAGE // 104
    for offset in range(3 * per_chunk):
        cache.put(offset, [bytes([offset % 256]) * 100], 200)
    assert cache.chunk_count == 3 and pool.stats().in_use == 3 * CHUNK_PAGES
    for _ in range(per_page):
        cache.drop_oldest_for_ledger()
    assert pool.stats().in_use == 3 * CHUNK_PAGES, "page 0 still holds the oldest batch's start"
    cache.drop_oldest_for_ledger()
    assert pool.stats().in_use == 3 * CHUNK_PAGES - 1 and pool.stats().given_back == 1
    for _ in range(per_chunk - per_page - 1):
        cache.drop_oldest_for_ledger()
    assert cache.chunk_count == 2 and pool.stats().in_use == 2 * CHUNK_PAGES
    cache.evict_below(2 * per_chunk + 2 * per_page + 2)
    assert pool.stats().in_use == CHUNK_PAGES - 2
    assert cache.read(2 * per_chunk + 2 * per_page + 2, 3 * per_chunk, 1 << 20) == tuple(
        bytes([o % 256]) * 100 for o in range(2 * per_chunk + 2 * per_page + 2, 3 * per_chunk)
    )
    cache.release()
    assert pool.stats().in_use == 0 and ledger.total == 0
    assert pool.stats().given_back == 3 * CHUNK_PAGES
    cache.put(0, [b"again"], 64)
    assert pool.stats().slabs == 1 and cache.read(0, 1, 100) == (b"again",)


def test_a_cache_thrown_away_without_release_still_gives_its_pages_back() -> None:
    """A WAL machine dropped without `release_cache` (a simulated broker discarded): its
    cache's pages would stay taken in the process-wide pool for ever."""
    import gc

    pool = PagePool(slab_pages=16)
    cache = HotCache(1 << 40, "t", None, pool)
    for offset in range(100):
        cache.put(offset, [b"x" * 100], 200)
    assert pool.stats().in_use > 0
    del cache
    gc.collect()
    assert pool.stats().in_use == 0


def test_what_a_read_returns_does_not_change_when_its_page_is_reused() -> None:
    pool = PagePool(slab_pages=4)
    cache = HotCache(1 << 40, "t", None, pool)
    cache.put(0, [b"kept"], 64)
    got = cache.read(0, 1, 100)
    cache.release()
    other = HotCache(1 << 40, "u", None, pool)
    other.put(0, [b"over"], 64)
    assert got == (b"kept",) and other.read(0, 1, 100) == (b"over",)


def test_a_deep_copy_reads_the_same_and_never_gives_back_the_originals_pages() -> None:
    """The WAL machine's property tests deep-copy its state; a copy holding the original's
    pages would give them back when collected, under the original's batches."""
    import copy
    import gc

    pool = PagePool(slab_pages=64)
    cache = HotCache(1 << 40, "t", None, pool)
    for offset in range(50):
        cache.put(offset, [bytes([offset]) * 100], 200)
    held = pool.stats().in_use
    clone = copy.deepcopy(cache)
    assert clone.read(0, 50, 1 << 20) == cache.read(0, 50, 1 << 20)
    clone.put(50, [b"new"], 64)
    assert clone.read(50, 51, 100) == (b"new",)
    assert len(cache.read(0, 51, 1 << 20)) == 50, "the original did not get it"
    del clone
    gc.collect()
    assert pool.stats().in_use == held
    assert cache.read(0, 50, 1 << 20) == tuple(bytes([o]) * 100 for o in range(50))


def test_a_frame_longer_than_a_slab_is_a_mapping_of_its_own_unmapped_with_its_chunk() -> None:
    import gc

    pool = PagePool(slab_pages=CHUNK_PAGES)
    cache = HotCache(1 << 40, "t", None, pool)
    body = b"L" * (CHUNK_BYTES + 10)
    cache.put(0, [body], len(body) + 56)
    cache.put(1, [b"tail"], 64)
    assert pool.stats().own_mappings == 1 and pool.stats().in_use == 0
    assert cache.read(0, 2, 1 << 30) == (body, b"tail")
    cache.release()
    gc.collect()
    assert pool.stats().own_mappings == 0 and cache.chunk_count == 0


def test_a_finalized_cache_is_empty_for_the_rest_of_its_garbage_cycle() -> None:
    """The collector runs every finalizer of a garbage cycle before it clears any object, so
    the cycle's other objects (a simulated broker's ledger, a publish generator closing) may
    still call a cache whose `__del__` gave its pages back. It must then behave as an empty
    cache, not index chunks it no longer has (IndexError in `_give_back_front`, found by the
    cluster data simulator's tests)."""
    from danube.machines.memory.ledger import CacheLedger
    from danube.machines.memory.pages import PagePool

    pool = PagePool(slab_pages=64)
    ledger = CacheLedger(1 << 20)
    cache = HotCache(1 << 20, "t", ledger=ledger, pool=pool)
    for offset in range(40):
        cache.put(offset, [bytes([offset]) * 900], 904)
    cache.__del__()  # what the collector does first
    cache.drop_oldest_for_ledger()
    ledger.squeeze = ledger.pool  # a limit of 0: fit evicts whatever it counts
    ledger.fit()
    assert cache.oldest is None and not cache.holds(0)
    cache.release()
    assert pool.stats().in_use == 0
