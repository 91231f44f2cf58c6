"""The WAL frame's layout (spec/wal-format.md) without any checksum code: the constants and the
frame body every encoder shares.

Why a module of its own: `danube.kernels` (numba) and the client (the `crc32c` C package) both
encode frames, and the client must not import numba (issue 26: a CLI or an application that
only publishes pays no JIT compiler). Both take the layout from here and differ only in the
CRC32C implementation; tests/client/test_no_numba.py checks they produce the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

CRC32C_POLY = 0x82F63B78
FRAME_HEADER = 32
FRAME_MAGIC = 0x46574E44
MIN_FRAME = FRAME_HEADER + 4
MAX_FRAME = 64 * 1024 * 1024
MAX_RECORDS_PER_FRAME = 0xFFFF

_FRAME_HEAD = struct.Struct("<IIIHHQQ")
_U32 = struct.Struct("<I")


def frame_body(base_offset: int, publish_ms: int, records: Sequence[bytes]) -> bytes:
    """A frame of `records` without its leading CRC field: the bytes the CRC covers."""
    if not 1 <= len(records) <= MAX_RECORDS_PER_FRAME:
        raise ValueError(f"a frame holds 1 to {MAX_RECORDS_PER_FRAME} records")
    length = FRAME_HEADER + 4 * len(records) + sum(len(r) for r in records)
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    head = _FRAME_HEAD.pack(0, length, FRAME_MAGIC, 0, len(records), base_offset, publish_ms)
    # One join of the header and every (length, record) pair: no copy per record.
    return b"".join([head[4:], *(part for r in records for part in (_U32.pack(len(r)), r))])
