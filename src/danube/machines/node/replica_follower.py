"""The follower's side of replication in the broker core (spec/replication.md): for each topic
another broker owns and replicates here, its `FollowerLog` machine and a WAL machine of its
own on this broker's disk, in the directory the topic would have as an owner, so that a
promotion finds its log there (`BrokerCore.adopt` with `keep_local`).

A replica is created by the first `Replicate` for the topic: its directory is recovered
(`LoadWal`, with the epochs file: `danube.effects.EpochHistory`) and the messages that arrive
meanwhile wait. Then each message goes to the `FollowerLog`, whose effects this module carries
out:

| follower effect | carried out as |
|---|---|
| `AppendFrames` | `WalMachine.append_frames` (verified; a refused send answers `Mismatch`) |
| WAL `Acknowledge` | `FollowerLog.appended_durable`, whose `Replicated` goes to the owner |
| `TruncateTo(end)` | `CutWal`: the WAL is cut and recovered; messages wait meanwhile |
| `RecordEpoch` | `SaveEpochs` in order with the WAL's file effects; answers made before |
|  | it is durable wait for it (`epochs_saved`), so no answer tells an owner |
|  | something a crash could make this follower forget |
| `Reconcile` | `AskEpochEnd` to the owner, one at a time per topic |
| `Replicated` / `Mismatch` / `StaleEpoch` | `ReplicaAnswer` to the owner that sent |

A replica serves no client and uploads nothing; `release` ends it (the topic was promoted
here, or this broker no longer follows it), its files kept or deleted.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from danube.effects import EpochHistory
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.memory.ledger import CacheLedger
from danube.machines.node.effects import (
    AskEpochEnd,
    CutWal,
    DropWal,
    Effect,
    LoadWal,
    ReplicaAnswer,
    SaveEpochs,
    Step,
    WalIo,
)
from danube.machines.replication import messages as rm
from danube.machines.replication.follower import FollowerLog
from danube.machines.wal import machine as wal
from danube.machines.wal.recovery import RecoveryPlan
from danube.values.errors import DanubeError

_FILE_EFFECTS = (wal.CreateSegment, wal.Write, wal.Fsync, wal.CloseSegment, wal.DeleteSegment)


@dataclass(slots=True)
class Replica:
    """One topic replicated to this broker."""

    topic: str
    owner: str
    """The broker whose `Replicate` came last: answers go to it."""
    machine: FollowerLog | None = None
    """None while the directory loads or is cut."""
    wal: wal.WalMachine | None = None
    history: EpochHistory = field(default_factory=lambda: EpochHistory(0, ()))
    """The epochs as last written (or being written)."""
    inbox: deque[tuple[str, rm.Replicate]] = field(default_factory=deque)
    """Messages that arrived while the log was loading or being cut."""
    saving: int = 0
    """Epochs writes under way: answers wait for them."""
    held: list[Effect] = field(default_factory=list)
    asking: bool = False
    """An `AskEpochEnd` is under way."""
    stopped: str | None = None
    """Why this replica stopped (its directory failed to load): it answers nothing."""


class FollowerReplicas:
    """Every replica this broker holds. Single-threaded, like the core."""

    def __init__(self, wal_config: wal.WalConfig, cache_ledger: CacheLedger | None = None) -> None:
        self.cache_ledger = cache_ledger
        self._wal_config = dataclasses.replace(
            wal_config, durability=wal.Durability.FSYNC, synced_writes=True
        )
        self.replicas: dict[str, Replica] = {}

    def serves(self, topic: str) -> bool:
        return topic in self.replicas

    # -- inputs ----------------------------------------------------------------------------

    def received(self, owner: str, msg: rm.Replicate, now_ms: int) -> Step[None]:
        """A `Replicate` from `owner`."""
        replica = self.replicas.get(msg.topic)
        if replica is None:
            replica = self.replicas[msg.topic] = Replica(msg.topic, owner)
            replica.inbox.append((owner, msg))
            return Step(None, (LoadWal(msg.topic, fresh=False),))
        if replica.stopped is not None:
            return Step(None)
        if replica.machine is None or replica.wal is None:  # loading, or being cut
            replica.inbox.append((owner, msg))
            return Step(None)
        return Step(None, tuple(self._feed(replica, owner, msg, now_ms)))

    def wal_loaded(self, topic: str, plan: RecoveryPlan, now_ms: int) -> Step[None]:
        """The replica's directory was recovered (first load, or after a cut)."""
        replica = self.replicas[topic]
        history = plan.epochs if plan.epochs is not None else replica.history
        replica.history = history
        wal.release(replica.wal)
        log = replica.wal = wal.WalMachine(
            topic, self._wal_config, plan, cache_ledger=self.cache_ledger
        )
        if replica.machine is None:
            replica.machine = FollowerLog.recovered(
                topic,
                epoch=history.seen,
                durable_end=log.next_offset,
                epoch_starts=history.starts,
            )
        out: list[Effect] = []
        while replica.inbox and replica.machine is not None and replica.wal is not None:
            owner, msg = replica.inbox.popleft()
            out.extend(self._feed(replica, owner, msg, now_ms))
        return Step(None, tuple(out))

    def wal_load_failed(self, topic: str, reason: str) -> Step[None]:
        """The replica's directory does not recover: it answers nothing (its owner shrinks
        it away) until an operator acts; this broker's other topics go on."""
        replica = self.replicas[topic]
        replica.stopped = reason
        replica.inbox.clear()
        return Step(None)

    def wal_io_done(
        self, topic: str, effect: wal.Effect, error: str | None, now_ms: int
    ) -> Step[None]:
        replica = self.replicas[topic]
        log = replica.wal
        if log is None:
            return Step(None)
        effects = log.io_done(effect, error, now_ms)
        return Step(None, tuple(self._wal_effects(replica, effects, now_ms)))

    def epochs_saved(self, topic: str) -> Step[None]:
        """A `SaveEpochs` is durable: the answers that waited for it go."""
        replica = self.replicas.get(topic)
        if replica is None:
            return Step(None)
        replica.saving -= 1
        if replica.saving:
            return Step(None)
        held, replica.held = replica.held, []
        return Step(None, tuple(held))

    def epoch_answered(self, topic: str, epoch: int, end: int | None, now_ms: int) -> Step[None]:
        """The owner's answer to `AskEpochEnd` (None: no answer, asked again later)."""
        replica = self.replicas.get(topic)
        if replica is None or replica.machine is None:
            return Step(None)
        replica.asking = False
        if end is None:
            return Step(None)
        return Step(None, tuple(self._carry(replica, replica.machine.new_epoch(epoch, end),
                                            now_ms)))  # fmt: skip

    def release(self, topic: str, *, delete_files: bool) -> Step[None]:
        """This broker stops following `topic`: promoted here (the files stay for the owner's
        load) or no longer a follower (they go)."""
        replica = self.replicas.pop(topic, None)
        if replica is None:
            return Step(None)
        wal.release(replica.wal)
        return Step(None, (DropWal(topic, "no longer a replica here", delete_files),))

    def durable_end(self, topic: str) -> int | None:
        replica = self.replicas.get(topic)
        return replica.wal.durable_offset if replica and replica.wal else None

    # -- carrying out ----------------------------------------------------------------------

    def _feed(self, replica: Replica, owner: str, msg: rm.Replicate, now_ms: int) -> list[Effect]:
        replica.owner = owner
        assert replica.machine is not None
        return self._carry(replica, replica.machine.replicate(msg), now_ms)

    def _carry(
        self, replica: Replica, effects: Iterable[rm.FollowerEffect], now_ms: int
    ) -> list[Effect]:
        out: list[Effect] = []
        machine = replica.machine
        assert machine is not None
        for effect in effects:
            if isinstance(effect, rm.AppendFrames):
                out.extend(self._append(replica, effect, now_ms))
            elif isinstance(effect, rm.TruncateTo):
                # The log is cut and recovered; the rest waits for that (`wal_loaded`).
                wal.release(replica.wal)
                replica.wal = None
                out.append(CutWal(replica.topic, effect.end))
            elif isinstance(effect, rm.RecordEpoch):
                history = replica.history
                starts = history.starts
                if effect.start is not None:  # reconciled: the machine's starts are current
                    starts = tuple(machine.epoch_starts)
                replica.history = EpochHistory(max(history.seen, effect.epoch), starts)
                replica.saving += 1
                out.append(SaveEpochs(replica.topic, replica.history))
            elif isinstance(effect, rm.Reconcile):
                if not replica.asking:
                    replica.asking = True
                    out.append(
                        AskEpochEnd(replica.owner, replica.topic, effect.epoch, effect.last_epoch)
                    )
            else:
                answer = ReplicaAnswer(replica.owner, effect)
                if replica.saving:
                    replica.held.append(answer)
                else:
                    out.append(answer)
        return out

    def _append(self, replica: Replica, effect: rm.AppendFrames, now_ms: int) -> list[Effect]:
        log = replica.wal
        machine = replica.machine
        assert machine is not None
        if log is None:  # not reached: messages wait in the inbox while there is no WAL
            return self._carry(replica, machine.append_refused(effect.end, effect.prev_end),
                               now_ms)  # fmt: skip
        try:
            end, effects = log.append_frames(effect.frames, now_ms)
        except DanubeError:
            # Frames that do not verify (damaged on the way): nothing is stored, and the
            # owner resends from where this log really ends.
            return self._carry(replica, machine.append_refused(effect.end, log.next_offset),
                               now_ms)  # fmt: skip
        assert end == effect.end, (end, effect.end)
        return self._wal_effects(replica, effects, now_ms)

    def _wal_effects(
        self, replica: Replica, effects: Iterable[wal.Effect], now_ms: int
    ) -> list[Effect]:
        io: list[wal.Effect] = []
        out: list[Effect] = []
        machine = replica.machine
        for effect in effects:
            if isinstance(effect, _FILE_EFFECTS):
                io.append(effect)
            elif isinstance(effect, wal.Acknowledge) and machine is not None:
                answers = machine.appended_durable(effect.through_offset + 1)
                out.extend(self._carry(replica, answers, now_ms))
            elif isinstance(effect, wal.Failed):
                # The disk failed under the replica: stop it (the owner shrinks it away).
                wal.release(replica.wal)
                replica.wal = None
                replica.stopped = effect.reason
        if io:
            out.insert(0, WalIo(replica.topic, tuple(io)))
        return out


def still_follows(me: str, record: ReplicaSet | None, assigned_here: bool) -> bool:
    """Whether this broker keeps its replica of a topic given the replica set the watch
    shows (None: deleted or unreadable): while the set names it as owner, follower or in
    sync, or the topic is assigned here. A follower being promoted is dropped from
    `followers` while it claims the topic (its directory is then the log it loads); a
    follower the leader replaced stays in `in_sync`, a promotion candidate, until the owner
    shrinks it away. Otherwise the replica and its files go."""
    if assigned_here:
        return True
    if record is None:
        return False
    return me in record.followers or me in record.in_sync or record.owner == me
