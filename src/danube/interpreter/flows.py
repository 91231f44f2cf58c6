"""One flow per kind of core effect: every decision about carrying an effect out.

Each flow is a generator (`danube.effects.flow`) yielding `danube.effects` values (and the
interpreter's own `Exclusive`/`FilesIdle`); the port answers. The flows return what the core
must hear, as a `Report` of the core input to call; the interpreter makes that call. What used
to be written three times (runtime, simulator, test driver) is written here once: the order of
a recovery, what a failed read means, how long an object read retries, how an upload failure
is classified, how an unknown index commit is resolved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from danube.effects import (
    EMPTY_SCAN,
    Backoff,
    CloseTopicFiles,
    ObjectDelete,
    ObjectFailure,
    ObjectGet,
    ObjectList,
    ObjectPut,
    ObjectStoreFailed,
    Outcome,
    ReadTopicFile,
    RecoverTopic,
    RemoveTopicFiles,
    ScanTopic,
    Sleep,
    StoreRead,
    StoreTxn,
    TopicScan,
    TruncateTopicFile,
    TxnAnswer,
    Work,
)
from danube.effects.flow import Flow
from danube.interpreter.requests import FilesIdle
from danube.keys import owner_key, replicas_key
from danube.machines.cluster.replicas import ReplicaSet, ReplicaSetError
from danube.machines.node.effects import DropWal
from danube.machines.node.replica_owner import ReplicaConfig, replica_config
from danube.machines.replication.messages import ProposeInSync
from danube.machines.tiering import (
    CommitIndex,
    ObjectRead,
    StoredObject,
    UploadError,
    UploadSegment,
    decode_object_read,
    describe_object,
)
from danube.machines.tiering import layout as tier_layout
from danube.machines.wal import recovery
from danube.machines.wal.format import WalFormatError
from danube.machines.wal.machine import FileRead, decode_file_read, frames_of_file_read
from danube.metadata.model import Compare, KeyValue, Put
from danube.values.frozen import fast_init
from danube.values.names import parse_topic

OBJECT_READ_BACKOFF = Backoff(first_ms=200, cap_ms=5_000, attempts=None)
"""The decided policy for history reads from the object store (spec/effects.md): a store
that fails is retried for as long as it fails (pauses doubling from 200 ms to 5 s); only
bytes that do not verify stop the topic. A stopped topic is for data that is wrong, not for
a store that is down for a while. (The simulator used to give up after 6 attempts: a policy
production never had.)"""


@fast_init
@dataclass(frozen=True, slots=True)
class ReadOutcome:
    """What a WAL or object read tells the core: the records, or why not."""

    records: tuple[bytes, ...] = ()
    failure: str | None = None
    missing: bool = False


# -- recovery --------------------------------------------------------------------------------


def recover(
    topic: str,
    evidence: Callable[[], tuple[int, int]],
    *,
    fresh: bool = False,
    repair: tuple[int, int] | None = None,
    now_ms: Callable[[], int],
    align: bool = False,
) -> Flow[recovery.RecoveryPlan]:
    """Loads (or repairs) a topic's WAL directory: for a repair, waits for the file effect
    under way and cuts the failed segment (`repair` = (segment base, size)); a fresh topic's
    leftovers are removed. Then scans, plans with the core's evidence (`evidence()` gives
    `recovery_evidence`: read now, after the repair) and the scan's checkpoint and
    `accept-loss` file, and carries the plan out, marking the recovered end in the
    checkpoint (the kept segments are durable now). Raises `CorruptSegment` when durable data
    changed or is missing, `OSError` when the directory fails."""
    if repair is not None:
        yield FilesIdle(topic)
        yield TruncateTopicFile(topic, repair[0], repair[1])
    if fresh and repair is None:
        # A fresh topic owns no data: its leftovers go and the directory is made again in
        # one effect, whose scan is known (empty) without asking the disk (issue 23).
        yield RemoveTopicFiles(topic, recreate=True)
        scan: TopicScan = EMPTY_SCAN
    else:
        scan = yield ScanTopic(topic)
    acknowledged_end, indexed_end = evidence()
    actions = recovery.plan_align(scan.segments, indexed_end) if align and not fresh else ()
    if actions:  # a promoted follower's log, cut to what the object index lacks
        yield RecoverTopic(topic, actions, None, clear_loss_accepted=False, now_ms=now_ms())
        scan = yield ScanTopic(topic)
    facts = recovery.RecoveryEvidence(
        checkpoint_end=scan.checkpoint_end,
        acknowledged_end=acknowledged_end,
        indexed_end=indexed_end,
        loss_accepted_at=scan.loss_accepted_at,
    )
    plan = recovery.plan_recovery(topic, list(scan.segments), facts)
    mark = plan.next_offset if plan.next_offset or scan.checkpoint_end is not None else None
    yield RecoverTopic(
        topic,
        tuple(plan.actions),
        mark,
        clear_loss_accepted=scan.loss_accepted_at is not None,
        now_ms=now_ms(),
    )
    return dataclasses.replace(plan, epochs=scan.epochs)


def cut(topic: str, end: int, now_ms: Callable[[], int]) -> Flow[recovery.RecoveryPlan]:
    """A follower's log cut to offsets < `end` (reconciliation by epoch): once the file
    effects under way are done, the segments past `end` go, the one holding it is cut at its
    frame and the checkpoint is forgotten (`recovery.plan_cut`); then the directory is
    recovered as at a load, which marks the new end."""
    yield FilesIdle(topic)
    scan: TopicScan = yield ScanTopic(topic)
    actions = recovery.plan_cut(topic, list(scan.segments), end)
    if actions:
        yield RecoverTopic(topic, actions, None, clear_loss_accepted=False, now_ms=now_ms())
    return (yield from recover(topic, lambda: (0, 0), now_ms=now_ms))


# -- reads -----------------------------------------------------------------------------------


def read_wal(topic: str, plan: FileRead) -> Flow[ReadOutcome]:
    """A subscription's read from a segment file: a segment that is gone is `missing` (local
    retention deleted it: the core looks in the object tier), bytes that fail or do not
    verify are not."""
    try:
        data = yield ReadTopicFile(topic, plan.segment_base, plan.start, plan.end)
        records = yield Work(lambda: decode_file_read(plan, data))
    except FileNotFoundError as error:
        return ReadOutcome(failure=str(error), missing=True)
    except (OSError, WalFormatError) as error:
        return ReadOutcome(
            failure=f"reading segment {plan.segment_base} of {topic} failed: {error}"
        )
    return ReadOutcome(tuple(records))


def read_object(
    plan: ObjectRead,
    live: Callable[[], bool],
    backoff: Backoff = OBJECT_READ_BACKOFF,
    failed: Callable[[int, BaseException], None] | None = None,
) -> Flow[ReadOutcome | None]:
    """A history read from the object store, retried by `backoff` while `live()` (the topic
    is still served here): None when the topic went meanwhile. `failed(attempt, error)`
    hears each failed attempt (logs)."""
    attempt = 0
    while live():
        attempt += 1
        try:
            data = yield ObjectGet(plan.key, plan.start_byte, plan.end_byte)
            records = yield Work(lambda data=data: decode_object_read(plan, data))
        except WalFormatError as error:
            return ReadOutcome(failure=f"object {plan.key} does not verify: {error}")
        except Exception as error:  # the store's failures: ObjectStoreFailed, OSError, …
            if failed is not None:
                failed(attempt, error)
            if backoff.gives_up(attempt):
                return ReadOutcome(failure=f"object {plan.key} cannot be read: {error}")
            yield Sleep(backoff.pause_ms(attempt))
            continue
        return ReadOutcome(tuple(records))
    return None


# -- the object tier -------------------------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class Uploaded:
    size: int
    crc32c: int
    offset_index: tuple[tuple[int, int], ...]


@fast_init
@dataclass(frozen=True, slots=True)
class UploadFailed:
    kind: UploadError
    reason: str
    error: BaseException | None = None
    """The failure itself, for the log line (operators read what the store said)."""


def classify(error: BaseException) -> UploadError:
    """What an upload failure means for the uploader. A segment that is gone, unreadable or
    does not verify, and a store that refuses for good, are `FATAL` (an operator acts);
    throttling backs off all uploads; anything else is a transient server error."""
    if isinstance(error, ObjectStoreFailed):
        if error.kind is ObjectFailure.THROTTLED:
            return UploadError.THROTTLED
        if error.kind is ObjectFailure.TRANSIENT:
            return UploadError.SERVER_ERROR
        return UploadError.FATAL
    if isinstance(error, (FileNotFoundError, PermissionError, WalFormatError)):
        return UploadError.FATAL
    return UploadError.SERVER_ERROR


def upload(topic: str, effect: UploadSegment) -> Flow[Uploaded | UploadFailed]:
    """Reads the sealed segment whole, verifies it and learns its facts (`describe_object`),
    then puts it."""
    try:
        data = yield ReadTopicFile(topic, effect.segment_base)
        facts = yield Work(
            lambda: describe_object(
                data, effect.segment_base, effect.next_offset, effect.index_interval_bytes
            )
        )
        yield ObjectPut(effect.key, data)
    except Exception as error:
        return UploadFailed(classify(error), f"{type(error).__name__}: {error}", error)
    return Uploaded(facts.size, facts.crc32c, tuple(facts.offset_index))


def commit_index(effect: CommitIndex) -> Flow[TxnAnswer | None]:
    """The index entry's compare-and-create (`CommitIndex.transaction`), fenced: the answer,
    with the entry's path read back after a refusal or an unknown outcome; None when the
    store failed outright."""
    try:
        answer: TxnAnswer = yield effect.transaction()
    except Exception:
        return None
    return answer


def list_objects(prefix: str) -> Flow[list[StoredObject]]:
    """The objects under `prefix`; a failed listing is an empty one (the next scan tries
    again)."""
    try:
        listed = yield ObjectList(prefix)
    except Exception:
        return []
    # Entries may be StoredObjects already (the simulator's store keeps its listings so).
    make = StoredObject._make
    return [item if type(item) is StoredObject else make(item) for item in listed]


def delete_object(key: str) -> Flow[BaseException | None]:
    """Deletes an object; returns the failure, if any (the next scan tries again)."""
    try:
        yield ObjectDelete(key)
    except Exception as error:
        return error
    return None


def drop(topic: str, effect: DropWal, tiered: bool, event: Callable[..., None]) -> Flow[None]:
    """A topic's files closed once idle and removed if `effect` says so; a deleted topic's
    objects too, before the drop completes (a topic created again under the name uploads
    only after its predecessor's objects are gone). A failure to delete objects is logged
    (`topic_objects_left`), not raised: nothing names them any more."""
    yield FilesIdle(topic)
    yield CloseTopicFiles(topic)
    if effect.delete_files:
        yield RemoveTopicFiles(topic)
    if effect.delete_objects and tiered:
        prefix = tier_layout.object_prefix(parse_topic(topic))
        deleted, failure = yield from delete_objects(prefix)
        if failure is not None:
            event("topic_objects_left", topic=topic, deleted=deleted, error=repr(failure))


def delete_objects(prefix: str) -> Flow[tuple[int, BaseException | None]]:
    """Every object under `prefix` (a deleted topic's): (how many went, the failure that
    stopped it). A failure never fails the deletion: its metadata is gone, so what is left
    is named by no index and never read again."""
    deleted = 0
    try:
        listed = yield ObjectList(prefix)
        for key, _ in listed:
            yield ObjectDelete(key)
            deleted += 1
    except Exception as error:
        return deleted, error
    return deleted, None


def metadata_write(txn: StoreTxn) -> Flow[str | None]:
    """One metadata change: None once durable, else why it failed."""
    try:
        answer: TxnAnswer = yield txn
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    if answer.committed:
        return None
    return f"NotOwner: this broker's claim on the topic is gone ({answer.outcome.value})"


def sleep(ms: int) -> Flow[None]:
    yield Sleep(ms)


# -- replication (spec/replication.md) ----------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class FramesOutcome:
    """A resend read: the raw frames of offsets [from, `end`), or why not."""

    frames: bytes = b""
    end: int = 0
    failure: str | None = None


def read_frames(topic: str, plan: FileRead) -> Flow[FramesOutcome]:
    """Raw frames for a follower behind the owner's window, from a segment file, verified."""
    try:
        data = yield ReadTopicFile(topic, plan.segment_base, plan.start, plan.end)
        frames, end = yield Work(lambda: frames_of_file_read(plan, data))
    except (OSError, ValueError) as error:  # WalFormatError is a ValueError
        return FramesOutcome(failure=f"reading segment {plan.segment_base} of {topic}: {error}")
    return FramesOutcome(frames, end)


def propose_in_sync(
    proposal: ProposeInSync, epoch_start: int = 0, known: ReplicaSet | None = None
) -> Flow[ReplicaConfig | None]:
    """An owner's change of the topic's in-sync set: written only while the owner's claim
    is the one of `proposal.epoch` and the value is at `proposal.expected_version` (a
    deposed owner, or one that read an older value, changes nothing). The value changed is
    `known` (the owner's, at that version) when it has one, else read first. A committed
    write is the new value at the transaction's revision; any other outcome is read back,
    since the answer may be lost, and the read-back (None: no value) is what the core
    adopts. Why not read always: a failover adopted hundreds of topics at once, each
    proposing once, and two reads per proposal were most of the new owner's store work
    (issue 23). The first change under an epoch also records where it starts (`epochs`):
    this owner replicates, which the promotion rule reads. A refusal read back at the
    version compared says the claim is gone (`ReplicaConfig.claim_gone`)."""
    key = replicas_key(proposal.topic)
    if known is not None:
        found, current = None, known
        at_expected = True
    else:
        found = yield StoreRead(key)
        current = _replica_set(found)
        at_expected = found is not None and found.mod_revision == proposal.expected_version
    if current is not None and at_expected:
        epochs = current.epochs
        if current.epoch == proposal.epoch and (not epochs or epochs[-1][0] != proposal.epoch):
            start = max(epoch_start, epochs[-1][1] if epochs else 0)
            epochs = (*epochs, (proposal.epoch, start))
        changed = dataclasses.replace(current, in_sync=tuple(proposal.in_sync), epochs=epochs)
        compares = (
            Compare(owner_key(proposal.topic), "mod_revision", "==", proposal.epoch),
            Compare(key, "mod_revision", "==", proposal.expected_version),
        )
        answer: TxnAnswer = yield StoreTxn(
            compares, (Put(key, changed.to_json()),), purpose=f"replicas {proposal.topic}"
        )
        if answer.committed and answer.revision > 0:
            return replica_config(changed, answer.revision)
        found = yield StoreRead(key)
        current = _replica_set(found)
        if (
            answer.outcome is Outcome.REFUSED
            and found is not None
            and current is not None
            and found.mod_revision == proposal.expected_version
        ):
            # The value's compare held, so the claim's failed: this owner was deposed, and
            # proposing again at every tick looped on the store until it heard so otherwise
            # (20 refused writes a second per topic; 8 of 40 seeds of the `peers` swarm).
            config = replica_config(current, found.mod_revision)
            return dataclasses.replace(config, claim_gone=proposal.epoch)
    if found is None or current is None:
        return None
    return replica_config(current, found.mod_revision)


def _replica_set(found: KeyValue | None) -> ReplicaSet | None:
    if found is None:
        return None
    try:
        return ReplicaSet.from_json(found.value)
    except ReplicaSetError:
        return None
