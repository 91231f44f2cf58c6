"""Real sealed WAL segments for the tiering tests: bytes exactly as the WAL writes them, so
objects, index facts and reads are checked against the true format, not a stand-in."""

from __future__ import annotations

from collections.abc import Sequence

from danube.machines.wal import format
from danube.values.names import parse_topic

TOPIC = parse_topic("/default/tiered")
NOW = 1_700_000_000_000


def build_segment(base: int, frames: Sequence[Sequence[bytes]], created_ms: int = NOW) -> bytes:
    """A whole segment whose frames hold `frames` (one list of records each) from `base` on."""
    parts = [format.encode_segment_header(TOPIC.full, base, created_ms)]
    offset = base
    for records in frames:
        parts.append(format.encode_frame(offset, created_ms, records))
        offset += len(records)
    return b"".join(parts)


def record(offset: int, size: int = 3) -> bytes:
    """A recognisable record for `offset`: decoding must return it at that offset."""
    return f"r{offset}".encode().ljust(size, b".")
