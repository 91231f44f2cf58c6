"""Runs a `BrokerCore`'s WAL effects synchronously against in-memory segment files, so unit
tests can drive reliable topics through the very code paths the trio runtime uses (load,
append, group commit, file reads, drop) without threads or a clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from danube.node.core import (
    BrokerCore,
    DropWal,
    LoadWal,
    PublishAcked,
    PublishFailed,
    ReadWal,
    RepairWal,
    TopicStopped,
    WalIo,
)
from danube.wal import format
from danube.wal.machine import (
    CloseSegment,
    CreateSegment,
    DeleteSegment,
    Fsync,
    Write,
    decode_file_read,
)
from danube.wal.recovery import (
    CorruptSegment,
    TruncateSegment,
    UnreadableSegment,
    plan_recovery,
)


class MemoryWalDriver:
    """Files live in `files[topic][segment_base]`; every effect completes at once. Effects
    the test cares about (metadata, stream wake-ups, acknowledgements) are returned."""

    def __init__(self, core: BrokerCore, files: dict[str, dict[int, bytearray]] | None = None):
        self.core = core
        self.files: dict[str, dict[int, bytearray]] = files if files is not None else {}
        self.acked: dict[str, int] = {}
        self.stopped: dict[str, str] = {}
        self.now_ms = 1_000

    def run(self, effects: Iterable[Any]) -> list[Any]:
        """Performs every WAL effect, feeding completions back until nothing is left;
        returns the other effects in the order they appeared."""
        out: list[Any] = []
        work = deque(effects)
        while work:
            effect = work.popleft()
            if isinstance(effect, WalIo):
                for io in effect.effects:
                    work.extend(self._perform(effect.topic, io))
            elif isinstance(effect, LoadWal):
                work.extend(self._load(effect.topic, fresh=effect.fresh))
            elif isinstance(effect, RepairWal):
                segment = self.files[effect.topic][effect.segment_base]
                del segment[effect.truncate_to :]
                work.extend(self._load(effect.topic, fresh=False))
            elif isinstance(effect, DropWal):
                self.files.pop(effect.topic, None)
                self.acked.pop(effect.topic, None)
            elif isinstance(effect, ReadWal):
                work.extend(self._read(effect))
            else:
                if isinstance(effect, PublishAcked):
                    previous = self.acked.get(effect.topic, -1)
                    self.acked[effect.topic] = max(previous, effect.through_offset)
                elif isinstance(effect, (PublishFailed, TopicStopped)):
                    self.stopped[effect.topic] = effect.reason
                out.append(effect)
        return out

    def _perform(self, topic: str, io: Any) -> list[Any]:
        segments = self.files.setdefault(topic, {})
        if isinstance(io, CreateSegment):
            segments[io.base_offset] = bytearray(io.header)
        elif isinstance(io, Write):
            segment = segments[io.segment_base]
            assert len(segment) == io.position, "writes are sequential"
            segment += io.data
        elif isinstance(io, DeleteSegment):
            segments.pop(io.segment_base, None)
        else:
            assert isinstance(io, (Fsync, CloseSegment)), io
        return list(self.core.wal_io_done(topic, io, None, now_ms=self.now_ms).effects)

    def _load(self, topic: str, *, fresh: bool) -> list[Any]:
        if fresh:
            self.files.pop(topic, None)
        scans: list[Any] = []
        for base, data in sorted(self.files.get(topic, {}).items()):
            try:
                scans.append((base, format.scan_segment(bytes(data))))
            except format.WalFormatError as error:
                scans.append((base, UnreadableSegment(len(data), str(error))))
        try:
            plan = plan_recovery(topic, scans)
        except CorruptSegment as error:
            return list(self.core.wal_load_failed(topic, str(error)).effects)
        segments = self.files.setdefault(topic, {})
        for action in plan.actions:
            if isinstance(action, TruncateSegment):
                del segments[action.segment_base][action.size :]
        return list(self.core.wal_loaded(topic, plan, now_ms=self.now_ms).effects)

    def _read(self, read: ReadWal) -> list[Any]:
        plan = read.plan
        data = bytes(self.files[read.topic][plan.segment_base][plan.start : plan.end])
        records = decode_file_read(plan, data)
        return list(self.core.wal_read_done(read, records, now_ms=self.now_ms).effects)
