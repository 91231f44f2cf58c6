"""What 1,000 topics' hot caches add to RSS against what they account (issue 28 point 1,
bench/RESULTS.md part 11): caches fed round-robin with one-record 128-byte batches (the soak's
shape) under one broker-wide ledger pool, in a fresh process; prints the ledger's total, the
RSS added, tracemalloc's live bytes (with `--trace`), the chunks' allocated capacity (the
`bytearray`s' allocation: 0 with pages), the bytes of the pages they hold (`pages_held`,
address space: only what was written is resident) and the flat arrays' bytes; then every cache is
released (as the idle eviction does) and it prints the RSS that eviction gave back by itself
(`evicted_back`, no collection nor trim: what the broker gets at once) and after a collection
and glibc's `malloc_trim(0)` (`trimmed_back`, what a return of memory adds, and what it cost).

    PYTHONPATH=src:. python -m bench.cache_fragmentation --topics 1000 --pool-mib 52 \\
        --batches 600000
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import struct
import sys
import time
import tracemalloc

from danube.machines.memory.accounting import batch_cost
from danube.machines.memory.ledger import CacheLedger
from danube.machines.wal.cache import HotCache
from danube.machines.wal.layout import FRAME_HEADER

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _pages_in_use() -> int:
    """Bytes of pages the caches hold (a run of pages is address space: only what was
    written of it is resident); 0 where the caches have no page pool (main before it)."""
    try:
        from danube.machines.memory.pages import PAGE, PAGES
    except ImportError:
        return 0
    return PAGES.stats().in_use * PAGE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1_000)
    parser.add_argument("--pool-mib", type=int, default=52)
    parser.add_argument("--batches", type=int, default=600_000)
    parser.add_argument("--payload-bytes", type=int, default=128)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    ledger = CacheLedger(args.pool_mib << 20)
    caches = [HotCache(64 << 20, f"/default/t{i}", ledger) for i in range(args.topics)]
    payload = b"x" * args.payload_bytes
    frame = bytes(FRAME_HEADER) + struct.pack("<I", len(payload)) + payload
    size = batch_cost(len(payload), 1)
    gc.collect()
    if args.trace:
        tracemalloc.start()
    before = _rss()
    offsets = [0] * args.topics
    for k in range(args.batches):
        i = k % args.topics
        caches[i].put_frame(offsets[i], frame, size, 1, [FRAME_HEADER])
        offsets[i] += 1
    gc.collect()
    added = _rss() - before
    accounted = ledger.total
    traced = tracemalloc.get_traced_memory()[0] if args.trace else 0
    chunks = sum(
        0 if isinstance(c, memoryview) else sys.getsizeof(c)
        for cache in caches
        for c in cache._chunks
    )
    pages = _pages_in_use()
    arrays = sum(
        sys.getsizeof(a)
        for cache in caches
        for a in (cache._firsts, cache._sizes, cache._chunk_of, cache._records_at, cache._starts)
    )
    if args.trace:
        tracemalloc.stop()
    full = _rss()
    for cache in caches:
        cache.release()
    evicted = _rss()
    started = time.perf_counter()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    trim_ms = (time.perf_counter() - started) * 1000
    trimmed = _rss()
    mib = 2**20
    print(
        f"topics={args.topics} pool={args.pool_mib}MiB batches={args.batches} "
        f"accounted={accounted / mib:.1f}MiB rss_added={added / mib:.1f}MiB "
        f"traced={traced / mib:.1f}MiB chunk_capacity={chunks / mib:.1f}MiB "
        f"arrays={arrays / mib:.1f}MiB pages_held={pages / mib:.1f}MiB "
        f"evicted_back={(full - evicted) / mib:.1f}MiB "
        f"trimmed_back={(full - trimmed) / mib:.1f}MiB gc_trim_ms={trim_ms:.0f}"
    )


if __name__ == "__main__":
    main()
