"""The per-topic WAL's settings (spec/durability.md): values the config parser builds and the
WAL machine (`danube.machines.wal.machine`, which re-exports them) reads. They live with the values
so that `danube.values.config` imports no machine."""

from __future__ import annotations

import enum
from dataclasses import dataclass

MIB = 1024 * 1024


class Durability(enum.Enum):
    """When an append counts as acknowledged (spec/durability.md)."""

    FSYNC = "fsync"
    """After the fsync that covers it: survives power failure. The default."""
    FLUSH = "flush"
    """Once the OS has it (before fsync): survives a process crash; a power failure loses up
    to the last `flush_interval_ms` of acknowledged appends. Danube's behaviour, roughly."""


@dataclass(frozen=True, slots=True)
class WalConfig:
    """Per-topic WAL settings. Sizes are bytes, times milliseconds; None switches a limit off."""

    durability: Durability = Durability.FSYNC
    segment_bytes: int = 64 * MIB
    """Rotate before a frame would take the active segment past this (header included); a
    single frame larger than this gets a segment of its own."""
    segment_age_ms: int | None = None
    """Close the active segment once it is this old, even without new appends."""
    max_write_bytes: int = 4 * MIB
    """Largest group-commit write; one frame larger than this is written alone."""
    flush_interval_ms: int = 1000
    """`FLUSH` mode: fsync once written data is this old. Bounds the power-failure loss."""
    cache_bytes: int = 64 * MIB
    """Upper bound of one topic's hot cache of recent records, in accounted bytes (what the
    records cost in memory, `danube.machines.memory.accounting`); oldest evicted first. The
    broker-wide cache pool (spec/memory.md) bounds all topics' caches together."""
    index_interval_bytes: int = 4096
    """Sparse index density: one offset→position entry at least every this many bytes."""
    retention_bytes: int | None = None
    """Delete the oldest closed segments while the topic's segments exceed this."""
    retention_ms: int | None = None
    """Delete closed segments whose newest record is older than this."""
    synced_writes: bool = False
    """`FSYNC` only: the driver fsyncs every `Write` before it reports `write_done`, so a
    write is durable when done and no `Fsync` follows it (one I/O round trip per group commit
    instead of two)."""

    def __post_init__(self) -> None:
        checks = {
            "segment_bytes": self.segment_bytes,
            "segment_age_ms": self.segment_age_ms,
            "max_write_bytes": self.max_write_bytes,
            "flush_interval_ms": self.flush_interval_ms,
            "retention_bytes": self.retention_bytes,
            "retention_ms": self.retention_ms,
        }
        for name, value in checks.items():
            if value is not None and value <= 0:
                raise ValueError(f"WAL {name} must be positive, got {value}")
        for name, value in {
            "cache_bytes": self.cache_bytes,
            "index_interval_bytes": self.index_interval_bytes,
        }.items():
            if value < 0:
                raise ValueError(f"WAL {name} must not be negative, got {value}")
