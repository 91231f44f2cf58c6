"""What a cached record really costs, and what evicting it gives back (issue 28, spec/memory.md
"Accounting").

Fills WAL machines' hot caches with N records of a few payload sizes, through the three append
paths the broker uses (`list`: `WalMachine.append` of a list of `bytes`, plain sends; `packed`:
`append_packed` of one stamped frame, batched streams; `frames`: a follower's `append_frames`),
and compares the memory they add (tracemalloc: bytes the Python allocator handed out and still
holds; RSS from /proc/self/statm, which also sees allocator slack) with what the cache accounts
for them (`WalMachine.cached_bytes`). Then it empties the cache (`release_cache`, as an idle
eviction or the ledger does), collects and trims (`malloc_trim`, as the broker's memory return
does) and measures the RSS given back: at once (eviction alone, what the broker gets
without a return of memory) and after the collection and trim. With `--survivors`, a small
long-lived object is allocated after every batch (a broker's state grows in between its
cache's batches), which is what kept CPython's arenas pinned once the cache's small objects
were freed. Writes are never completed, so nothing but the cache and the pending queue hold the
records; the pending queue's frames are dropped before measuring (the machine hands them to a
`Write` in real runs). The cache's pages (issue 28 part 13) are `mmap`s, which tracemalloc does
not see: its column counts the arrays alone there.

    PYTHONPATH=src:. python -m bench.cache_memory --megabytes 24

Prints one row per case with the ratio accounted / measured (the target is 0.8 to 1.2) and the
share of the RSS added that evicting gave back.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
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


_SURVIVORS: list[bytes] = []


def _survive() -> None:
    if SURVIVORS:
        _SURVIVORS.append(os.urandom(48))


def _drop_pending(machine: WalMachine) -> None:
    """A Write would have taken the frames queued."""
    if machine._pending:
        machine._pending.clear()


def _fill_list(machine: WalMachine, payload: int, per_batch: int, records: int) -> None:
    for start in range(0, records, per_batch):
        count = min(per_batch, records - start)
        machine.append([os.urandom(payload) for _ in range(count)], NOW)
        _drop_pending(machine)
        _survive()


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
        _drop_pending(machine)
        _survive()


def _fill_frames(machine: WalMachine, payload: int, per_batch: int, records: int) -> None:
    for start in range(0, records, per_batch):
        count = min(per_batch, records - start)
        frame = format.encode_frame(
            machine.next_offset, NOW, [os.urandom(payload) for _ in range(count)]
        )
        machine.append_frames(frame, NOW)
        _drop_pending(machine)
        _survive()


FILLS: dict[str, Callable[[WalMachine, int, int, int], None]] = {
    "list": _fill_list,
    "packed": _fill_packed,
    "frames": _fill_frames,
}
SURVIVORS = False


def _trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure(path: str, payload: int, per_batch: int, records: int, *, traced: bool) -> str:
    """The memory one case's cache adds (tracemalloc's count, or RSS growth) and the RSS its
    eviction gives back, as "added returned" (run each case in a fresh process: freed memory
    of an earlier case would be reused)."""
    FILLS[path](_machine(), 64, 10, 2000)  # warm up: lazy imports, compiled kernels
    _SURVIVORS.clear()
    gc.collect()
    _trim()
    machine = _machine()
    rss_before = _rss()
    if traced:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    FILLS[path](machine, payload, per_batch, records)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base if traced else _rss() - rss_before
    tracemalloc.stop()
    rss_full = _rss()
    machine.release_cache()
    at_once = rss_full - _rss()
    gc.collect()
    _trim()
    _KEEP.append(machine)
    return f"{grown} {rss_full - _rss()} {at_once}"


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


def _in_fresh_process(case: str, traced: bool, survivors: bool) -> tuple[int, int, int]:
    command = [sys.executable, "-m", "bench.cache_memory", "--case", case]
    if traced:
        command.append("--traced")
    if survivors:
        command.append("--survivors")
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    grown, returned, at_once = done.stdout.split()
    return int(grown), int(returned), int(at_once)


def main() -> None:
    global SURVIVORS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--megabytes", type=int, default=24, help="payload bytes a case caches (MiB)"
    )
    parser.add_argument("--max-records", type=int, default=200_000)
    parser.add_argument("--paths", default=",".join(FILLS))
    parser.add_argument("--payloads", default="64,128,1024,4096,16384")
    parser.add_argument("--batches", default="1,10,100,500")
    parser.add_argument(
        "--survivors", action="store_true", help="a small long-lived object after each batch"
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    SURVIVORS = args.survivors
    if args.case:
        path, payload, per_batch, records = args.case.split(",")
        print(measure(path, int(payload), int(per_batch), int(records), traced=args.traced))
        return
    print(
        "| path | payload B | records/batch | records | accounted MiB | tracemalloc MiB "
        "| RSS MiB | accounted/traced | accounted/RSS | RSS given back at once "
        "| RSS given back after a collection and a trim |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    mib = 1024 * 1024
    for path in args.paths.split(","):
        for payload in (int(p) for p in args.payloads.split(",")):
            for per_batch in (int(b) for b in args.batches.split(",")):
                records = min(args.max_records, args.megabytes * mib // payload)
                records = max(records, per_batch)
                case = f"{path},{payload},{per_batch},{records}"
                traced, _, _ = _in_fresh_process(case, True, args.survivors)
                rss, returned, at_once = _in_fresh_process(case, False, args.survivors)
                counted = accounted(path, payload, per_batch, records)
                print(
                    f"| {path} | {payload} | {per_batch} | {records} "
                    f"| {counted / mib:.1f} | {traced / mib:.1f} | {rss / mib:.1f} "
                    f"| {counted / traced:.2f} | {counted / max(rss, 1):.2f} "
                    f"| {at_once / max(rss, 1):.0%} | {returned / max(rss, 1):.0%} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
