"""Protocol Buffers base-128 varints, written once for every hand-written encoder.

The WAL's record codec, the batched path's reply encoders, the replication codec and the etcd
client each encode varints by hand (betterproto's objects cost too much on those paths). They
share this one encoder so that a fix to it reaches all of them.

Two entry points, two contracts: `append_varint` takes an unsigned 64-bit value and refuses
anything else (a negative request id or a timestamp past 64 bits is a caller's bug, which must
fail where it happens rather than be stored as some other number); `varint` writes a signed
or unsigned 64-bit value as proto3 writes an int64/uint64 field (a negative one as ten bytes
of its two's complement, which etcd's revisions and leases may need).
"""

from __future__ import annotations

UINT64 = (1 << 64) - 1
INT64_MIN = -(1 << 63)


def append_varint(value: int, out: bytearray) -> None:
    """Append the unsigned 64-bit `value` to `out` as a varint; ValueError outside 0..2**64-1."""
    if not 0 <= value <= UINT64:
        raise ValueError(f"a varint holds 0..2**64-1, not {value}")
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def varint(value: int) -> bytes:
    """`value` (an int64 or a uint64) as a varint, in a bytes object of its own; a negative
    value is its 64-bit two's complement. ValueError outside INT64_MIN..2**64-1."""
    if not INT64_MIN <= value <= UINT64:
        raise ValueError(f"a varint holds an int64 or a uint64, not {value}")
    out = bytearray()
    append_varint(value & UINT64, out)
    return bytes(out)
