"""CRC32C (Castagnoli) over byte buffers: the numba source of the kernels; twin: `twins.crc32c_py`.
The Python entry point, `crc32c.crc32c`, calls the build `danube.kernels.loaded` chose (the
ahead-of-time module compiled from this file, or numba's JIT of it).

Why numba: every appended frame and every byte of a segment read at recovery goes through
CRC32C, and the plain-Python twin runs at a few MB/s. Two compiled paths, chosen once at import:

- **SSE4.2** (`HARDWARE is True`): the x86 `crc32` instruction through an LLVM intrinsic. Its
  latency (3 cycles) and not its throughput (1 per cycle) limits one dependent chain, so long
  inputs run three independent chains over three adjacent blocks and join them with the linear
  "append n zero bytes" operator (Mark Adler's scheme for `crc32c.c`).
- **Slicing-by-8** tables otherwise (non-x86, or a numba target without SSE4.2).

`crc32c_update(buf, start, stop, crc)` is the kernel (the frame scan calls it inside its loop);
it returns what `crc32c_py(data[start:stop], crc)` returns: `crc` is a previous result (0 to
start), so CRCs of pieces chain. The kernels assume a little-endian host (all numba targets are).
"""

from __future__ import annotations

import platform
import sys
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.codegen import get_host_cpu_features
from numba.extending import intrinsic

from danube.kernels.twins import CRC32C_POLY

if sys.byteorder != "little":  # pragma: no cover - no big-endian numba target ships
    raise ImportError("danube.kernels assumes a little-endian host")


def _has_sse42() -> bool:
    """Whether numba compiles for a CPU with SSE4.2: the feature string numba's code generator
    uses (NUMBA_CPU_FEATURES if set, "" for NUMBA_CPU_NAME=generic, else the host's), so
    a portable `generic` cache never contains the instruction."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features = numba.config.CPU_FEATURES
    if features is None:
        features = get_host_cpu_features()
    return "+sse4.2" in features.split(",")


HARDWARE = _has_sse42()
"""True when `crc32c_update` uses the SSE4.2 instruction, False for slicing-by-8."""


# ---- tables (built at import with numpy; numba freezes them into the compiled code) -----------


def _slicing_tables() -> np.ndarray:
    """8 × 256 tables, flattened: entry k·256 + b is the CRC register after byte b then k zeros."""
    tables = np.zeros((8, 256), dtype=np.uint32)
    crc = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        crc = np.where(crc & 1, (crc >> 1) ^ np.uint32(CRC32C_POLY), crc >> 1).astype(np.uint32)
    tables[0] = crc
    for k in range(1, 8):
        prev = tables[k - 1]
        tables[k] = (prev >> 8) ^ tables[0][prev & 0xFF]
    return tables.reshape(-1)


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, column) for column in matrix]


def _zeros_table(nbytes: int) -> np.ndarray:
    """4 × 256 tables, flattened, applying `nbytes` zero bytes (a power of two) to a CRC register:
    shift(crc) = t[crc & 0xff] ^ t[256 + (crc >> 8 & 0xff)] ^ ... (the operator is linear)."""
    op = [CRC32C_POLY] + [1 << n for n in range(31)]  # one zero bit
    bits = 1
    while bits < 8 * nbytes:
        op = _gf2_square(op)
        bits *= 2
    columns = np.array(op, dtype=np.uint32)
    table = np.zeros((4, 256), dtype=np.uint32)
    values = np.arange(256, dtype=np.uint32)
    for k in range(4):
        for bit in range(8):
            table[k] ^= np.where(values >> bit & 1, columns[8 * k + bit], 0).astype(np.uint32)
    return table.reshape(-1)


_SLICE8 = _slicing_tables()
LONG = 8192
SHORT = 256
TINY = 64
_ZEROS_LONG = _zeros_table(LONG)
_ZEROS_SHORT = _zeros_table(SHORT)
_ZEROS_TINY = _zeros_table(TINY)


# ---- intrinsics ---------------------------------------------------------------------------------


Buffer = bytes | memoryview | np.ndarray
"""What the kernels take: a 1-d, C-contiguous buffer of uint8 (in practice a `byte_view`)."""


def _bytes_1d(buf: Any) -> bool:
    return isinstance(buf, types.Buffer) and buf.dtype == types.uint8 and buf.ndim == 1


def _load(bits: int) -> Any:
    """Codegen of an unaligned little-endian load of `bits` at a byte index, zero-extended to
    64 bits; no bounds check (callers check lengths first, as the twins do)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        pointer = builder.bitcast(builder.gep(array.data, [args[1]]), ir.IntType(bits).as_pointer())
        value = builder.load(pointer, align=1)
        return value if bits == 64 else builder.zext(value, ir.IntType(64))

    return codegen


@intrinsic
def _load_u64(typingctx: Any, buf: Any, index: Any) -> Any:
    """The u64 at byte `index`, as an int64: the bits are what matter, and int64 keeps numba's
    integer typing simple (uint64 mixed with int64 becomes float64)."""
    return (types.int64(buf, types.intp), _load(64)) if _bytes_1d(buf) else None


@intrinsic
def _load_u32(typingctx: Any, buf: Any, index: Any) -> Any:
    """The u32 at byte `index`, as an int64."""
    return (types.int64(buf, types.intp), _load(32)) if _bytes_1d(buf) else None


@intrinsic
def _load_u16(typingctx: Any, buf: Any, index: Any) -> Any:
    """The u16 at byte `index`, as an int64."""
    return (types.int64(buf, types.intp), _load(16)) if _bytes_1d(buf) else None


@intrinsic
def _sse42_u64(typingctx: Any, crc: Any, word: Any) -> Any:
    """One `crc32 r64, r64`: the CRC register `crc` (no pre/post inversion) after 8 bytes."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64, i64]), "llvm.x86.sse42.crc32.64.64"
        )
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _sse42_u8(typingctx: Any, crc: Any, byte: Any) -> Any:
    """One `crc32 r32, r8`: the CRC register `crc` after one byte."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i32, i8 = ir.IntType(32), ir.IntType(8)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, [i32, i8]), "llvm.x86.sse42.crc32.32.8"
        )
        result = builder.call(fn, [builder.trunc(args[0], i32), builder.trunc(args[1], i8)])
        return builder.zext(result, ir.IntType(64))

    return sig, codegen


# ---- kernels ------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _shift(table: np.ndarray, crc: int) -> int:
    return np.int64(
        table[crc & 0xFF]
        ^ table[256 + (crc >> 8 & 0xFF)]
        ^ table[512 + (crc >> 16 & 0xFF)]
        ^ table[768 + (crc >> 24)]
    )


@njit(cache=True, nogil=True, inline="always")
def _three_way(buf: Buffer, i: int, c0: int, block: int, zeros: np.ndarray) -> int:
    """The CRC register after 3 × `block` bytes at `i`: three independent instruction chains,
    one per block, joined by shifting each earlier result over `block` zero bytes."""
    c1 = 0
    c2 = 0
    block_end = i + block
    while i < block_end:
        c0 = _sse42_u64(c0, _load_u64(buf, i))
        c1 = _sse42_u64(c1, _load_u64(buf, i + block))
        c2 = _sse42_u64(c2, _load_u64(buf, i + 2 * block))
        i += 8
    c0 = _shift(zeros, c0) ^ c1
    return _shift(zeros, c0) ^ c2


@njit(cache=True, nogil=True)
def crc32c_update_hw(buf: Buffer, start: int, stop: int, crc: int) -> int:
    """`crc32c_py(buf[start:stop], crc)` with the SSE4.2 instruction. Only call if HARDWARE.

    One chain runs at ~8 GB/s here; three chains at ~28 GB/s (in cache). Blocks of 8 KiB, 256 and
    64 bytes keep a single chain to the last < 192 bytes, which matters for ~1 KiB frames."""
    c = crc ^ 0xFFFFFFFF
    i = start
    while stop - i >= 3 * LONG:
        c = _three_way(buf, i, c, LONG, _ZEROS_LONG)
        i += 3 * LONG
    while stop - i >= 3 * SHORT:
        c = _three_way(buf, i, c, SHORT, _ZEROS_SHORT)
        i += 3 * SHORT
    while stop - i >= 3 * TINY:
        c = _three_way(buf, i, c, TINY, _ZEROS_TINY)
        i += 3 * TINY
    while stop - i >= 8:
        c = _sse42_u64(c, _load_u64(buf, i))
        i += 8
    while i < stop:
        c = _sse42_u8(c, buf[i])
        i += 1
    return c ^ 0xFFFFFFFF


@njit(cache=True, nogil=True)
def crc32c_update_sw(buf: Buffer, start: int, stop: int, crc: int) -> int:
    """`crc32c_py(buf[start:stop], crc)` with slicing-by-8 tables: any CPU."""
    t = _SLICE8
    c = crc ^ 0xFFFFFFFF
    i = start
    while stop - i >= 8:
        word = _load_u64(buf, i)
        lo = (word ^ c) & 0xFFFFFFFF
        hi = word >> 32 & 0xFFFFFFFF
        c = np.int64(
            t[1792 + (lo & 0xFF)]
            ^ t[1536 + (lo >> 8 & 0xFF)]
            ^ t[1280 + (lo >> 16 & 0xFF)]
            ^ t[1024 + (lo >> 24)]
            ^ t[768 + (hi & 0xFF)]
            ^ t[512 + (hi >> 8 & 0xFF)]
            ^ t[256 + (hi >> 16 & 0xFF)]
            ^ t[hi >> 24]
        )
        i += 8
    while i < stop:
        c = np.int64(t[(c ^ buf[i]) & 0xFF]) ^ (c >> 8)
        i += 1
    return c ^ 0xFFFFFFFF


crc32c_update = crc32c_update_hw if HARDWARE else crc32c_update_sw
"""The kernel for this CPU: `crc32c_py(buf[start:stop], crc)`. Bounds are not checked."""
