"""Fault models and their knobs. Every probability is per opportunity (per message sent, per
disk operation, per fault-clock tick of `FAULT_TICK_US`); a run counts what it injected."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields

FAULT_TICK_US = 100_000
"""How often the fault clock rolls the dice for crashes, partitions and clock jumps."""


@dataclass(frozen=True, slots=True)
class Faults:
    # network
    latency_us: int = 300
    """Mean one-way latency (exponential around a 50 µs floor), so calls reorder."""
    loss: float = 0.0
    """A request or reply is lost (the caller times out); a stream breaks."""
    partition: float = 0.0
    """Per fault tick: one client is cut off from the broker for a while."""
    partition_us: int = 1_500_000
    # disk
    fsync_us: int = 500
    slow_fsync: float = 0.0
    """An fsync takes 50 times longer."""
    disk_full: float = 0.0
    """Per fault tick: the disk is full for a while (writes fail with ENOSPC)."""
    bit_flip: float = 0.0
    """Per fault tick: a bit of a closed segment goes bad at rest."""
    # process
    crash: float = 0.0
    """Per fault tick: the broker process dies (writes in flight are torn) and restarts."""
    power_failure: float = 0.0
    """Per fault tick: the machine loses power: unsynced bytes are lost (a torn prefix
    survives) and the broker restarts."""
    restart_us: int = 300_000
    clock_jump: float = 0.0
    """Per fault tick: the broker's wall clock steps by up to ±30 s."""

    @classmethod
    def knobs(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def without_faults(self) -> Faults:
        """The same latencies, no faults: the drain phase at the end of a run."""
        return Faults(latency_us=self.latency_us, fsync_us=self.fsync_us)


class Injected(Counter[str]):
    """Which faults a run injected, and how often."""

    def summary(self) -> str:
        if not self:
            return "none"
        return ", ".join(f"{name} x{count}" for name, count in sorted(self.items()))
