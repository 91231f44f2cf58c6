"""The object store's answers to the uploaders' requests (`TierIo`), fed to the uploader that
asked, and the `object` durability level's acknowledgements that indexed objects release."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from danube.machines.node.catalogue import Catalogue
from danube.machines.node.effects import Effect, PublishAcked, Step, TierIo
from danube.machines.node.reliable_log import ReliableLogs
from danube.machines.tiering import uploader as tier
from danube.machines.tiering.index import IndexEntry, IndexFormatError


class ObjectTier:
    def __init__(self, catalogue: Catalogue, logs: ReliableLogs, rng: random.Random) -> None:
        self._topics = catalogue.topics_by_name
        self._logs = logs
        self._rng = rng
        """Retry jitter: drawn here, in the order the answers arrive (simulator digests
        depend on it)."""

    def _tier(self, io: TierIo, call: Callable[[tier.Uploader], list[tier.Effect]]) -> Step[None]:
        """Feeds an answer to the uploader that asked, if the topic still has it."""
        record = self._topics.get(io.topic)
        if record is None:
            return Step(None)
        state = record.log
        if state.uploader is None or state.uploader_id != io.uploader:
            return Step(None)
        record.touch()  # its timers move: the next tick takes them (`ReliableLogs._next_due`)
        return Step(None, tuple(self._logs.tier_effects(record, call(state.uploader))))

    def upload_done(
        self,
        io: TierIo,
        size: int,
        crc32c: int,
        offset_index: tuple[tuple[int, int], ...],
        *,
        now_ms: int,
    ) -> Step[None]:
        assert isinstance(io.effect, tier.UploadSegment)
        key = io.effect.key
        return self._tier(io, lambda u: u.upload_done(key, size, crc32c, offset_index, now_ms))

    def upload_failed(
        self, io: TierIo, kind: tier.UploadError, reason: str, *, now_ms: int
    ) -> Step[None]:
        assert isinstance(io.effect, tier.UploadSegment)
        key, jitter = io.effect.key, self._rng.randrange(250)
        return self._tier(
            io, lambda u: u.upload_failed(key, kind, now_ms, reason=reason, jitter_ms=jitter)
        )

    def index_committed(self, io: TierIo, *, now_ms: int) -> Step[None]:
        assert isinstance(io.effect, tier.CommitIndex)
        start = io.effect.entry.start_offset
        step = self._tier(io, lambda u: u.index_committed(start, now_ms))
        return Step(None, (*step.effects, *self._object_acks(io.topic, now_ms)))

    def index_read(self, io: TierIo, value: Any | None, *, now_ms: int) -> Step[None]:
        """A `CommitIndex` whose compare failed, and what its path holds when read afterwards
        (None: nothing, or the read failed). An entry is judged by `index_exists` (one that
        parses but is unsound halts the uploader); nothing means the compare failed on the
        fence (the claim is gone), and neither that nor a value that is no entry at all tells
        the outcome: the commit is retried, and the fence decides again."""
        if value is None:
            return self.commit_failed(io, now_ms=now_ms)
        try:
            entry = IndexEntry.from_json(value)
        except IndexFormatError:
            return self.commit_failed(io, now_ms=now_ms)
        step = self._tier(io, lambda u: u.index_exists(entry, now_ms))
        return Step(None, (*step.effects, *self._object_acks(io.topic, now_ms)))

    def _object_acks(self, topic: str, now_ms: int) -> tuple[Effect, ...]:
        """`object` level: answer the publishes the index now covers, and let dispatch
        deliver what it covers (`ReliableLogs.readable_end`: nothing unindexed is readable)."""
        record = self._topics.get(topic)
        if record is None:
            return ()
        state = record.log
        if not state.object_ack or state.uploader is None or state.uploader.indexed_next is None:
            return ()
        out: list[Effect] = []
        through = min(state.uploader.indexed_next - 1, state.durable_through)
        if through > state.acked_through:
            state.acked_through = through
            out.append(PublishAcked(topic, through))
        if record.wal is not None and state.replication is None:
            readable = self._logs.readable_end(record)
            if readable:
                out.extend(self._logs.make_readable(record, readable - 1, now_ms))
        return tuple(out)

    def commit_failed(self, io: TierIo, *, now_ms: int) -> Step[None]:
        assert isinstance(io.effect, tier.CommitIndex)
        start, jitter = io.effect.entry.start_offset, self._rng.randrange(250)
        return self._tier(io, lambda u: u.commit_failed(start, now_ms, jitter))

    def objects_listed(
        self, io: TierIo, objects: list[tier.StoredObject], *, now_ms: int
    ) -> Step[None]:
        return self._tier(io, lambda u: u.objects_listed(objects, now_ms))

    def busy(self) -> bool:
        """Some topic still has uploads or commits under way (shutdown may wait a little)."""
        return any(
            r.log.uploader is not None and not r.log.uploader.idle for r in self._topics.values()
        )
