"""The owner's side of replication in the broker core (spec/replication.md, "Data path"):
each replicated topic's `OwnerReplication` machine, fed from the topic's WAL effects, with its
effects turned into the core's.

A reliable topic at `fsync` or `flush` whose replicas value names followers replicates: every
group commit's frames go to the followers as the WAL writes them (`ReplicaSend` next to the
`Write`, so the followers' fsyncs run alongside the owner's), and
`Acknowledge` (publishes) and `Readable` (dispatch) follow the machine's high watermark
instead of the WAL's own. Without followers, or at `object` durability (acknowledged once
indexed in the object store, no peers needed), the topic behaves as before.

The frames come from the WAL machine's `Write` effects, unchanged: at most one write cycle is
in flight, a `Write` is the newest of its segment (so `segment_extent` gives its end offset)
and each `Acknowledge` covers exactly the writes made since the previous one, so the writes
seen since the last `Acknowledge` are the group commit not durable yet (`unreplicated`).

**A repair that rewinds.** A WAL failure cuts the log to what is durable, but followers may
already hold the frames cut (they were sent as written): the same epoch would then name two
different records at one offset. So a repaired log that ends below what was sent stops the
topic here (`restart`), like a deposed owner, with `TopicStopped.restart`: a cluster broker
unloads it without sealing the replica set and claims it again; that claim is a new epoch, whose
reconciliation cuts the followers by epoch (KIP-101), and a follower promoted meanwhile keeps
them (never acknowledged, as in Kafka). Kafka takes a replica offline on a log directory
failure the same way.

**Registration.** Before anything is acknowledged under its epoch, the owner records in the
replica set that it replicates under that epoch (`epochs`; one proposal of the recorded
in-sync set, retried at each tick while it does not show): until then the machine's
`AcknowledgeUpTo` and `ReadableUpTo` are held. Otherwise an owner whose followers never
caught up would acknowledge alone, die, and the load manager, seeing no sign of replication,
would hand the topic to any broker, without those records; recorded, the owner stays a
promotion candidate and the topic waits for it.

**Moves** (spec/replication.md, "Moves"). An unloading topic (rebalance, unload, drain)
goes to an in-sync follower without an upload of its tail when it can; its states, as the
unload's driver sees them (`Lifecycle.settled`, then the release flow,
`danube.machines.cluster.ownership.seal_replica_set`):

| state | event | next state |
|---|---|---|
| serving | assignment deleted (`Unload`): publishes refused, WAL sealed | unloading |
| unloading | `hand_over_ready` (below) | handing over |
| unloading | tail indexed, `in_sync` empty (a laggard was shrunk away) | sealed |
| handing over | settled at once; no in-sync proposal from now on | released |

- `hand_over_ready`: the epoch is registered, no proposal is outstanding, the recorded
  `in_sync` is not empty, the WAL is idle and the high watermark reached the log end.
- released (handed over): the files stay; the release only compares the replica set, so
  the leader promotes an active in-sync member (`replicas.hand_over_target`), which claims
  with a new epoch, continues from its log and uploads what the index lacks.
- sealed: as before issue 27, the release marks the set `sealed` and any broker may load
  the topic from the objects.

A follower that does not catch up is shrunk away by the usual lag rule, so "unloading"
never waits for ever: either the high watermark reaches the log end or the set empties and
the upload path takes over (the fallback).

The decisions (what to send, when to acknowledge, when to change the in-sync set) are the
machine's; this module only routes inputs to it and translates its effects:

| machine effect | core effect |
|---|---|
| `Send` | `ReplicaSend` |
| `ProposeInSync` | `ReplicaPropose` |
| `AcknowledgeUpTo(end)` | the topic's acknowledgement through `end - 1` |
| `ReadableUpTo(end)` | every subscription's `readable(end - 1)` |
| `ReadForResend` | `ReplicaRead` of the WAL's file range (`WalMachine.plan_frames`) |
| `NotEnoughInSync(from, end)` | `PublishFailed(from)`: UNAVAILABLE, the records stay |
| `Deposed` | the topic stops (`TopicEvent.DEPOSED`), waiting publishes fail |
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node.effects import (
    Effect,
    PublishFailed,
    ReplicaPropose,
    ReplicaRead,
    ReplicaSend,
    TopicStopped,
)
from danube.machines.node.phase import TopicEvent
from danube.machines.replication import messages as rm
from danube.machines.replication.owner import OwnerReplication
from danube.machines.wal import machine as wal

if TYPE_CHECKING:
    from danube.machines.node.records import TopicRecord
    from danube.machines.node.reliable_log import ReliableLogs

RESEND_READ_BYTES = 1 << 20
"""Largest file range one resend read asks for: the machine asks for the rest as the
follower acknowledges."""

REGISTER_RETRY_MS = 5_000
"""A registration (the proposal recording this owner's epoch) under way this long is made
again at a tick. A lost one (the store did not answer) is made again at the next tick
(`proposal_lost`); this covers one whose answer the owner ignored (a read-back older than a
value the watch brought meanwhile). Until issue 23 every tick (50 ms) made it again while it
was under way: a failover's new owner, adopting hundreds of topics at once, sent each
registration to a slow store tens of times over, and the copies kept it slow."""
REGISTER_AGAIN_MS = 250
"""A registration answered without this owner's epoch and with nothing newer than the value
it was made on (its claim refused: the read-back is that same value) is made again this long
after the answer, at a tick: made again at once, it looped on the store, one transaction per
round trip, for as long as the owner was not told it was deposed (review finding)."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The topic's replicas value as this owner read it (watch or read-back)."""

    epoch: int
    """The epoch the value was written under (the writer's claim revision)."""
    followers: tuple[str, ...]
    in_sync: tuple[str, ...]
    version: int
    """The value's mod_revision: the configuration version its changes compare."""
    replicating: bool = False
    """`epochs` names `epoch`: the owner of `epoch` recorded that it replicates, which
    makes it a promotion candidate (`danube.machines.cluster.replicas.promotion_candidates`)."""
    record: ReplicaSet | None = field(default=None, compare=False)
    """The whole value at `version`, when it was read or written here: a proposal writes on
    it without reading it first (the compare on `version` makes that safe: a value with that
    mod_revision is this one; issue 23, a failover adopting hundreds of topics)."""
    claim_gone: int | None = None
    """Read back after a proposal under this epoch was refused, at the very version that
    proposal compared: of its two compares (the claim, the value's version) the claim's
    failed, so the claim of that epoch is gone (`flows.propose_in_sync`)."""


def replica_config(record: ReplicaSet, version: int) -> ReplicaConfig:
    """A replica set read from the store (at `version`, its mod_revision) as the core
    takes it (`BrokerCore.replicas_changed`)."""
    replicating = bool(record.epochs) and record.epochs[-1][0] == record.epoch
    return ReplicaConfig(
        record.epoch, record.followers, record.in_sync, version, replicating, record
    )


def known_value(config: ReplicaConfig | None, version: int) -> ReplicaSet | None:
    """The replicas value held at `version` (a proposal's expected version), or None when
    the one held is another (the proposal then reads the store first)."""
    if config is None or config.version != version:
        return None
    return config.record


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """`cluster.replication` (spec/replication.md, "Configuration")."""

    broker_id: str = ""
    """This broker: a replicas value may name the owner among its followers for a moment
    after a promotion (until the leader replaces it); the owner skips itself."""
    lag_ms: int = 1_000
    min_in_sync: int = 1
    window_bytes: int = 8 << 20
    max_in_flight: int = 1 << 16


class OwnerReplicas:
    """Routes replication inputs to the owner machines of the topics `logs` serves."""

    def __init__(self, logs: ReliableLogs, settings: ReplicationSettings) -> None:
        self._logs = logs
        self._settings = settings

    @property
    def broker_id(self) -> str:
        return self._settings.broker_id

    # -- configuration ------------------------------------------------------------------------

    def configure(self, record: TopicRecord, config: ReplicaConfig, now_ms: int) -> list[Effect]:
        """The topic's replicas value, as read. Starts, restarts or stops its replication.
        A value older than the one held (a late read-back, or a watch event overtaken by a
        read) is ignored: taken, it would restart the machine with an in-sync set the owner
        has since changed, and an expand it made would be forgotten, letting it acknowledge
        without a member etcd records (`python -m sim --cluster --data --replicated --seed
        74`: version 199, in sync none, after 281, in sync the follower, lost 23
        acknowledged messages at the promotion)."""
        record.touch()
        state = record.log
        held = state.replica_config
        if held is not None and config.version < held.version:
            return []
        state.replica_config = config
        machine = state.replication
        me = self._settings.broker_id
        followers = sorted(f for f in config.followers if f != me)
        if machine is not None and followers == sorted(machine.links):
            effects = machine.replicas_seen(
                config.in_sync, config.version, config.epoch, claim_gone=config.claim_gone
            )
            return self._translate(record, effects, now_ms) + self._register(record, now_ms)
        return self.restart(record, now_ms)

    def _registered(self, record: TopicRecord) -> bool:
        config = record.log.replica_config
        return config is not None and config.replicating and config.epoch == record.log.epoch

    def _register(self, record: TopicRecord, now_ms: int) -> list[Effect]:
        """Records this owner's epoch in the replica set, once; releases what was held back
        once it shows."""
        state = record.log
        machine = state.replication
        if machine is None:
            return []
        if self._registered(record):
            state.registering = False
            held, state.held_end = state.held_end, 0
            if not held:
                return []
            return [
                *self._logs.acknowledge(record, held - 1, now_ms),
                *self._logs.make_readable(record, held - 1, now_ms),
                *self._logs.release_sealed(record, held, now_ms),
            ]
        if state.registering or machine.deposed or state.replica_config is None:
            return []
        state.registering = True
        state.registering_since = now_ms
        config = state.replica_config
        state.registering_on = config.version
        proposal = rm.ProposeInSync(
            record.name.full, machine.epoch, tuple(config.in_sync), config.version
        )
        known = known_value(config, config.version)
        return [ReplicaPropose(proposal, self._epoch_start(record), known)]

    def restart(self, record: TopicRecord, now_ms: int) -> list[Effect]:
        """(Re)creates the topic's machine from its replicas value and its WAL as loaded: at
        load, after a repair, when the followers changed. The new machine probes every
        follower; the high watermark never goes back (what was acknowledged stays so). A
        topic without followers (one broker left) runs one too: it registers its epoch, so
        that its loss makes the topic wait for this broker instead of going to another
        without the records acknowledged here."""
        record.touch()
        state = record.log
        config = state.replica_config
        log = record.wal
        old = state.replication
        followers = (
            sorted(f for f in config.followers if f != self._settings.broker_id)
            if (config is not None)
            else []
        )
        if (
            old is not None
            and log is not None
            and old.epoch == state.epoch
            and old.written_end > log.next_offset
        ):
            return self._rewound(record, old.written_end, log.next_offset)
        if config is None or log is None or state.object_ack:
            state.replication = None
            if old is not None and log is not None:
                # Replication stopped: what is durable here is all this topic waits for now.
                end = log.readable_offset
                return self._released(record, end, now_ms)
            return []
        hw = old.high_watermark if old is not None else self._logs.indexed_end(record)
        settings = self._settings
        machine = state.replication = OwnerReplication(
            record.name.full,
            state.epoch,
            durable_end=log.readable_offset,
            high_watermark=hw,
            followers=followers,
            in_sync=config.in_sync,
            version=config.version,
            lag_ms=settings.lag_ms,
            min_in_sync=settings.min_in_sync,
            window_bytes=settings.window_bytes,
            max_in_flight=settings.max_in_flight,
            now_ms=now_ms,
        )
        effects = machine.start(now_ms)
        effects += self._push(record, now_ms)  # a write under way: its frames go out too
        effects += machine.replicas_seen(config.in_sync, config.version, config.epoch)
        return self._translate(record, effects, now_ms) + self._register(record, now_ms)

    def _released(self, record: TopicRecord, end: int, now_ms: int) -> list[Effect]:
        if end <= 0:
            return []
        out = self._logs.acknowledge(record, end - 1, now_ms)
        out.extend(self._logs.make_readable(record, end - 1, now_ms))
        out.extend(self._logs.release_sealed(record, end, now_ms))
        return out

    # -- inputs -------------------------------------------------------------------------------

    def written(self, record: TopicRecord, write: wal.Write, now_ms: int) -> list[Effect]:
        """The WAL is writing `write` (the effect was just emitted): its frames go to the
        followers now, in parallel with the owner's write and fsync."""
        state, log = record.log, record.wal
        if log is None:
            return []
        end, _ = log.segment_extent(write.segment_base)
        state.unreplicated.append((end, write.data))
        return self._push(record, now_ms)

    def _push(self, record: TopicRecord, now_ms: int) -> list[Effect]:
        """Reports to the machine the writes it has not seen (all of them when it was
        started while they were under way): contiguous from its written end."""
        state = record.log
        machine = state.replication
        if machine is None:
            return []
        pending = [(end, data) for end, data in state.unreplicated if end > machine.written_end]
        if not pending:
            return []
        frames = b"".join(data for _, data in pending)
        return self._translate(record, machine.written(pending[-1][0], frames, now_ms), now_ms)

    def durable(self, record: TopicRecord, through: int, now_ms: int) -> list[Effect]:
        """The WAL acknowledged offsets ≤ `through` locally: they count for the high
        watermark (the followers were sent them as they were written)."""
        record.touch()
        state = record.log
        machine = state.replication
        assert machine is not None
        effects = self._push(record, now_ms)
        state.unreplicated = [(e, d) for e, d in state.unreplicated if e > through + 1]
        effects.extend(self._translate(record, machine.durable(through + 1, b"", now_ms), now_ms))
        return effects

    def answered(self, record: TopicRecord, follower: str, answer: rm.FollowerAnswer,
                 now_ms: int) -> list[Effect]:  # fmt: skip
        record.touch()
        machine = record.log.replication
        if machine is None:
            return []
        if isinstance(answer, rm.Replicated):
            effects = machine.replicated(follower, answer, now_ms)
        elif isinstance(answer, rm.Mismatch):
            effects = machine.mismatch(follower, answer, now_ms)
        else:
            effects = machine.stale_epoch(follower, answer)
        return self._translate(record, effects, now_ms)

    def broke(self, record: TopicRecord, follower: str, now_ms: int) -> list[Effect]:
        record.touch()
        machine = record.log.replication
        if machine is None or follower not in machine.links:
            return []
        return self._translate(record, machine.stream_broke(follower, now_ms), now_ms)

    def frames_read(self, record: TopicRecord, follower: str, from_offset: int, frames: bytes,
                    end: int, now_ms: int) -> list[Effect]:  # fmt: skip
        record.touch()
        machine = record.log.replication
        if machine is None:
            return []
        effects = machine.frames_read(follower, from_offset, frames, end, now_ms)
        return self._translate(record, effects, now_ms)

    def proposal_lost(self, record: TopicRecord) -> list[Effect]:
        """A proposal's flow failed before any read-back (the store did not answer): made
        again at the next tick, so the topic is touched (`next_due`)."""
        record.touch()
        machine = record.log.replication
        record.log.registering = False
        return [] if machine is None else self._translate(record, machine.proposal_lost(), 0)

    def next_due(self, record: TopicRecord) -> int | None:
        """When `tick` next has something to do for the topic (a lower bound; 0: at the next
        tick), None when only an input can give it work: every input above touches the topic
        (`TopicRecord.touch`), so the broker ticks a replicated topic only then or at this
        deadline (issue 23 point 4). The earliest of the machine's own
        (`OwnerReplication.next_timer_ms`) and the registration's: made at once when due and
        not under way, made again `REGISTER_RETRY_MS` after it went out."""
        state = record.log
        machine = state.replication
        if machine is None or state.handing_over:
            return None
        due = machine.next_timer_ms
        if self._registered(record) or machine.deposed or state.replica_config is None:
            return due
        at = state.registering_since + REGISTER_RETRY_MS if state.registering else 0
        return at if due is None or at < due else due

    def tick(self, record: TopicRecord, now_ms: int) -> list[Effect]:
        machine = record.log.replication
        if machine is None or record.log.handing_over:
            return []
        state = record.log
        if state.registering and now_ms - state.registering_since >= REGISTER_RETRY_MS:
            state.registering = False  # its answer went astray: made again
        return self._translate(record, machine.tick(now_ms), now_ms) + self._register(
            record, now_ms
        )

    def hand_over_ready(self, record: TopicRecord) -> bool:
        """An unloading topic may go to an in-sync follower without uploading its tail
        (spec/replication.md, "Moves"): this owner registered its epoch, no in-sync
        proposal is outstanding, the recorded in-sync set is not empty, the WAL is idle
        (publishes are refused) and the high watermark reached its durable end, so every
        publish was acknowledged and every in-sync member holds the whole log. The owner
        replicates as usual meanwhile; a follower that does not catch up within `lag_ms`
        is shrunk away, and with the set empty the move takes the upload path."""
        state, log = record.log, record.wal
        machine = state.replication
        if machine is None or log is None or machine.deposed or not self._registered(record):
            return False
        if machine.pending is not None or not machine.in_sync or state.held_end:
            return False
        return log.idle and machine.high_watermark >= log.readable_offset

    # -- effects ------------------------------------------------------------------------------

    def _translate(
        self, record: TopicRecord, effects: Iterable[rm.OwnerEffect], now_ms: int
    ) -> list[Effect]:
        topic = record.name.full
        out: list[Effect] = []
        for effect in effects:
            if isinstance(effect, rm.Send):
                out.append(ReplicaSend(effect.follower, effect.message))
            elif isinstance(effect, rm.AcknowledgeUpTo):
                if not self._registered(record):  # held until the epoch shows (`_register`)
                    record.log.held_end = max(record.log.held_end, effect.end)
                    continue
                out.extend(self._logs.acknowledge(record, effect.end - 1, now_ms))
                out.extend(self._logs.release_sealed(record, effect.end, now_ms))
            elif isinstance(effect, rm.ReadableUpTo):
                if self._registered(record):
                    out.extend(self._logs.make_readable(record, effect.end - 1, now_ms))
            elif isinstance(effect, rm.ProposeInSync):
                if not record.log.handing_over:  # the set the hand-over relies on stays
                    known = known_value(record.log.replica_config, effect.expected_version)
                    out.append(ReplicaPropose(effect, self._epoch_start(record), known))
            elif isinstance(effect, rm.ReadForResend):
                out.extend(self._plan_resend(record, effect, now_ms))
            elif isinstance(effect, rm.NotEnoughInSync):
                reason = (
                    f"{topic}: fewer in-sync replicas than the "
                    f"{self._settings.min_in_sync} required"
                )
                out.append(PublishFailed(topic, effect.from_offset, reason))
            elif isinstance(effect, rm.Deposed):
                out.extend(self.deposed(record, effect.epoch))
        return out

    @staticmethod
    def _epoch_start(record: TopicRecord) -> int:
        history, epoch = record.log.history, record.log.epoch
        starts = [start for e, start in (history.starts if history else ()) if e == epoch]
        return starts[-1] if starts else 0

    def _plan_resend(
        self, record: TopicRecord, effect: rm.ReadForResend, now_ms: int
    ) -> list[Effect]:
        log = record.wal
        machine = record.log.replication
        if log is None or machine is None:
            return []
        plan = log.plan_frames(effect.from_offset, RESEND_READ_BYTES)
        if isinstance(plan, wal.FileRead):
            return [ReplicaRead(record.name.full, effect.follower, plan)]
        if isinstance(plan, wal.NotRetained):
            gone = machine.resend_unavailable(effect.follower, plan.first_offset, now_ms)
            return self._translate(record, gone, now_ms)
        return []  # nothing durable past `from_offset`: the machine asks only below it

    def _rewound(self, record: TopicRecord, sent: int, end: int) -> list[Effect]:
        """A repair cut the log to `end` below `sent`, what the followers may hold under
        this epoch: the topic stops here and asks to be claimed again, which makes a new
        epoch the followers reconcile by (module docstring, "A repair that rewinds")."""
        topic = record.name.full
        record.log.replication = None
        if record.phase.stopped:
            return []
        record.stop_reason = reason = (
            f"{topic}: the write-ahead log was repaired to offset {end} after offsets up to "
            f"{sent} went to the followers; serving again needs a new epoch"
        )
        record.advance(TopicEvent.DEPOSED)
        return [TopicStopped(topic, reason, restart=True)]

    def deposed(self, record: TopicRecord, epoch: int) -> list[Effect]:
        """A higher epoch than this owner's exists: the topic stops here, acknowledging
        nothing more; its replication machine is dropped."""
        topic = record.name.full
        if epoch == record.log.epoch:  # `ReplicaConfig.claim_gone`
            reason = f"deposed: the claim of epoch {epoch} on {topic} is gone"
        else:
            reason = f"deposed: another broker owns {topic} now (epoch {epoch})"
        if record.phase.stopped:
            return []
        record.stop_reason = reason
        record.log.replication = None
        record.advance(TopicEvent.DEPOSED)
        return [TopicStopped(topic, reason)]
