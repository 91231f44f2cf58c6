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
    PersistMeta,
    PublishAcked,
    PublishFailed,
    ReadObject,
    ReadWal,
    RepairWal,
    TierHalted,
    TierIo,
    TopicStopped,
    WalIo,
)
from danube.tiering import (
    CommitIndex,
    DeleteObject,
    ListObjects,
    StoredObject,
    UploadSegment,
    decode_object_read,
    describe_object,
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

    def __init__(
        self,
        core: BrokerCore,
        files: dict[str, dict[int, bytearray]] | None = None,
        objects: dict[str, bytes] | None = None,
        metadata: dict[str, Any] | None = None,
    ):
        self.core = core
        self.files: dict[str, dict[int, bytearray]] = files if files is not None else {}
        self.objects: dict[str, bytes] = objects if objects is not None else {}
        """The object store: key -> bytes."""
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        """Metadata written by effects (PersistMeta and index commits), JSON values."""
        self.halted: list[TierHalted] = []
        self.acked: dict[str, int] = {}
        self.stopped: dict[str, str] = {}
        self.now_ms = 1_000
        self.hold_uploads = False
        """Keep `UploadSegment` requests in `held` instead of performing them: an upload
        still under way, to finish later with `finish_upload`."""
        self.held: list[TierIo] = []

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
                if effect.delete_files:
                    self.files.pop(effect.topic, None)
                self.acked.pop(effect.topic, None)
            elif isinstance(effect, ReadWal):
                work.extend(self._read(effect))
            elif isinstance(effect, ReadObject):
                plan = effect.plan
                data = self.objects[plan.key][plan.start_byte : plan.end_byte]
                records = decode_object_read(plan, data)
                work.extend(self.core.wal_read_done(effect, records, now_ms=self.now_ms).effects)
            elif isinstance(effect, TierIo):
                work.extend(self._tier(effect))
            else:
                if isinstance(effect, PersistMeta):
                    effect.apply_to(self.metadata)
                elif isinstance(effect, TierHalted):
                    self.halted.append(effect)
                if isinstance(effect, PublishAcked):
                    previous = self.acked.get(effect.topic, -1)
                    self.acked[effect.topic] = max(previous, effect.through_offset)
                elif isinstance(effect, (PublishFailed, TopicStopped)):
                    self.stopped[effect.topic] = effect.reason
                out.append(effect)
        return out

    def finish_upload(self, io: TierIo) -> list[Any]:
        """Performs a held upload now and reports it to the core."""
        return self.run(self._tier(io, hold=False))

    def _tier(self, io: TierIo, *, hold: bool | None = None) -> list[Any]:
        core, topic, effect, now = self.core, io.topic, io.effect, self.now_ms
        if isinstance(effect, UploadSegment) and (self.hold_uploads if hold is None else hold):
            self.held.append(io)
            return []
        if isinstance(effect, UploadSegment):
            data = bytes(self.files[topic][effect.segment_base])
            facts = describe_object(
                data, effect.segment_base, effect.next_offset, effect.index_interval_bytes
            )
            self.objects[effect.key] = data
            return list(
                core.tier_upload_done(
                    io, facts.size, facts.crc32c, facts.offset_index, now_ms=now
                ).effects
            )
        if isinstance(effect, CommitIndex):
            if effect.path in self.metadata:
                return list(
                    core.tier_index_read(io, self.metadata[effect.path], now_ms=now).effects
                )
            self.metadata[effect.path] = effect.value
            self.metadata[effect.current_path] = effect.current_value
            return list(core.tier_index_committed(io, now_ms=now).effects)
        if isinstance(effect, ListObjects):
            keys = sorted(k for k in self.objects if k.startswith(effect.prefix))
            listed = [StoredObject(key, 0) for key in keys]
            return list(core.tier_objects_listed(io, listed, now_ms=now).effects)
        assert isinstance(effect, DeleteObject)
        self.objects.pop(effect.key, None)
        return []

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
