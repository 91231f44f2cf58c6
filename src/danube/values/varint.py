"""Protocol Buffers base-128 varints, written once for every hand-written encoder.

The WAL's record codec, the batched path's reply encoders, the replication codec and the etcd
client each encode varints by hand (betterproto's objects cost too much on those paths). They
share this one encoder so that a fix to it (the two's-complement rule for negative int64s, say)
reaches all of them.
"""

from __future__ import annotations

UINT64 = (1 << 64) - 1


def append_varint(value: int, out: bytearray) -> None:
    """Append `value` to `out` as a varint. A negative value is written as proto3 writes an int64:
    ten bytes of its 64-bit two's complement."""
    value &= UINT64
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def varint(value: int) -> bytes:
    """`value` as a varint, in a bytes object of its own (see `append_varint`)."""
    out = bytearray()
    append_varint(value, out)
    return bytes(out)
