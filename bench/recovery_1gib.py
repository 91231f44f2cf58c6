"""WAL recovery of one large segment: how long a broker restart spends on a full-size WAL.

Builds one segment file of `--size-mib` (spec/wal-format.md, written with
`danube.machines.wal.format`)
and times `SegmentFiles.recover`, the broker's recovery path: read the file, scan and
CRC-verify every frame (numba), plan, then carry out the plan (fsync the newest segment;
truncate a torn tail). Runs:

- warm: the file in the page cache, three times (each and the median);
- cold-ish: the file's pages dropped with `posix_fadvise(POSIX_FADV_DONTNEED)` first, which
  works unprivileged for clean pages (the file is fsynced after the build, so all are clean;
  `fincore` shows how much stayed cached), so the read comes from the disk;
- torn tail: the file cut in the middle of its last frame; recovery must truncate it to the
  valid prefix and continue offsets after the last whole frame (checked, not assumed).

Records are opaque bytes of `--payload` size, not encoded `StreamMessage`s: recovery never
decodes records (it checks lengths and CRCs), so their content cannot change the timing, and
building 1 GiB of protobufs in Python would take longer than the measurement.

    .venv/bin/python -m bench.recovery_1gib [--size-mib 1024] [--payload 1024] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from danube.machines.wal import format
from danube.machines.wal.recovery import SyncSegment, TruncateSegment
from danube.runtime.segment_files import SegmentFiles

TOPIC = "/default/recovery-bench"
CHUNK_BYTES = 64 << 20
"""Frames are collected into writes of this size: few syscalls, bounded memory."""
MIB = 1 << 20


def build_segment(
    directory: Path, size_bytes: int, payload: int, per_frame: int
) -> tuple[Path, int, int, int]:
    """Writes a valid segment of about `size_bytes` (whole frames only, offsets from 0) and
    fsyncs it, so that the recovery runs flush no dirty pages of the build.

    Returns (path, frames, records, size of the last frame)."""
    path = directory / format.segment_name(0)
    created = int(time.time() * 1000)
    # A handful of distinct records, cycled: content does not matter to recovery, and
    # generating 1 GiB of randomness would dominate the build.
    pool = [os.urandom(payload) for _ in range(per_frame + 7)]
    header = format.encode_segment_header(TOPIC, 0, created)
    frame_size = len(format.encode_frame(0, created, pool[:per_frame]))
    frames_wanted = max(1, (size_bytes - len(header)) // frame_size)
    pending: list[bytes] = [header]
    pending_bytes = len(header)
    written = 0
    offset = 0
    started = time.perf_counter()
    last_report = started
    with open(path, "wb", buffering=0) as file:
        for index in range(frames_wanted):
            start = index % 7
            frame = format.encode_frame(offset, created, pool[start : start + per_frame])
            offset += per_frame
            pending.append(frame)
            pending_bytes += len(frame)
            if pending_bytes >= CHUNK_BYTES or index == frames_wanted - 1:
                file.write(b"".join(pending))
                written += pending_bytes
                pending, pending_bytes = [], 0
                now = time.perf_counter()
                if now - last_report >= 1.0 or index == frames_wanted - 1:
                    last_report = now
                    print(
                        f"build: {written / MIB:8.1f} MiB, {index + 1} frames, "
                        f"{now - started:5.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
        os.fsync(file.fileno())
    return path, frames_wanted, offset, frame_size


def drop_cache(path: Path) -> None:
    """Asks the kernel to drop the file's (clean) pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_bytes(path: Path) -> str:
    """Page-cache residency as `fincore` reports it (util-linux), or "n/a"."""
    if shutil.which("fincore") is None:
        return "n/a"
    result = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "n/a"


def time_recovery(directory: Path) -> tuple[float, object]:
    started = time.perf_counter()
    plan = trio.run(SegmentFiles(directory).recover, TOPIC)
    return time.perf_counter() - started, plan


def time_parts(path: Path) -> dict[str, float]:
    """Breakdown of one warm recovery's main costs, outside trio: `read_bytes` (what recovery
    does: a copy into a fresh buffer) and the scan of that buffer; and, for comparison, the
    same scan over a read-only mmap of the file, which needs no buffer of the file's size."""
    started = time.perf_counter()
    data = path.read_bytes()
    read_done = time.perf_counter()
    format.scan_segment(data)
    scan_done = time.perf_counter()
    del data
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        mapped = time.perf_counter()
        format.scan_segment(view)
        mmap_done = time.perf_counter()
        view.release()
    return {
        "read_bytes_s": read_done - started,
        "scan_verify_s": scan_done - read_done,
        "mmap_scan_verify_s": mmap_done - mapped,
    }


def warm_up_kernels(directory: Path, payload: int, per_frame: int) -> None:
    """Recovers a tiny segment once so that numba's first-call cost (loading or compiling the
    kernels) is not charged to the measured runs."""
    small = directory / "warmup"
    small.mkdir()
    build_segment(small, 1 * MIB, payload, per_frame)
    trio.run(SegmentFiles(small).recover, TOPIC)
    shutil.rmtree(small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--payload", type=int, default=1024, help="bytes per record")
    parser.add_argument("--per-frame", type=int, default=64, help="records per frame")
    parser.add_argument("--runs", type=int, default=3, help="warm recovery runs")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary dir")
    args = parser.parse_args()

    parent = args.dir or Path(tempfile.gettempdir())
    free = shutil.disk_usage(parent).free
    if free < 2 * args.size_mib * MIB:
        sys.exit(f"{parent} has {free / MIB:.0f} MiB free; need ~{2 * args.size_mib} MiB")

    with tempfile.TemporaryDirectory(dir=parent, prefix="danube-recovery-") as temporary:
        root = Path(temporary)
        warm_up_kernels(root, args.payload, args.per_frame)
        topic_dir = root / "topic"
        topic_dir.mkdir()
        started = time.perf_counter()
        path, frames, records, frame_size = build_segment(
            topic_dir, args.size_mib * MIB, args.payload, args.per_frame
        )
        build_s = time.perf_counter() - started
        size = path.stat().st_size

        warm: list[float] = []
        for _ in range(args.runs):
            seconds, plan = time_recovery(topic_dir)
            assert plan.next_offset == records and not plan.replaced, plan
            assert plan.actions == (SyncSegment(0),), plan.actions
            warm.append(seconds)
        parts = time_parts(path)

        drop_cache(path)
        cached_before_cold = cached_bytes(path)
        cold_s, plan = time_recovery(topic_dir)
        assert plan.next_offset == records, plan

        # Torn tail: cut the last frame in half, as a crash during its write would.
        torn_size = size - frame_size // 2
        os.truncate(path, torn_size)
        torn_s, plan = time_recovery(topic_dir)
        valid = size - frame_size
        assert plan.actions == (TruncateSegment(0, valid), SyncSegment(0)), plan.actions
        assert plan.next_offset == records - args.per_frame, plan.next_offset
        assert path.stat().st_size == valid, path.stat().st_size

    median = statistics.median(warm)
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "directory": str(parent),
        "file_bytes": size,
        "frames": frames,
        "records": records,
        "payload_bytes": args.payload,
        "records_per_frame": args.per_frame,
        "build_s": round(build_s, 3),
        "warm_recover_s": [round(s, 4) for s in warm],
        "warm_recover_median_s": round(median, 4),
        "warm_gb_per_s": round(size / median / 1e9, 3),
        "warm_breakdown_s": {k: round(v, 4) for k, v in parts.items()},
        "cold_cached_before": cached_before_cold,
        "cold_recover_s": round(cold_s, 4),
        "cold_gb_per_s": round(size / cold_s / 1e9, 3),
        "torn_file_bytes": torn_size,
        "torn_truncated_to": valid,
        "torn_next_offset": records - args.per_frame,
        "torn_recover_s": round(torn_s, 4),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
