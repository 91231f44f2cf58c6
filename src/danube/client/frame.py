"""The client's batch frame (spec/protocol.md, "Batched data path"): one WAL frame with base
offset 0, checksummed by the `crc32c` C package.

Why not `danube.machines.wal.format.encode_frame`: that one checksums with the broker's numba
kernel, and importing numba costs a client or a CLI 0.3–0.6 s before it does anything, plus a
JIT compile on first use (issue 26). The layout is shared (`danube.machines.wal.layout`);
tests/client/test_no_numba.py checks both encoders produce the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from crc32c import crc32c

from danube.machines.wal.layout import frame_body

_U32 = struct.Struct("<I")


def encode_batch(records: Sequence[bytes]) -> bytes:
    """`records` as one frame with base offset 0 and publish time 0 (the broker stamps both)."""
    body = frame_body(0, 0, records)
    return _U32.pack(crc32c(body)) + body
