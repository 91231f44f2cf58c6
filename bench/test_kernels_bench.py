"""Throughput of the numba kernels (danube.kernels) against their plain-Python twins.

.venv/bin/pytest bench/test_kernels_bench.py --benchmark-only --benchmark-json=kernels.json

Each test records `GB/s` (and `frames/s` for scans) from its median in the benchmark's
extra_info (`--benchmark-json` keeps it). The twins run on the full 64 MiB inputs but only once
(6–8 s each); the twin's torn-tail search runs on 1 MiB only (0.4 s per MiB).

The entry points run the build `danube.kernels.loaded` chose (recorded as `build`): compare the
ahead-of-time module with numba's JIT by running with `DANUBE_KERNELS=aot` and `=jit`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from danube.kernels import (
    crc32c,
    crc32c_py,
    find_frame,
    find_frame_py,
    loaded,
    scan_frames,
    scan_frames_py,
)
from danube.kernels.jit_crc32c import crc32c_update_sw
from danube.machines.wal.format import encode_frame

MIB = 1 << 20
SEGMENT = 64 * MIB
RECORD = 1024


@pytest.fixture(scope="module")
def noise() -> bytes:
    return random.Random(1).randbytes(SEGMENT)


@pytest.fixture(scope="module", params=[1, 16], ids=["1-record-frames", "16-record-frames"])
def segment(request: pytest.FixtureRequest) -> tuple[bytes, int]:
    """About 64 MiB of frames of `param` 1 KiB records each, offsets from 0, and the frame count."""
    per_frame: int = request.param
    rng = random.Random(2)
    frames: list[bytes] = []
    size = offset = 0
    while size < SEGMENT:
        records = [rng.randbytes(RECORD) for _ in range(per_frame)]
        frames.append(encode_frame(offset, 1_700_000_000_000, records))
        size += len(frames[-1])
        offset += per_frame
    return b"".join(frames), len(frames)


def _record(benchmark: Any, nbytes: int, frames: int = 0) -> None:
    median = benchmark.stats.stats.median
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["GB/s"] = round(nbytes / median / 1e9, 4)
    if frames:
        benchmark.extra_info["frames"] = frames
        benchmark.extra_info["frames/s"] = round(frames / median)


def _once(benchmark: Any, function: Callable[..., Any], *args: Any) -> Any:
    return benchmark.pedantic(function, args=args, rounds=1, iterations=1)


@pytest.mark.parametrize("size", [MIB, SEGMENT], ids=["1MiB", "64MiB"])
def test_crc32c_numba(benchmark: Any, noise: bytes, size: int) -> None:
    data = noise[:size]
    benchmark.extra_info["path"] = "sse4.2" if loaded.ACTIVE.hardware() else "slicing-by-8"
    benchmark.extra_info["build"] = loaded.IMPLEMENTATION
    benchmark(crc32c, data)
    _record(benchmark, size)


@pytest.mark.parametrize("size", [MIB, SEGMENT], ids=["1MiB", "64MiB"])
def test_crc32c_c_package(benchmark: Any, noise: bytes, size: int) -> None:
    """The `crc32c` C package (ICRAR's, hardware path), side by side with our kernel."""
    import crc32c as c_package

    data = noise[:size]
    assert c_package.crc32c(data) == crc32c(data)
    benchmark(c_package.crc32c, data)
    _record(benchmark, size)


@pytest.mark.parametrize("size", [MIB, SEGMENT], ids=["1MiB", "64MiB"])
def test_crc32c_numba_slicing_by_8(benchmark: Any, noise: bytes, size: int) -> None:
    """The table path every CPU gets when SSE4.2 is missing, measured here directly."""
    view = memoryview(noise[:size])
    benchmark(crc32c_update_sw, view, 0, size, 0)
    _record(benchmark, size)


@pytest.mark.parametrize("size", [MIB, SEGMENT], ids=["1MiB", "64MiB"])
def test_crc32c_twin(benchmark: Any, noise: bytes, size: int) -> None:
    data = noise[:size]
    if size == MIB:
        benchmark.pedantic(crc32c_py, args=(data,), rounds=3, iterations=1)
    else:
        _once(benchmark, crc32c_py, data)
    _record(benchmark, size)


def test_scan_numba(benchmark: Any, segment: tuple[bytes, int]) -> None:
    data, frames = segment
    scan = benchmark(scan_frames, data, 0, len(data), 0)
    assert scan.valid_end == len(data) and len(scan.positions) == frames
    _record(benchmark, len(data), frames)


def test_scan_twin(benchmark: Any, segment: tuple[bytes, int]) -> None:
    data, frames = segment
    scan = _once(benchmark, scan_frames_py, data, 0, len(data), 0)
    assert scan.valid_end == len(data) and len(scan.positions) == frames
    _record(benchmark, len(data), frames)


def test_find_frame_numba_in_garbage(benchmark: Any, noise: bytes) -> None:
    """The torn-tail test over a 64 MiB tail of random bytes (no frame in it)."""
    assert benchmark(find_frame, noise, 0, len(noise)) == -1
    _record(benchmark, len(noise))


def test_find_frame_twin_in_garbage(benchmark: Any, noise: bytes) -> None:
    tail = noise[:MIB]
    assert _once(benchmark, find_frame_py, tail, 0, len(tail)) == -1
    _record(benchmark, len(tail))
