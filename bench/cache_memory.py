"""What a cached record really costs (issue 28, spec/memory.md "Accounting").

Fills WAL machines' hot caches with N records of a few payload sizes, through both append
paths the broker uses (`append`: a list of `bytes`, one Python object per record;
`append_packed`: one stamped frame and a positions array per batch), and compares the memory
they add (tracemalloc: bytes the Python allocator handed out and still holds; RSS from
/proc/self/statm, which also sees allocator slack) with what the cache accounts for them
(`WalMachine.cached_bytes`). Writes are never completed, so nothing but the cache and the
pending queue hold the records; the pending queue's frames are dropped before measuring (the
machine hands them to a `Write` in real runs).

    PYTHONPATH=src:. python -m bench.cache_memory --records 200000

Prints one row per case with the ratio accounted / measured (the target is 0.8 to 1.2) and,
with --fit, the least-squares per-record and per-batch overheads of the payload-only count.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tracemalloc
from collections import deque
from collections.abc import Callable

from danube.machines.wal import format, records
from danube.machines.wal.batches import check_batch, stamp
from danube.machines.wal.machine import WalConfig, WalMachine

_PAGE = os.sysconf("SC_PAGE_SIZE")
NOW = 1_700_000_000_000


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _fill_list(machine: WalMachine, payload: int, per_batch: int, records: int) -> None:
    for start in range(0, records, per_batch):
        count = min(per_batch, records - start)
        machine.append([os.urandom(payload) for _ in range(count)], NOW)
        machine._pending.clear()  # a Write would have taken them


def _client_frame(payloads: list[bytes]) -> bytes:
    """A producer's `PublishBatch` frame, as the client encodes it."""
    stored = [records.encode(records.Record(payload=p, has_msg_id=False)) for p in payloads]
    return format.encode_frame(0, 0, stored)


def _fill_packed(machine: WalMachine, payload: int, per_batch: int, records: int) -> None:
    for start in range(0, records, per_batch):
        count = min(per_batch, records - start)
        batch = check_batch(_client_frame([os.urandom(payload) for _ in range(count)]))
        packed = stamp(batch, machine.next_offset, NOW, 1, "/default/t", "127.0.0.1:6650")
        machine.append_packed(packed, NOW)
        machine._pending.clear()


FILLS: dict[str, Callable[[WalMachine, int, int, int], None]] = {
    "list": _fill_list,
    "packed": _fill_packed,
}


def measure(path: str, payload: int, per_batch: int, records: int, *, traced: bool) -> int:
    """The memory one case's cache adds: tracemalloc's count, or RSS growth (run each RSS case
    in a fresh process: freed memory of an earlier case would be reused)."""
    FILLS[path](_machine(), 64, 10, 2000)  # warm up: lazy imports, compiled kernels
    gc.collect()
    machine = _machine()
    rss_before = _rss()
    if traced:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    FILLS[path](machine, payload, per_batch, records)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base if traced else _rss() - rss_before
    tracemalloc.stop()
    _KEEP.append(machine)
    return grown


_KEEP: list[WalMachine] = []


def _machine() -> WalMachine:
    config = WalConfig(cache_bytes=1 << 40, max_write_bytes=1 << 30, segment_bytes=1 << 40)
    machine = WalMachine("/default/t", config)
    machine._pending = deque()
    return machine


def accounted(path: str, payload: int, per_batch: int, records: int) -> int:
    machine = _machine()
    FILLS[path](machine, payload, per_batch, records)
    return machine.cached_bytes


def _in_fresh_process(case: str, traced: bool) -> int:
    command = [sys.executable, "-m", "bench.cache_memory", "--case", case]
    if traced:
        command.append("--traced")
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return int(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--payloads", default="16,128,1024,4096")
    parser.add_argument("--batches", default="1,10,100")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        path, payload, per_batch, records = args.case.split(",")
        print(measure(path, int(payload), int(per_batch), int(records), traced=args.traced))
        return
    print(
        "| path | payload B | records/batch | records | accounted MiB | tracemalloc MiB "
        "| RSS MiB | accounted/traced | accounted/RSS |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    mib = 1024 * 1024
    for path in FILLS:
        for payload in (int(p) for p in args.payloads.split(",")):
            for per_batch in (int(b) for b in args.batches.split(",")):
                records = min(args.records, max(1000, (args.records * 128) // payload))
                case = f"{path},{payload},{per_batch},{records}"
                traced = _in_fresh_process(case, traced=True)
                rss = _in_fresh_process(case, traced=False)
                counted = accounted(path, payload, per_batch, records)
                print(
                    f"| {path} | {payload} | {per_batch} | {records} "
                    f"| {counted / mib:.1f} | {traced / mib:.1f} | {rss / mib:.1f} "
                    f"| {counted / traced:.2f} | {counted / max(rss, 1):.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
