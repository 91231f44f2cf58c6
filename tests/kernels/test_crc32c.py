"""The numba CRC32C kernels against the plain-Python twin `crc32c_py` (the oracle).

Both compiled paths are checked directly (SSE4.2 only where the CPU has it), so is the
ahead-of-time module's kernel (when built), and the public `crc32c` wrapper on every buffer type
it accepts, over both builds (`conftest.kernel_build`)."""

from __future__ import annotations

import array
import mmap
import os
import random
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.kernels import crc32c, crc32c_py
from danube.kernels.jit_crc32c import (
    HARDWARE,
    LONG,
    SHORT,
    TINY,
    crc32c_update,
    crc32c_update_hw,
    crc32c_update_sw,
)
from danube.machines.wal.format import encode_frame
from tests.kernels.conftest import AOT, AOT_MISSING

pytestmark = pytest.mark.usefixtures("kernel_build")

Kernel = Callable[[memoryview, int, int, int], int]
"""The kernels are called with read-only memoryviews, the one type `crc32c` and the frame scan
compile them for (any other type would compile them again just for the tests)."""
KERNELS = [
    pytest.param(crc32c_update_sw, id="slicing-by-8"),
    pytest.param(
        crc32c_update_hw,
        id="sse4.2",
        marks=pytest.mark.skipif(not HARDWARE, reason="CPU without SSE4.2"),
    ),
    pytest.param(
        AOT.crc_view if AOT is not None else None,
        id="ahead-of-time",
        marks=pytest.mark.skipif(AOT is None, reason=AOT_MISSING),
    ),
]
CRCS = st.integers(0, 0xFFFFFFFF)
CHECK = 0xE3069283


def test_check_value() -> None:
    assert crc32c_py(b"123456789") == CHECK
    assert crc32c(b"123456789") == CHECK
    data = memoryview(b"123456789")
    assert crc32c_update_sw(data, 0, 9, 0) == CHECK
    if HARDWARE:
        assert crc32c_update_hw(data, 0, 9, 0) == CHECK


def test_the_exported_kernel_is_the_one_for_this_cpu() -> None:
    assert crc32c_update is (crc32c_update_hw if HARDWARE else crc32c_update_sw)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_alignment_and_length_up_to_100(kernel: Kernel) -> None:
    data = random.Random(3).randbytes(128)
    view = memoryview(data)
    for start in range(16):
        for length in range(101):
            for crc in (0, 0x9A3B5C7D):
                expected = crc32c_py(data[start : start + length], crc)
                assert kernel(view, start, start + length, crc) == expected, (start, length)


@pytest.mark.parametrize("kernel", KERNELS)
def test_lengths_around_each_block_size(kernel: Kernel) -> None:
    """The SSE4.2 path switches between 3-way blocks of LONG, SHORT, TINY bytes and one chain;
    every boundary and its neighbours, from an odd start."""
    sizes = sorted(
        {
            max(0, k * 3 * block + delta)
            for block in (LONG, SHORT, TINY)
            for k in (1, 2)
            for delta in range(-9, 10)
        }
        | {3 * LONG + 3 * SHORT + 3 * TINY + 8 + 7}
    )
    data = random.Random(5).randbytes(max(sizes) + 3)
    view = memoryview(data)
    for size in sizes:
        assert kernel(view, 3, 3 + size, 7) == crc32c_py(data[3 : 3 + size], 7), size


@pytest.fixture(scope="module")
def megabytes() -> tuple[bytes, int]:
    """3 MiB + 5 bytes and their CRC from 0x12345678, by the twin (0.3 s: computed once)."""
    data = random.Random(7).randbytes(3 * 1024 * 1024 + 5)
    return data, crc32c_py(data, 0x12345678)


@pytest.mark.parametrize("kernel", KERNELS)
def test_megabytes(kernel: Kernel, megabytes: tuple[bytes, int]) -> None:
    data, expected = megabytes
    assert kernel(memoryview(data), 0, len(data), 0x12345678) == expected
    assert crc32c(data, 0x12345678) == expected


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), crc=CRCS)
def test_bytes_bytearray_memoryview_equal_the_twin(data: bytes, crc: int) -> None:
    expected = crc32c_py(data, crc)
    assert crc32c(data, crc) == expected
    assert crc32c(bytearray(data), crc) == expected
    assert crc32c(memoryview(data), crc) == expected
    assert crc32c(memoryview(bytearray(data)), crc) == expected


@settings(max_examples=100, deadline=None)
@given(data=st.binary(min_size=1, max_size=70_000), crc=CRCS, cut=st.floats(0, 1))
def test_continuation_chains_pieces(data: bytes, crc: int, cut: float) -> None:
    at = int(cut * len(data))
    whole = crc32c(data, crc)
    assert whole == crc32c_py(data, crc)
    assert crc32c(data[at:], crc32c(data[:at], crc)) == whole


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=600), bounds=st.tuples(st.integers(0, 600), st.integers(0, 600)))
def test_memoryview_slices(data: bytes, bounds: tuple[int, int]) -> None:
    lo, hi = sorted(bounds)
    view = memoryview(data)[lo:hi]
    assert crc32c(view) == crc32c_py(data[lo:hi])
    strided = memoryview(data)[lo:hi:3]  # not contiguous: copied, still correct
    assert crc32c(strided) == crc32c_py(data[lo:hi:3])


def test_other_buffers_are_read_byte_for_byte(tmp_path: os.PathLike[str]) -> None:
    words = array.array("I", range(1000))
    raw = words.tobytes()
    assert crc32c(memoryview(words)) == crc32c_py(raw)
    assert crc32c(words) == crc32c_py(raw)  # type: ignore[arg-type]
    assert crc32c(np.arange(1000, dtype=np.uint32)) == crc32c_py(raw)  # type: ignore[arg-type]
    grid = memoryview(bytearray(raw)).cast("B", (40, 100))
    assert crc32c(grid) == crc32c_py(raw)
    with mmap.mmap(-1, len(raw)) as mapped:
        mapped.write(raw)
        assert crc32c(mapped) == crc32c_py(raw)  # type: ignore[arg-type]
        assert crc32c(memoryview(mapped)[8:]) == crc32c_py(raw[8:])


def test_continuation_values_are_taken_mod_2_32() -> None:
    assert crc32c(b"abc", 0x1_0000_0005) == crc32c(b"abc", 5)


def test_without_sse42_the_tables_are_used() -> None:
    """A numba target without SSE4.2 (here the portable `generic` CPU) selects slicing-by-8 for
    every kernel, including the frame scan that inlines it. Its cache entries are keyed by that
    CPU, so they coexist with the host's. The segment comes from this process, so the child
    compiles only what the check needs (the CRC and the scan, for memoryviews)."""
    segment = encode_frame(3, 0, [b"a" * 40]) + encode_frame(4, 0, [b"b", b"c"])
    script = (
        "import sys\n"
        "from danube.kernels.jit_crc32c import HARDWARE, crc32c_update, crc32c_update_sw\n"
        "from danube.kernels import crc32c, scan_frames\n"
        "assert not HARDWARE and crc32c_update is crc32c_update_sw\n"
        "assert crc32c(memoryview(b'123456789')) == 0xE3069283\n"
        "segment = sys.stdin.buffer.read()\n"
        "scan = scan_frames(segment, 0, len(segment), 3)\n"
        "assert scan.valid_end == len(segment) and scan.next_offset == 6, scan\n"
    )
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "DANUBE_KERNELS": "jit"}
    env.pop("NUMBA_CPU_FEATURES", None)
    subprocess.run([sys.executable, "-c", script], input=segment, env=env, check=True, timeout=120)
