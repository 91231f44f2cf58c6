"""What 1,000 topics' hot caches add to RSS against what they account (issue 28 point 1,
bench/RESULTS.md part 11): caches fed round-robin with one-record 128-byte batches (the soak's
shape) under one broker-wide ledger pool, in a fresh process; prints the ledger's total, the
RSS added, tracemalloc's live bytes (with `--trace`), the chunks' allocated capacity and the
flat arrays' bytes.

    PYTHONPATH=src:. python -m bench.cache_fragmentation --topics 1000 --pool-mib 52 \\
        --batches 600000
"""

from __future__ import annotations

import argparse
import gc
import os
import struct
import sys
import tracemalloc

from danube.machines.memory.accounting import batch_cost
from danube.machines.memory.ledger import CacheLedger
from danube.machines.wal.cache import HotCache
from danube.machines.wal.layout import FRAME_HEADER

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


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
    traced = tracemalloc.get_traced_memory()[0] if args.trace else 0
    chunks = sum(sys.getsizeof(c) for cache in caches for c in cache._chunks)
    arrays = sum(
        sys.getsizeof(a)
        for cache in caches
        for a in (cache._firsts, cache._sizes, cache._chunk_of, cache._records_at, cache._starts)
    )
    mib = 2**20
    print(
        f"topics={args.topics} pool={args.pool_mib}MiB batches={args.batches} "
        f"accounted={ledger.total / mib:.1f}MiB rss_added={added / mib:.1f}MiB "
        f"traced={traced / mib:.1f}MiB chunk_capacity={chunks / mib:.1f}MiB "
        f"arrays={arrays / mib:.1f}MiB"
    )


if __name__ == "__main__":
    main()
