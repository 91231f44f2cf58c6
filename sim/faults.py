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
    newest_damage: float = 0.0
    """Per fault tick: the broker process dies and, while it is down, the newest segment of
    a topic is damaged where the WAL checkpoint says it was durable: a bit flipped in its
    last checkpointed frame (half the time), its frames zeroed, or the file deleted."""
    memory_pressure: float = 0.0
    """Per fault tick: for 1 to 5 s memory outside the pools takes all of the broker's free
    publish pool room but a few hundred bytes (`PublishPool.pressure`), so publishes pile up,
    wait and are refused (spec/memory.md, "Back-pressure")."""
    connection_flood: float = 0.0
    """Per fault tick: 5 to 12 connections are opened and left idle, then a client's new
    connection makes its call (sim/connections.py, spec/memory.md "Connections")."""
    # process
    crash: float = 0.0
    """Per fault tick: the broker process dies (writes in flight are torn) and restarts."""
    power_failure: float = 0.0
    """Per fault tick: the machine loses power: unsynced bytes are lost (a torn prefix
    survives) and the broker restarts."""
    restart_us: int = 300_000
    clock_jump: float = 0.0
    """Per fault tick: the broker's wall clock steps by up to ±30 s."""
    # object store (tiered runs only: nothing else draws on these)
    s3_latency_us: int = 20_000
    """Mean latency of an object-store request (exponential around a 2 ms floor)."""
    s3_throttle: float = 0.0
    """Per request: refused with SlowDown (503); nothing is written."""
    s3_server_error: float = 0.0
    """Per request: a 5xx; a failed put has landed anyway half the time (lost answer)."""
    s3_stall: float = 0.0
    """Per request: it takes 1 to 5 s longer."""
    s3_get_outage: float = 0.0
    """Per fault tick: the store answers every GET (a history read) with a 5xx for 1 to
    10 s, while puts, lists and deletes go on (a read path outage). Half of them outlast
    the object-read flow's first six pauses (6.2 s): a flow that waits out the store's
    failures serves the reads afterwards, one that gives up stops the topic."""
    upload_crash: float = 0.0
    """Per landed upload: the broker dies before it commits the index entry, leaving an
    object no index names (counted as `orphan_left`)."""
    commit_unknown: float = 0.0
    """Per index commit: the answer is lost, whether or not the transaction landed (half
    each); the uploader must retry and recognise its own entry."""
    fenced_upload: float = 0.0
    """Per fault tick: an upload by a fenced-out former owner lands: an object with other
    records whose range starts inside the indexed history. Only the index keeps readers
    from it; the orphan scan must delete it."""

    @classmethod
    def knobs(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def without_faults(self) -> Faults:
        """The same latencies, no faults: the drain phase at the end of a run."""
        return Faults(
            latency_us=self.latency_us, fsync_us=self.fsync_us, s3_latency_us=self.s3_latency_us
        )


class Injected(Counter[str]):
    """Which faults a run injected, and how often."""

    def summary(self) -> str:
        if not self:
            return "none"
        return ", ".join(f"{name} x{count}" for name, count in sorted(self.items()))
