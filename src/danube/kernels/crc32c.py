"""CRC32C (Castagnoli) over byte buffers: the entry point `crc32c` and `byte_view`, the one
argument type the kernels take. The kernel itself is `jit_crc32c.crc32c_update`, run from the
build `danube.kernels.loaded` chose (ahead of time, or numba's JIT); twin: `twins.crc32c_py`.
This module imports no numba."""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube.kernels import loaded

if TYPE_CHECKING:
    import mmap  # a type of `byte_view`'s argument: the kernels map no file themselves

    import numpy as np

_MASK32 = 0xFFFFFFFF


def byte_view(data: bytes | bytearray | memoryview | np.ndarray | mmap.mmap) -> memoryview:
    """A read-only, 1-d, C-contiguous memoryview of unsigned bytes over any buffer, which is the
    one argument type the kernels are compiled for (each distinct numba type costs a compile of
    ~1 s per kernel, once per machine). No copy, except of a non-contiguous buffer."""
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B" or not view.c_contiguous:
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    return view if view.readonly else view.toreadonly()


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of `data`, continuing from a previous result `crc` (0 to start).

    A call costs ~0.45 µs for bytes (passed to the kernel as they are) and ~0.9 µs for any other
    buffer (made a `byte_view` first); the twin costs ~0.1 µs per byte, so it is only faster
    below 4–8 bytes, by under 0.5 µs, and there is no separate path for small inputs (measured
    on the machine of bench/RESULTS.md, kernels section).
    """
    if type(data) is bytes:
        return loaded.ACTIVE.crc_bytes(data, 0, len(data), crc & _MASK32)
    data = byte_view(data)
    return int(loaded.ACTIVE.crc_view(data, 0, len(data), crc & _MASK32))
