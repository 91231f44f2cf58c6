"""The broker core's routes for replication (spec/replication.md): the owner's side (its
followers' answers, the replicas value it adopts), the follower's side (an owner's
`Replicate`, the epochs it saves), and WAL loads, which reach either side. Split out of
`danube.machines.node.core` to keep that module under the size cap; `BrokerCore` inherits
these methods, so callers see one core. Like the rest of the core it only routes: the
decisions are `ReliableLogs.replicas` (the owner's machines) and `FollowerReplicas`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node.effects import DropWal, Effect, ReplicaAnswer, ReplicaRead, Step
from danube.machines.node.lifecycle import Lifecycle
from danube.machines.node.records import TopicRecord
from danube.machines.node.reliable_log import ReliableLogs
from danube.machines.node.replica_follower import FollowerReplicas, still_follows
from danube.machines.node.replica_owner import (
    REGISTER_AGAIN_MS,
    REGISTER_RETRY_MS,
    ReplicaConfig,
    replica_config,
)
from danube.machines.replication import messages as rm
from danube.machines.wal.recovery import RecoveryPlan


class ReplicationRoutes:
    """Mixed into `BrokerCore`, which provides these attributes."""

    logs: ReliableLogs
    followers: FollowerReplicas
    _topics: dict[str, TopicRecord]
    serves: Callable[[str], bool]
    lifecycle: Lifecycle

    # -- WAL loads: an owner's topic or a follower's replica ---------------------------------

    def wal_durable_end(self, topic: str) -> int | None:
        """Every offset of the topic below this is covered by a completed fsync (the WAL
        checkpoint's value); None while the topic has no working WAL."""
        if self.followers.serves(topic):
            return self.followers.durable_end(topic)
        return self.logs.wal_durable_end(topic)

    def wal_loaded(self, topic: str, plan: RecoveryPlan, *, now_ms: int) -> Step[None]:
        """The topic's WAL was recovered: at start, or after a repair (a repair rebuilds
        only the subscriptions that read what it cut)."""
        if self.followers.serves(topic):
            return self.followers.wal_loaded(topic, plan, now_ms)
        return self.logs.wal_loaded(topic, plan, now_ms=now_ms)

    def wal_load_failed(self, topic: str, reason: str) -> Step[None]:
        """Recovery refused the topic's segments (corruption) or the disk failed: the topic
        stops until an operator acts; other topics are not affected."""
        if self.followers.serves(topic):
            return self.followers.wal_load_failed(topic, reason)
        return self.logs.wal_load_failed(topic, reason)

    def wal_load_stale(self, topic: str) -> Step[None]:
        """A load whose topic's WAL was dropped while it ran (the topic deleted, perhaps
        created again, or handed over): its result describes files that are gone or belong
        to a newer record, so it is applied to nothing; only the sweep moves on."""
        return Step(None, tuple(self.logs.deferred.done(topic)))

    # -- replication, the owner's side (spec/replication.md) -----------------------------------

    def replicas_changed(self, topic: str, config: ReplicaConfig, *, now_ms: int) -> Step[None]:
        """The topic's replicas value as read (watch, or the read-back after a proposal):
        replication starts, follows the recorded in-sync set, or stops."""
        record = self._topics.get(topic)
        if record is None or record.phase.stopped:
            return Step(None)
        if record.wal is None:  # applied once the WAL loads; never an older value
            held = record.log.replica_config  # (as `OwnerReplicas.configure`, seed 74)
            if held is None or config.version >= held.version:
                record.log.replica_config = config
            return Step(None)
        return Step(None, tuple(self.logs.replicas.configure(record, config, now_ms)))

    def replica_proposal_answered(
        self, topic: str, config: ReplicaConfig, *, now_ms: int
    ) -> Step[None]:
        """A `ReplicaPropose` flow's value (written, or read back): as `replicas_changed`,
        and a registration under way is over: one that does not show this owner's epoch is
        made again at once (or at the next tick, when the owner ignores the value as older
        than the one it holds) if the store holds anything newer than the value it was
        made on, else `REGISTER_AGAIN_MS` later: a refused claim answers with that same
        value every time, and an immediate retry looped on the store (review finding). It
        also waits when the value names another epoch than this owner's: a proposal records
        an epoch only under a claim that wrote that epoch into the set, so one made at once
        writes again and again without registering (an owner loaded without reading its
        set rewrote it about 900 times a simulated second, `load_batch_forgets_replica_sets`).
        """
        record = self._topics.get(topic)
        if record is not None:
            record.touch()  # the registration's retry deadline moves (`OwnerReplicas.next_due`)
            state = record.log
            held = state.replica_config
            newest = max(config.version, -1 if held is None else held.version)
            other_epoch = config.epoch != state.epoch
            if state.registering and (newest <= state.registering_on or other_epoch):
                again = now_ms - REGISTER_RETRY_MS + REGISTER_AGAIN_MS
                state.registering_since = min(state.registering_since, again)
            else:
                state.registering = False
        return self.replicas_changed(topic, config, now_ms=now_ms)

    def replica_proposal_lost(self, topic: str) -> Step[None]:
        """A `ReplicaPropose` flow failed without a read-back: the owner proposes again later."""
        record = self._topics.get(topic)
        if record is None:
            return Step(None)
        return Step(None, tuple(self.logs.replicas.proposal_lost(record)))

    def replica_set_seen(self, topic: str, record: ReplicaSet | None, version: int, *,
                         assigned_here: bool, now_ms: int) -> Step[None]:  # fmt: skip
        """The topic's replica set as the `/cluster/` watch shows it (at `version`; None:
        deleted or unreadable): the owner's side adopts it; a replica this broker no longer
        follows goes with its files (`replica_follower.still_follows`), and so does the
        directory a hand-over left here (`Lifecycle.kept`) once the set no longer counts on
        this broker."""
        kept = self.lifecycle.kept
        if kept and topic in kept:
            dropped = self._kept_seen(topic, record, assigned_here)
            if dropped is not None:
                return dropped
        if self.serves(topic):
            self.lifecycle.seen_moving.pop(topic, None)  # a set seen on an earlier way out
            if record is None:
                return Step(None)
            return self.replicas_changed(topic, replica_config(record, version), now_ms=now_ms)
        if record is not None and topic in self._topics:  # loaded, on its way out
            self.lifecycle.seen_moving[topic] = record
        me = self.logs.replicas.broker_id
        if not self.followers.serves(topic) or still_follows(me, record, assigned_here):
            return Step(None)
        return self.followers.release(topic, delete_files=True)

    def kept_after_remove(self, topic: str) -> list[Effect]:
        """A topic just removed after handing over: its kept directory judged by the replica
        set seen while it left (seed 1 of the replicated cluster run: the successor recorded
        itself before the removal, and nothing changed after it)."""
        seen = self.lifecycle.seen_moving.pop(topic, None)
        if topic not in self.lifecycle.kept:
            return []
        dropped = self._kept_seen(topic, seen, assigned_here=False)
        return list(dropped.effects) if dropped is not None else []

    def _kept_seen(
        self, topic: str, record: ReplicaSet | None, assigned_here: bool
    ) -> Step[None] | None:
        """A handed-over topic's kept directory given its replica set: still this broker's
        to take back (the set names it as owner, follower or in sync, or the topic is
        assigned here: its files are the log it loads or follows with), or gone. Until a
        promoted member records itself as owner the set still names this broker, so the
        files stay while they may be the only copy outside the followers. A set that is
        unreadable or deleted changes nothing (a topic deleted and made again here starts
        with its leftovers removed)."""
        kept = self.lifecycle.kept
        if self.serves(topic) or self.followers.serves(topic):
            kept.discard(topic)  # loaded or followed again: the directory is in use
            return None
        me = self.logs.replicas.broker_id
        if record is None or still_follows(me, record, assigned_here):
            return None
        kept.discard(topic)
        reason = f"handed over to {record.owner}, whose replicas hold the log"
        return Step(None, (DropWal(topic, reason, True),))

    def replica_answered(
        self, follower: str, answer: rm.FollowerAnswer, *, now_ms: int
    ) -> Step[None]:
        """A follower's answer on the replication stream."""
        record = self._topics.get(answer.topic)
        if record is None or record.wal is None:
            return Step(None)
        return Step(None, tuple(self.logs.replicas.answered(record, follower, answer, now_ms)))

    def replica_stream_broke(self, follower: str, *, now_ms: int) -> Step[None]:
        """The stream to `follower` broke: sends on it may be lost, for every topic."""
        effects: list[Effect] = []
        for record in self._topics.values():
            if record.log.replication is not None and record.wal is not None:
                effects.extend(self.logs.replicas.broke(record, follower, now_ms))
        return Step(None, tuple(effects))

    def replica_frames_read(
        self, read: ReplicaRead, frames: bytes, end: int, *, now_ms: int
    ) -> Step[None]:
        """The frames a `ReplicaRead` asked for: offsets [`read.plan.from_offset`, `end`)."""
        record = self._topics.get(read.topic)
        if record is None or record.wal is None:
            return Step(None)
        from_offset = read.plan.from_offset
        effects = self.logs.replicas.frames_read(
            record, read.follower, from_offset, frames, end, now_ms
        )
        return Step(None, tuple(effects))

    def replication_state(self, topic: str) -> dict[str, Any] | None:
        """The owner's view of the topic's replication (admin, metrics, checks): None when
        the topic does not replicate here."""
        record = self._topics.get(topic)
        machine = record.log.replication if record is not None else None
        if machine is None:
            return None
        return {
            "epoch": machine.epoch,
            "high_watermark": machine.high_watermark,
            "durable_end": machine.durable_end,
            "in_sync": sorted(machine.in_sync),
            "followers": {
                name: {"acknowledged": link.acked_end, "sent": link.sent_end}
                for name, link in sorted(machine.links.items())
            },
            "deposed": machine.deposed,
        }

    # -- replication, the follower's side -------------------------------------------------------

    def replica_received(self, owner: str, msg: rm.Replicate, *, now_ms: int) -> Step[None]:
        """A `Replicate` from `owner`. A topic this broker owns itself is refused with its
        epoch (the sender is deposed), or, when the sender's epoch is higher, stops here."""
        record = self._topics.get(msg.topic)
        if record is None:
            return self.followers.received(owner, msg, now_ms)
        if msg.epoch > record.log.epoch:
            return Step(None, tuple(self.logs.replicas.deposed(record, msg.epoch)))
        answer = rm.StaleEpoch(msg.topic, record.log.epoch)
        return Step(None, (ReplicaAnswer(owner, answer),))

    def replica_epoch_end(self, topic: str, epoch: int) -> int | None:
        """Answers a follower's `AskEpochEnd`: where `epoch` ends on this owner's log (None
        when the topic is not served here with a working WAL)."""
        record = self._topics.get(topic)
        if record is None or record.wal is None or record.phase.stopped:
            return None
        starts = record.log.history.starts if record.log.history is not None else ()
        return rm.end_of_epoch(starts, epoch, record.wal.next_offset)

    def replica_epoch_answered(
        self, topic: str, epoch: int, end: int | None, *, now_ms: int
    ) -> Step[None]:
        return self.followers.epoch_answered(topic, epoch, end, now_ms)

    def epochs_saved(self, topic: str) -> Step[None]:
        """A `SaveEpochs` is durable."""
        return self.followers.epochs_saved(topic)

    def replica_released(self, topic: str, *, delete_files: bool) -> Step[None]:
        """This broker no longer follows `topic` (the replicas value says so)."""
        return self.followers.release(topic, delete_files=delete_files)
