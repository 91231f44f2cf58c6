"""Stateful property test of the WAL machine on a simulated disk, judged by the reference
model `spec/models/wal_model.py` (spec/durability.md).

Random appends, I/O performed one effect at a time in emission order (a sequential driver),
completions delivered in any order, failed writes and fsyncs, ticks, seals, reads, and crashes
at any point — a process crash (page cache kept) or a power failure (unsynced bytes lost but
for a random prefix), optionally in the middle of a write or of `CreateSegment`. After each
crash the files are scanned, `plan_recovery` runs, a new machine is built and the model checks
what survived. Throughout:

1. every acknowledged record survives with its offset and bytes (`FSYNC`: any crash; `FLUSH`:
   a process crash, and a power failure up to the last fsync);
2. offsets are dense from the first retained offset and continue after recovery;
3. nothing beyond `Readable` is ever returned by `read`;
4. at most one write (and in `FSYNC` mode one write-or-fsync) is in flight;
5. `Acknowledge` and `Readable` are monotonic and never claim more than the disk did;
6. `tick_due` says exactly whether a `tick` does anything (effects or a change of state), so
   a driver that skips the ticks it says are idle decides the same (issue 22); tiered runs
   release random segments to retention (`allow_delete`);
and when the run ends, draining the I/O acknowledges every append (group commit never stalls).
"""

from __future__ import annotations

import copy
import random
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from danube.machines.wal.machine import (
    Acknowledge,
    CachedRecords,
    CreateSegment,
    DeleteSegment,
    Durability,
    Effect,
    Failed,
    FileRead,
    Fsync,
    NotRetained,
    Readable,
    WalConfig,
    WalMachine,
    WalUnavailable,
    Write,
)
from danube.machines.wal.recovery import plan_recovery
from spec.models.wal_model import Crash, Level, WalModel
from tests.wal.simdisk import TOPIC, SimDisk, perform

configs = st.builds(
    WalConfig,
    durability=st.sampled_from(Durability),
    segment_bytes=st.integers(120, 500),
    segment_age_ms=st.none() | st.integers(50, 800),
    max_write_bytes=st.integers(40, 300),
    flush_interval_ms=st.integers(10, 300),
    cache_bytes=st.integers(0, 80),
    index_interval_bytes=st.integers(0, 150),
    retention_bytes=st.none() | st.integers(200, 1200),
    retention_ms=st.none() | st.integers(100, 2000),
)
batches = st.lists(st.binary(max_size=12), min_size=1, max_size=4)


class WalOnSimulatedDisk(RuleBasedStateMachine):
    @initialize(config=configs, tiered=st.booleans())
    def setup(self, config: WalConfig, tiered: bool) -> None:
        self.config = config
        self.tiered = tiered
        self.fsync_mode = config.durability is Durability.FSYNC
        self.disk = SimDisk()
        self.model = WalModel(self.fsync_mode)
        self.machine = WalMachine(TOPIC, config, tiered=tiered)
        self.now = 1_700_000_000_000
        self.io: deque[Effect] = deque()
        """Effects emitted and not yet performed, in order (the sequential driver's queue)."""
        self.completions: list[tuple[str, int]] = []
        """Performed I/O whose completion is not yet delivered."""
        self.writes_in_flight: set[int] = set()
        self.fsyncs_in_flight: set[int] = set()
        self.failed: Failed | None = None

    # -- the driver -----------------------------------------------------------------------------

    def handle(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case Acknowledge(through_offset=through):
                    assert self.failed is None, "acknowledged after Failed"
                    self.model.acknowledge(through)
                case Readable(through_offset=through):
                    assert self.failed is None, "readable after Failed"
                    self.model.make_readable(through)
                case Failed():
                    self.on_failed(effect)
                case Write(write_id=write_id):
                    assert not self.writes_in_flight, "two writes in flight"
                    assert not (self.fsync_mode and self.fsyncs_in_flight), "write during fsync"
                    self.writes_in_flight.add(write_id)
                    self.io.append(effect)
                case Fsync(fsync_id=fsync_id):
                    assert not self.fsyncs_in_flight, "two fsyncs in flight"
                    assert not (self.fsync_mode and self.writes_in_flight), "fsync during write"
                    self.fsyncs_in_flight.add(fsync_id)
                    self.io.append(effect)
                case _:
                    self.io.append(effect)

    def on_failed(self, failed: Failed) -> None:
        """What the real driver does (spec/durability.md, "Failed writes and fsyncs")."""
        assert failed.unacknowledged_from == self.model.acknowledged
        assert failed.next_offset <= failed.unacknowledged_from
        if self.fsync_mode:
            assert failed.next_offset == failed.unacknowledged_from
        self.failed = failed
        self.io.clear()
        self.disk.truncate(failed.segment_base, failed.truncate_to)
        self.model.truncate(failed.next_offset)
        self.model.reached(self.disk.fsync(failed.segment_base), Level.SYNCED)

    def perform_next(self) -> None:
        effect = self.io.popleft()
        match effect:
            case Write(write_id=write_id):
                self.model.reached(self.disk.write(effect), Level.WRITTEN)
                self.completions.append(("write", write_id))
            case Fsync(fsync_id=fsync_id, segment_base=base):
                self.model.reached(self.disk.fsync(base), Level.SYNCED)
                self.completions.append(("fsync", fsync_id))
            case DeleteSegment():
                perform(self.disk, effect)
                self.model.retain_from(min(self.disk.files))
            case _:
                perform(self.disk, effect)

    def deliver(self, index: int) -> None:
        kind, io_id = self.completions.pop(index)
        if kind == "write":
            self.writes_in_flight.discard(io_id)
            self.handle(self.machine.write_done(io_id, self.now))
        else:
            self.fsyncs_in_flight.discard(io_id)
            self.handle(self.machine.fsync_done(io_id, self.now))

    def restart(self, crash: Crash) -> None:
        """Recovery as the real driver will run it, then the model's verdict."""
        self.io.clear()
        self.completions.clear()
        self.writes_in_flight.clear()
        self.fsyncs_in_flight.clear()
        plan = plan_recovery(TOPIC, self.disk.scans())
        for action in plan.actions:
            self.disk.apply(action)
        first, records = self.disk.records()
        self.model.recover(crash, plan.next_offset if first is None else first, records)
        self.machine = WalMachine(TOPIC, self.config, plan, tiered=self.tiered)
        self.failed = None
        assert self.machine.next_offset == plan.next_offset == self.model.next_offset
        assert self.machine.first_offset == self.model.first

    # -- rules ----------------------------------------------------------------------------------

    @rule(batch_list=st.lists(batches, min_size=1, max_size=3), dt=st.integers(0, 30))
    def append(self, batch_list: list[list[bytes]], dt: int) -> None:
        for batch in batch_list:
            self.now += dt
            first, effects = self.machine.append(batch, self.now)
            assert first == self.model.append(batch)
            self.handle(effects)

    @precondition(lambda self: self.io)
    @rule()
    def perform_io(self) -> None:
        self.perform_next()

    @precondition(lambda self: self.completions)
    @rule(pick=st.integers(0, 1), dt=st.integers(0, 30))
    def complete(self, pick: int, dt: int) -> None:
        self.now += dt
        self.deliver(pick % len(self.completions))

    @rule(steps=st.lists(st.integers(0, 3), min_size=1, max_size=12), dt=st.integers(0, 10))
    def run_io(self, steps: list[int], dt: int) -> None:
        """Several driver steps at once (perform, or deliver the oldest or newest completion),
        so that runs get deep enough for rotation, retention and file reads."""
        for step in steps:
            self.now += dt
            if self.io and (step < 2 or not self.completions):
                self.perform_next()
            elif self.completions:
                self.deliver(0 if step == 2 else -1)

    @precondition(lambda self: self.io and isinstance(self.io[0], Write | Fsync))
    @rule(keep=st.integers(0, 1 << 16), batch=batches)
    def fail_io(self, keep: int, batch: list[bytes]) -> None:
        """A write or fsync fails: the machine stops, the driver truncates and reloads."""
        effect = self.io.popleft()
        if isinstance(effect, Write):
            self.disk.write_prefix(effect, keep % (len(effect.data) + 1))
            self.writes_in_flight.discard(effect.write_id)
            self.handle(self.machine.write_failed(effect.write_id, "EIO"))
        else:
            assert isinstance(effect, Fsync)
            self.fsyncs_in_flight.discard(effect.fsync_id)
            self.handle(self.machine.fsync_failed(effect.fsync_id, "EIO"))
        assert self.failed is not None
        with pytest.raises(WalUnavailable):
            self.machine.append(batch, self.now)
        assert self.machine.tick(self.now) == [] and self.machine.seal(self.now) == []
        for kind, io_id in self.completions:  # I/O that was under way finishes, ignored
            done = self.machine.write_done if kind == "write" else self.machine.fsync_done
            assert done(io_id, self.now) == []
        self.read_and_check(self.machine.first_offset, 10, 100)
        self.retained_bytes_add_up()  # (the failure cut the segment)
        self.restart(Crash.PROCESS)

    @rule(dt=st.integers(-50, 400))
    def tick(self, dt: int) -> None:
        """Time passes (or the wall clock steps back a little), and `tick_due` is exact."""
        self.now += dt
        due = self.machine.tick_due(self.now)
        before = _state(self.machine)
        effects = self.machine.tick(self.now)
        changed = _state(self.machine) != before
        assert due == bool(effects or changed), (due, effects, changed)
        self.handle(effects)

    @precondition(lambda self: self.tiered and self.disk.files)
    @rule(pick=st.integers(0, 1 << 16))
    def release(self, pick: int) -> None:
        """Tiering indexed a segment's object: retention may delete that one."""
        bases = sorted(self.disk.files)
        self.machine.allow_delete(bases[pick % len(bases)])

    @rule()
    def seal(self) -> None:
        self.handle(self.machine.seal(self.now))

    @rule(
        where=st.integers(0, 1 << 16),
        max_records=st.integers(1, 6),
        max_bytes=st.integers(1, 40),
    )
    def read(self, where: int, max_records: int, max_bytes: int) -> None:
        low = max(self.machine.first_offset - 1, 0)
        from_offset = low + where % (self.model.next_offset + 2 - low)
        self.read_and_check(from_offset, max_records, max_bytes)

    def read_and_check(self, from_offset: int, max_records: int, max_bytes: int) -> None:
        result = self.machine.read(from_offset, max_records, max_bytes)
        match result:
            case NotRetained(first_offset=first):
                assert from_offset < first == self.machine.first_offset
                return
            case CachedRecords(offset=offset, records=records):
                assert offset == from_offset
            case FileRead():
                assert result.from_offset == from_offset
                records = self.disk.read(result)
        end = from_offset + len(records)
        assert not records or end <= self.model.readable, "read beyond Readable"
        assert records == tuple(self.model.records[from_offset:end])
        assert len(records) <= max_records
        if from_offset < self.model.readable:
            assert records, "a readable record was not served"

    @rule(
        crash=st.sampled_from(Crash),
        mid_io=st.booleans(),
        keep=st.integers(0, 1 << 16),
        seed=st.integers(0, 1 << 32),
    )
    def crash(self, crash: Crash, mid_io: bool, keep: int, seed: int) -> None:
        if mid_io and self.io:
            effect = self.io[0]
            if isinstance(effect, Write):
                self.disk.write_prefix(effect, keep % (len(effect.data) + 1))
            elif isinstance(effect, CreateSegment):
                self.disk.create_torn(
                    effect.base_offset, effect.header, keep % (len(effect.header) + 1)
                )
        self.disk.crash(crash, random.Random(seed))
        self.restart(crash)

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        machine, model = self.machine, self.model
        assert machine.cached_bytes <= self.config.cache_bytes
        assert len(self.writes_in_flight) <= 1 and len(self.fsyncs_in_flight) <= 1
        assert machine.next_offset == model.next_offset
        assert machine.readable_offset == model.readable
        for offset in range(model.first, machine.durable_offset):
            assert model.levels[offset] is Level.SYNCED, f"offset {offset} not durable"

    @invariant()
    def retained_bytes_add_up(self) -> None:
        """The running total that size retention reads is the segments' sizes added up."""
        state = vars(self.machine)
        assert state["_segment_bytes"] == sum(s.size for s in state["_segments"])

    def teardown(self) -> None:
        """Liveness: with the I/O drained, every append is acknowledged and readable."""
        if not hasattr(self, "machine"):
            return
        while self.io or self.completions:
            if self.io:
                self.perform_next()
            else:
                self.deliver(0)
        assert self.model.acknowledged == self.model.next_offset
        assert self.machine.readable_offset == self.machine.next_offset


WalOnSimulatedDisk.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWalOnSimulatedDisk = WalOnSimulatedDisk.TestCase


def _state(machine: WalMachine) -> dict[str, Any]:
    """Everything the machine holds, copied, to tell whether a call changed anything (the
    hot cache, a slotted object without equality, by its slots)."""
    state = copy.deepcopy(vars(machine))
    cache = state.pop("_cache")
    state["_cache"] = {name: getattr(cache, name) for name in type(cache).__slots__}
    return state
