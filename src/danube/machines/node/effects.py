"""The broker core's vocabulary towards its drivers: the effects every `BrokerCore` step may
yield, the `Step` that carries them, and the plain values its answers hold. Kept apart from
the machines so a driver (broker runtime, simulator, tests) imports the words it executes
without the decisions that produce them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from danube.effects import EpochHistory
from danube.machines.dispatch import ConsumerReady
from danube.machines.replication.messages import FollowerAnswer, ProposeInSync, Replicate
from danube.machines.tiering import reader as tier_reader
from danube.machines.tiering import uploader as tier
from danube.machines.wal import machine as wal
from danube.machines.wal import records
from danube.metadata.model import Delete, DeletePrefix, Op, Put
from danube.values.frozen import fast_init

if TYPE_CHECKING:
    from danube.machines.cluster.replicas import ReplicaSet

T = TypeVar("T")


@fast_init
@dataclass(frozen=True, slots=True)
class PersistMeta:
    """Effect: one atomic metadata change. The driver applies it, durably, before it executes
    any later effect or answers the request that caused it."""

    puts: tuple[tuple[str, Any], ...] = ()
    deletes: tuple[str, ...] = ()
    delete_prefixes: tuple[str, ...] = ()

    @property
    def keys(self) -> list[str]:
        """Every key (or prefix) the change touches: what its fence compares cover."""
        return [*self.delete_prefixes, *self.deletes, *(key for key, _ in self.puts)]

    def ops(self) -> list[Op]:
        """The change as store operations, in the order a store applies them."""
        return [
            *(DeletePrefix(prefix) for prefix in self.delete_prefixes),
            *(Delete(key) for key in self.deletes),
            *(Put(key, value) for key, value in self.puts),
        ]

    def apply_to(self, metadata: dict[str, Any]) -> None:
        """Applies the change to an in-memory key/value map in the order a store applies
        it (prefix deletes, deletes, puts): for drivers without a store (simulator, tests)."""
        for prefix in self.delete_prefixes:
            for key in [k for k in metadata if k.startswith(prefix)]:
                del metadata[key]
        for key in self.deletes:
            metadata.pop(key, None)
        for key, value in self.puts:
            metadata[key] = value


@fast_init
@dataclass(frozen=True, slots=True)
class EndStream:
    """Effect: finish the consumer's receive stream of this generation (status OK)."""

    consumer_id: int
    generation: int


@fast_init
@dataclass(frozen=True, slots=True)
class LoadWal:
    """Effect: recover the reliable topic's WAL directory (after deleting what is in it when
    `fresh`: a topic created now owns no data) and report with `wal_loaded` or
    `wal_load_failed`. Replies to the request that caused it wait for that."""

    topic: str
    fresh: bool


@fast_init
@dataclass(frozen=True, slots=True)
class RepairWal:
    """Effect: the topic's WAL failed an I/O (`danube.machines.wal.machine.Failed`). Discard its
    file effects not yet started, truncate the segment to `truncate_to` bytes and fsync it, then
    recover as `LoadWal(topic, fresh=False)` does (or report `wal_load_failed`)."""

    topic: str
    segment_base: int
    truncate_to: int


@fast_init
@dataclass(frozen=True, slots=True)
class DropWal:
    """Effect: the topic is gone from this broker (deleted, moved away, or its ownership
    lost): fail the publishes still waiting with `reason`, stop its WAL I/O and, when
    `delete_files`, delete its directory."""

    topic: str
    reason: str
    delete_files: bool = True
    delete_objects: bool = False
    """The topic was deleted: its uploaded objects go too (after the WAL stops, before a
    topic created again under the name can upload)."""


@fast_init
@dataclass(frozen=True, slots=True)
class WalIo:
    """Effect: the topic's WAL file effects, to perform in order after those submitted
    before (spec/durability.md, driver contract); report each with `wal_io_done`."""

    topic: str
    effects: tuple[wal.Effect, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class ReadWal:
    """Effect: read a file range for a subscription and report with `wal_read_done` (or
    `wal_read_failed`)."""

    topic: str
    subscription: str
    epoch: int
    plan: wal.FileRead


@fast_init
@dataclass(frozen=True, slots=True)
class ReadObject:
    """Effect: fetch an object byte range for a subscription, decode it with
    `danube.machines.tiering.decode_object_read` and report with `wal_read_done` (or
    `wal_read_failed`)."""

    topic: str
    subscription: str
    epoch: int
    plan: tier_reader.ObjectRead


@fast_init
@dataclass(frozen=True, slots=True)
class TierIo:
    """Effect: an uploader effect for the object-store driver (`UploadSegment`,
    `CommitIndex`, `ListObjects`, `DeleteObject`); report with the `tier_*` inputs, passing
    this effect back. `uploader` names the uploader that asked: in cluster mode a topic can
    leave and come back while an answer is on its way, and the old uploader's answer must not
    reach the new one (it expects other work and could index another's object)."""

    topic: str
    effect: tier.UploadSegment | tier.CommitIndex | tier.ListObjects | tier.DeleteObject
    uploader: int


@fast_init
@dataclass(frozen=True, slots=True)
class TierHalted:
    """Effect: the topic's uploads stopped (log it). `resumable`: the cause is outside (the
    store, credentials); a restart of the broker resumes (an admin resume comes with the
    admin API)."""

    topic: str
    reason: str
    resumable: bool


@fast_init
@dataclass(frozen=True, slots=True)
class PublishAcked:
    """Effect: every publish to the topic with an offset up to `through_offset` may be
    answered with success."""

    topic: str
    through_offset: int


@fast_init
@dataclass(frozen=True, slots=True)
class PublishFailed:
    """Effect: publishes to the topic with an offset from `from_offset` on were not stored
    (or not as far as anyone can tell); answer them with UNAVAILABLE so producers retry."""

    topic: str
    from_offset: int
    reason: str


@fast_init
@dataclass(frozen=True, slots=True)
class TopicStopped:
    """Effect: the topic cannot serve until an operator acts (say so in the log); waiting
    publishes fail. `restart`: a cluster broker unloads it and claims it again, under a new
    epoch (a repair rewound a replicated owner's log below what its followers may hold:
    spec/replication.md, "A repair that rewinds")."""

    topic: str
    reason: str
    restart: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class PolicyDropped:
    """Effect: the subscription's poison policy (Drop, or an operator's skip of a blocked
    message) skipped `offset` after `attempts` failed deliveries: it counts as acknowledged
    for the subscription. Logged; the simulator's checker counts it as settled by policy."""

    topic: str
    subscription: str
    offset: int
    attempts: int


@fast_init
@dataclass(frozen=True, slots=True)
class DeadLetterPublish:
    """Effect: the dead letter of `origin`/`subscription`'s `offset` was appended to
    `topic` at `through` (or could not be: `failure`). The driver waits until the topic
    acknowledges `through` at its durability level, or loses it, and reports either to
    `BrokerCore.dead_letter_done`; only a stored dead letter lets the cursor pass the
    original (spec/failure-policies.md). Carried out before the append's own effects, so no
    acknowledgement slips past the wait."""

    topic: str
    through: int
    origin: str
    subscription: str
    epoch: int
    """The subscription's incarnation the answer is for (a rebuilt one asks again)."""
    offset: int
    attempts: int
    failure: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class ForwardDeadLetter:
    """Effect (I/O, cluster mode): publish the dead letter `record` to `publish.topic`,
    which another broker serves (or nobody yet), as an internal producer through the
    cluster's own redirect (lookup, then the owner), and answer once the owner stored it
    at its durability level (answer None) or could not (an error). The interpreter reports
    either to `BrokerCore.dead_letter_done` as for a local `DeadLetterPublish`; a failure is
    asked again after the policy's backoff (spec/failure-policies.md)."""

    publish: DeadLetterPublish
    record: records.Record


@fast_init
@dataclass(frozen=True, slots=True)
class RetentionSkipped:
    """Effect: retention deleted offsets [`first`, `end`) before the subscription read them:
    they are lost to it (log it; a later issue makes retention wait for tiering)."""

    topic: str
    subscription: str
    first: int
    end: int


@fast_init
@dataclass(frozen=True, slots=True)
class ReplicaSend:
    """Effect: send `message` (one group commit's frames unchanged, or a probe) to `follower`
    on the replication stream, after every earlier send to it. Its answers come back through
    `BrokerCore.replica_answered`; a stream that broke (sends may be lost) through
    `BrokerCore.replica_stream_broke` (spec/replication.md, "Data path")."""

    follower: str
    message: Replicate


@fast_init
@dataclass(frozen=True, slots=True)
class ReplicaPropose:
    """Effect: record `proposal.in_sync` as the topic's in-sync set with a transaction fenced
    on the owner's claim and the replicas value's version (`danube.interpreter.flows`), and
    call `BrokerCore.replicas_changed` with the value written (committed) or read back."""

    proposal: ProposeInSync
    epoch_start: int = 0
    """Where the owner's epoch starts in its log: the replica set's `epochs` gains it with
    the first change under this epoch, which tells the load manager that this owner
    replicates (its acknowledged tail may lie on it alone: it is a promotion candidate)."""
    known: ReplicaSet | None = None
    """The replicas value at `proposal.expected_version` as the owner holds it: the flow
    writes on it without reading it first, and takes a committed write as the new value
    without reading it back (issue 23: two reads per topic a failover adopts)."""


@fast_init
@dataclass(frozen=True, slots=True)
class ReplicaRead:
    """Effect: read the raw frames `plan` names from the topic's WAL (a follower behind the
    owner's window of recent frames) and call `BrokerCore.replica_frames_read` with
    `danube.machines.wal.machine.frames_of_file_read` of the bytes, or
    `BrokerCore.replica_read_failed`."""

    topic: str
    follower: str
    plan: wal.FileRead


@fast_init
@dataclass(frozen=True, slots=True)
class ReplicaAnswer:
    """Effect (follower): send `answer` to `owner` on the replication stream it came from."""

    owner: str
    answer: FollowerAnswer


@fast_init
@dataclass(frozen=True, slots=True)
class AskEpochEnd:
    """Effect (follower): ask `owner` where `last_epoch` ends on its log of `topic`
    (`BrokerCore.replica_epoch_end` there) and call `BrokerCore.replica_epoch_answered`
    with the answer for `epoch`, or `replica_epoch_unanswered` when none came."""

    owner: str
    topic: str
    epoch: int
    last_epoch: int


@fast_init
@dataclass(frozen=True, slots=True)
class SaveEpochs:
    """Effect: write the topic's epochs file (`danube.effects.WriteEpochs`) in order with
    its WAL file effects, then call `BrokerCore.epochs_saved`."""

    topic: str
    history: EpochHistory


@fast_init
@dataclass(frozen=True, slots=True)
class CutWal:
    """Effect (follower): once the topic's file effects under way are done, cut its WAL to
    offsets < `end` (`danube.machines.wal.recovery.plan_cut`), recover it and report with
    `wal_loaded` (or `wal_load_failed`)."""

    topic: str
    end: int


Effect = (
    PersistMeta
    | ConsumerReady
    | EndStream
    | LoadWal
    | RepairWal
    | DropWal
    | WalIo
    | ReadWal
    | ReadObject
    | TierIo
    | TierHalted
    | PublishAcked
    | PublishFailed
    | TopicStopped
    | RetentionSkipped
    | PolicyDropped
    | ForwardDeadLetter
    | ReplicaSend
    | ReplicaPropose
    | ReplicaRead
    | ReplicaAnswer
    | AskEpochEnd
    | SaveEpochs
    | CutWal
)


@fast_init
@dataclass(frozen=True, slots=True)
class Step(Generic[T]):
    value: T
    effects: tuple[Effect, ...] = ()


@fast_init
@dataclass(frozen=True, slots=True)
class BatchPublished:
    """Where a published batch went: message i has offset `first_offset` + i."""

    first_offset: int
    count: int
    stored: bool
    """Reliable topic: the answer waits for a `PublishAcked` covering `last_offset`;
    otherwise the messages were delivered and the answer is due at once."""

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.count - 1


@fast_init
@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    broker_url: str
    connect_url: str
