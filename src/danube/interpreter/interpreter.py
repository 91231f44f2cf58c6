"""The one interpreter of the broker core's effects.

`BrokerCore` decides and returns effects; the interpreter carries them out against a port
(`Host`) and feeds every completion back into the core, whose new effects it carries out in
turn: every core call that follows I/O happens here. It holds the state each driver used to
copy: the per-topic order of WAL file effects, the one metadata writer and the replies
waiting for it, the publishes waiting for durability, the checkpoint writer, the order of a
topic's loads, repairs and drops, and the flows (`danube.interpreter.flows`) that decide
what each effect's I/O is and what its answers mean.

It is pure: no threads, clocks or sockets. A port calls `apply` (and `settle`, `wait_stored`)
from one thread; answers it delivers through `Done`, at once or later, from that same
thread. Answers delivered while the interpreter is busy are queued and run after the call at
hand (a trampoline), so an instant port never recurses.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from danube.effects import (
    StoreTxn,
    TopicFile,
    TxnAnswer,
    WriteEpochs,
)
from danube.effects.flow import Finished, Flow, step
from danube.interpreter import flows, poison
from danube.interpreter.checkpoints import CheckpointWriter
from danube.interpreter.host import Host
from danube.interpreter.poison import POISON_EFFECTS
from danube.interpreter.replication import REPLICA_EFFECTS, Replication
from danube.interpreter.requests import Exclusive, FilesIdle
from danube.interpreter.waiters import MetadataLane, Publishes
from danube.machines.dispatch import ConsumerReady
from danube.machines.memory.giveback import ReturnMemory
from danube.machines.node.core import (
    BrokerCore,
    CutWal,
    DeadLetterPublish,
    DropWal,
    EndStream,
    LoadWal,
    PersistMeta,
    PublishAcked,
    PublishFailed,
    ReadObject,
    ReadWal,
    RepairWal,
    RetentionSkipped,
    SaveEpochs,
    TierHalted,
    TierIo,
    TopicStopped,
    WalIo,
)
from danube.machines.node.persist_batches import merge_persists
from danube.machines.tiering import CommitIndex, ListObjects, UploadSegment
from danube.machines.wal import machine as wal
from danube.machines.wal.recovery import CorruptSegment, RecoveryPlan
from danube.values.errors import DanubeError, ErrorCode

CHECKPOINT_INTERVAL_MS = 10
"""Least time between two checkpoint writes of one topic (spec/wal-format.md, "Remaining
window"): bounds the extra fdatasyncs a busy topic costs, at the price of a mark that trails
the acknowledgements by up to this much more."""

FILE_EFFECTS = (wal.CreateSegment, wal.Write, wal.Fsync, wal.CloseSegment, wal.DeleteSegment)

Finish = Callable[[Any, BaseException | None], None]


@dataclass(slots=True)
class _Files:
    """One topic's WAL file effects: run one at a time, in the order the machine made them."""

    queue: deque[Any] | None = None
    """The effects waiting their turn; None while none is: an empty deque is 600 bytes that
    each idle topic would keep (issue 23)."""
    busy: bool = False
    epoch: int = 0
    """Bumped by a drop: the answer of an effect started before is not the new WAL's."""
    sync: bool = False
    idle: list[Callable[[], None]] | None = None
    checkpoint_target: int = 0
    checkpoint_marked: int = 0
    checkpointing: bool = False
    checkpoint_next_ms: int = 0  # the earliest start of the next mark (one per interval)


class Interpreter:
    def __init__(
        self,
        core: BrokerCore,
        host: Host,
        *,
        objects: bool = False,
        checkpoint_interval_ms: int = CHECKPOINT_INTERVAL_MS,
        object_read_backoff: Any = flows.OBJECT_READ_BACKOFF,
        observe: Callable[[Any], None] | None = None,
    ) -> None:
        self.core = core
        self.host = host
        self.objects = objects
        """An object tier exists: a topic deleted with its objects has them removed."""
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.object_read_backoff = object_read_backoff
        self._observe = observe
        """Hears every core effect before it is carried out (the testing kit's record)."""
        self.publishes = Publishes(self._answer)
        self.metadata = MetadataLane()
        self.closed = False
        """Set by `close`: later answers are dropped (recovery redoes their work)."""
        self._files: dict[str, _Files] = {}
        self._directory: dict[str, deque[Callable[[], None]]] = {}
        """Topics whose directory is held (`Exclusive`), with who waits for it."""
        self._loading: dict[str, list[Callable[[], None]]] = {}
        """Topics with a load (or a cut) under way, with who waits for it to end."""
        self._loads_under_way: dict[str, int] = {}
        self._jobs: deque[Callable[[], None]] = deque()
        self._running = False
        self.checkpoints = CheckpointWriter(self)
        self.replication = Replication(self)
        """The owner's replication: effects out, followers' answers in."""

    # -- the port's calls ----------------------------------------------------------------------

    def apply(self, effects: Iterable[Any]) -> int:
        """Starts every effect; returns the metadata sequence number a reply must wait for."""
        self._enter(lambda: self._apply(effects))
        return self.metadata.submitted

    def settle(self, first: int, target: int, effects: Iterable[Any], waiter: Any) -> None:
        """Answers `waiter` once metadata changes `first`..`target` are durable (failed
        when one failed) and the WALs of the reliable topics `effects` loads are loaded."""
        loads = [effect.topic for effect in effects if isinstance(effect, LoadWal)]

        def durable(failure: str | None) -> None:
            if failure is not None:
                message = f"the broker could not persist metadata ({failure}); retry later"
                self._answer(waiter, DanubeError(ErrorCode.UNAVAILABLE, message))
                return
            self._after_loads(loads, lambda: self._answer(waiter, None))

        self._enter(lambda: self.metadata.when_durable(first, target, durable))

    def wait_stored(self, topic: str, through: int, waiter: Any) -> None:
        """Answers `waiter` once the WAL acknowledged every offset up to `through` at the
        topic's durability level, or fails it when they are lost. Register it before the
        step that appends them is applied: no acknowledgement can slip past it."""
        self._enter(lambda: self.publishes.wait(topic, through, waiter))

    def perform_now(self, call: Callable[[], None]) -> None:
        """Runs `call` (a port delivering answers it held) as the interpreter's own work:
        what the answers cause is carried out before this returns."""
        self._enter(call)

    def loading(self, topic: str) -> bool:
        return topic in self._loading

    def checkpoint_all(self, then: Callable[[], None]) -> None:
        """Writes the last checkpoint marks of every topic (a graceful stop), then `then`."""
        topics = list(self._files)
        left = [len(topics)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                then()

        def start() -> None:
            if not topics:
                then()
                return
            for topic in topics:
                self.checkpoints.final(topic, self._files[topic], one_done)

        self._enter(start)

    def close(self) -> None:
        """The process stops (or, in the simulator, dies): answers still on their way are
        dropped."""
        self.closed = True

    def topics_with_files(self) -> list[str]:
        return list(self._files)

    # -- running flows ---------------------------------------------------------------------------

    def _enter(self, job: Callable[[], None]) -> None:
        if self._running:
            job()
            return
        self._running = True
        try:
            job()
            while self._jobs:
                self._jobs.popleft()()
        finally:
            self._running = False

    def _post(self, job: Callable[[], None]) -> None:
        if self._running:
            self._jobs.append(job)
        else:
            self._enter(job)

    def _run(self, flow: Flow[Any], finish: Finish) -> None:
        self._advance(flow, step(flow), finish)

    def _resume(
        self, flow: Flow[Any], answer: Any, error: BaseException | None, finish: Finish
    ) -> None:
        request = step(flow, error=error) if error is not None else step(flow, answer=answer)
        self._advance(flow, request, finish)

    def _advance(self, flow: Flow[Any], request: Any, finish: Finish) -> None:
        # Each branch with a closure is a method of its own: a closure's captured variables
        # are cells made at every call of the function that holds it, whichever branch runs.
        if isinstance(request, Finished):
            finish(request.value, request.error)
        elif isinstance(request, Exclusive):
            self._exclusive_request(flow, request, finish)
        elif isinstance(request, FilesIdle):
            lane = self._files.get(request.topic)
            resume = partial(self._resume, flow, None, None, finish)
            if lane is None or not (lane.busy or lane.queue):
                self._post(resume)
            elif lane.idle is None:
                lane.idle = [resume]
            else:
                lane.idle.append(resume)
        else:
            self._perform_request(flow, request, finish)

    def _exclusive_request(self, flow: Flow[Any], request: Exclusive, finish: Finish) -> None:
        topic = request.topic

        def held() -> None:
            def released(value: Any, error: BaseException | None) -> None:
                self._release(topic)
                self._resume(flow, value, error, finish)

            self._run(request.flow, released)

        self._hold(topic, held)

    def _perform_request(self, flow: Flow[Any], request: Any, finish: Finish) -> None:
        answered = False

        def done(answer: Any = None, error: BaseException | None = None) -> None:
            nonlocal answered
            if answered:
                raise AssertionError(f"{request!r} was answered twice")
            answered = True
            if not self.closed:
                self._post(partial(self._resume, flow, answer, error, finish))

        self.host.perform(request, done)

    def _hold(self, topic: str, start: Callable[[], None]) -> None:
        waiting = self._directory.get(topic)
        if waiting is None:
            self._directory[topic] = deque()
            start()
        else:
            waiting.append(start)

    def _release(self, topic: str) -> None:
        waiting = self._directory.get(topic)
        if waiting:
            self._post(waiting.popleft())
        else:
            self._directory.pop(topic, None)

    def _answer(self, waiter: Any, error: DanubeError | None) -> None:
        if isinstance(waiter, DeadLetterPublish):  # the core's own publish: fed back to it
            self._post(partial(poison.answered, self, waiter, error))
        elif error is None:
            self.host.resolve(waiter)
        else:
            self.host.fail(waiter, error)

    def _apply_step(self, call: Callable[[], Any]) -> None:
        """A core input after I/O (skipped once closed): its effects are carried out."""
        if not self.closed:
            self._apply(call().effects)

    # -- the core's effects ----------------------------------------------------------------------

    def _apply(self, effects: Iterable[Any]) -> None:
        host, observe = self.host, self._observe
        for effect in effects:
            if observe is not None:
                observe(effect)
            if isinstance(effect, WalIo):
                self._submit_files(effect.topic, effect.effects)
            elif isinstance(effect, PublishAcked):
                previous = self.publishes.acknowledge(effect.topic, effect.through_offset)
                host.event(
                    "acknowledged",
                    topic=effect.topic,
                    through=effect.through_offset,
                    previous=previous,
                )
            elif isinstance(effect, PersistMeta):
                # fenced on the claims it was decided under (`BrokerCore.fence_claims`)
                claims = self.core.fence_claims(effect.keys)
                txn = StoreTxn(
                    (), tuple(effect.ops()), fenced=tuple(effect.keys), purpose="persist",
                    claims=None if claims is None else tuple(sorted(claims.items())),
                )  # fmt: skip
                self.metadata.submit(txn)
                self._write_metadata()
            elif isinstance(effect, ConsumerReady):
                host.wake(effect.consumer_id)
            elif isinstance(effect, EndStream):
                host.end_stream(effect.generation)
            elif isinstance(effect, ReadWal):
                self._read_wal(effect)
            elif isinstance(effect, ReadObject):
                self._read_object(effect)
            elif isinstance(effect, TierIo):
                self._tier_io(effect)
            elif isinstance(effect, (LoadWal, RepairWal)):
                self._load(effect)
            elif isinstance(effect, DropWal):
                self._drop(effect)
            elif isinstance(effect, PublishFailed):
                host.event(
                    "publish_failed",
                    topic=effect.topic,
                    from_offset=effect.from_offset,
                    reason=effect.reason,
                )
                self.publishes.fail(effect.topic, effect.from_offset, effect.reason)
            elif isinstance(effect, TopicStopped):
                host.event("topic_stopped", topic=effect.topic, reason=effect.reason)
                self.publishes.fail(effect.topic, 0, f"topic stopped: {effect.reason}")
                if effect.restart:
                    host.restart_topic(effect.topic)
            elif isinstance(effect, TierHalted):
                host.event(
                    "tier_halted",
                    topic=effect.topic,
                    reason=effect.reason,
                    resumable=effect.resumable,
                )
            elif isinstance(effect, SaveEpochs):
                self._submit_files(effect.topic, (effect,))
            elif isinstance(effect, CutWal):
                self._load(effect)
            elif isinstance(effect, REPLICA_EFFECTS):
                self.replication.carry(effect)
            elif isinstance(effect, POISON_EFFECTS):
                poison.carry(self, effect)
            elif isinstance(effect, ReturnMemory):  # spec/memory.md, "Giving memory back"
                host.return_memory(effect.freed, effect.full)
            elif isinstance(effect, RetentionSkipped):
                host.event(
                    "retention_skipped",
                    topic=effect.topic,
                    subscription=effect.subscription,
                    first=effect.first,
                    end=effect.end,
                )
            else:
                raise TypeError(f"the core made an effect no one carries out: {effect!r}")

    # -- metadata ----------------------------------------------------------------------------------

    def _write_metadata(self) -> None:
        lane = self.metadata
        if lane.writing or not lane.pending:
            return
        lane.writing = True
        # The changes queued behind the last write go as one transaction when they can
        # (`persist_batches`: standalone, unfenced), so they share one store write and fsync.
        mergeable = []
        for queued in lane.pending:
            if queued.claims is not None or queued.compares or queued.read_back:
                break
            mergeable.append(queued.ops)
        count, ops = merge_persists(mergeable) if len(mergeable) > 1 else (1, ())
        changes = [lane.pending.popleft() for _ in range(count)]
        txn = changes[0]
        if count > 1:
            fenced = tuple(key for change in changes for key in change.fenced)
            txn = StoreTxn((), ops, fenced=fenced, purpose=f"persist {count} changes")

        def written(failure: str | None, error: BaseException | None) -> None:
            if error is not None:  # a bug in the flow: the change counts as failed
                failure = f"{type(error).__name__}: {error}"
            if failure is not None:
                self.host.event("metadata_write_failed", error=failure)
            # Each change is reported, in order, as it was queued; the lane stays busy until
            # all are, so a change their replies cause waits for the next write.
            try:
                for change in changes:
                    if not self.closed:  # the core decides what a failed write needs (again)
                        now_ms = self.host.now_ms()
                        self.core.metadata_written(change.fenced, failure, now_ms=now_ms)
                    lane.written(failure)
            finally:
                lane.writing = False
            self._write_metadata()

        self._run(flows.metadata_write(txn), written)

    # -- WAL files ---------------------------------------------------------------------------------

    def _lane(self, topic: str) -> _Files:
        lane = self._files.get(topic)
        if lane is None:
            lane = self._files[topic] = _Files()
        return lane

    def _submit_files(self, topic: str, effects: Iterable[Any]) -> None:
        lane = self._lane(topic)
        for effect in effects:
            if not isinstance(effect, (*FILE_EFFECTS, SaveEpochs)):
                raise AssertionError(f"the core passes only file effects, not {effect!r}")
            if lane.queue is None:
                lane.queue = deque()
            lane.queue.append(effect)
        self._next_file(topic, lane)

    def _next_file(self, topic: str, lane: _Files) -> None:
        if lane.busy or not lane.queue:
            return
        effect = lane.queue.popleft()
        if not lane.queue:
            lane.queue = None
        lane.busy = True
        epoch = lane.epoch
        if isinstance(effect, SaveEpochs):
            self._save_epochs(topic, lane, effect)
            return

        def done(_value: Any, error: BaseException | None) -> None:
            lane.busy = False
            if lane.epoch == epoch and not self.closed:
                reason = None
                if error is not None:
                    reason = f"{type(error).__name__}: {error}"
                    self.host.event(
                        "wal_io_failed", topic=topic, effect=type(effect).__name__, error=reason
                    )
                core = self.core
                self._apply(
                    core.wal_io_done(topic, effect, reason, now_ms=self.host.now_ms()).effects
                )
                self.checkpoints.moved(topic, lane)
            if not lane.busy:
                self._files_done(topic, lane)

        self._perform(TopicFile(topic, effect, lane.sync), done)

    def _files_done(self, topic: str, lane: _Files) -> None:
        """A file effect finished: `FilesIdle` waiters go once nothing is under way or queued
        (a follower's cut must not run beside, or before, writes its old log queued: their
        completions would reach the log recovered after it), else the next effect starts."""
        if not lane.queue and lane.idle is not None:
            idle, lane.idle = lane.idle, None
            for resume in idle:
                resume()
        self._next_file(topic, lane)

    def _save_epochs(self, topic: str, lane: _Files, effect: SaveEpochs) -> None:
        """A replica's epochs file, in its place among the topic's file effects."""
        epoch = lane.epoch

        def done(_value: Any, error: BaseException | None) -> None:
            lane.busy = False
            if lane.epoch == epoch and not self.closed:
                if error is None:
                    self._apply(self.core.epochs_saved(topic).effects)
                else:  # the answers waiting for it stay held: the owner shrinks this replica
                    self.host.event("epochs_write_failed", topic=topic, error=str(error))
            if not lane.busy:
                self._files_done(topic, lane)

        self._perform(WriteEpochs(topic, effect.history), done)

    def _perform(self, request: Any, finish: Finish) -> None:
        """Performs one request and finishes with its error (None when it succeeded), as
        `_run` runs a flow that only yields `request`, without the flow: each WAL file
        effect goes this way."""
        self._ask(request, finish, keep_answer=False)

    def _ask(self, request: Any, finish: Finish, *, keep_answer: bool = True) -> None:
        """Performs one request and finishes with its answer (None unless `keep_answer`) and
        error, as `_run` runs a flow that only yields `request` and returns its answer,
        without the flow (the checkpoint writer's pauses and marks, the index commits)."""
        answered = False

        def done(answer: Any = None, error: BaseException | None = None) -> None:
            nonlocal answered
            if answered:
                raise AssertionError(f"{request!r} was answered twice")
            answered = True
            if not self.closed:
                self._post(partial(finish, answer if keep_answer else None, error))

        self.host.perform(request, done)

    # -- loads, repairs, drops ---------------------------------------------------------------------

    def _load(self, effect: LoadWal | RepairWal | CutWal) -> None:
        topic = effect.topic
        lane = self._lane(topic)
        if isinstance(effect, CutWal):
            self._loading.setdefault(topic, [])
            cut = flows.cut(topic, effect.end, self.host.now_ms)
            self._run(self._exclusive(topic, cut), self._load_done(topic, lane, effect))
            return
        if isinstance(effect, RepairWal):
            lane.queue = None  # the effects not started are discarded (spec/durability.md)
            repair: tuple[int, int] | None = (effect.segment_base, effect.truncate_to)
            fresh = False
        else:
            repair, fresh = None, effect.fresh
            self._loading.setdefault(topic, [])
        core = self.core
        flow = flows.recover(
            topic,
            lambda: core.recovery_evidence(topic),
            fresh=fresh,
            repair=repair,
            now_ms=self.host.now_ms,
            align=core.aligns_to_index,
        )

        self._run(self._exclusive(topic, flow), self._load_done(topic, lane, effect, fresh))

    def _load_done(
        self, topic: str, lane: _Files, effect: Any, fresh: bool = False
    ) -> Callable[[RecoveryPlan | None, BaseException | None], None]:
        """What a load's end does. A `DropWal` of the topic while the load ran (its lane's
        epoch moved) makes the result stale: the topic was deleted, perhaps created again
        (a new record with its own fresh load queued behind this one), or handed over, and
        the files this load read are not the ones the topic has now (review finding: a
        deleted topic's log served by its new record, whose own load then met a serving
        topic)."""
        epoch = lane.epoch
        counted = isinstance(effect, (LoadWal, CutWal))
        if counted:
            self._loads_under_way[topic] = self._loads_under_way.get(topic, 0) + 1

        def loaded(plan: RecoveryPlan | None, error: BaseException | None) -> None:
            try:
                if self.closed:
                    return
                if lane.epoch != epoch:
                    self.host.event("wal_load_stale", topic=topic)
                    self._apply(self.core.wal_load_stale(topic).effects)
                else:
                    self._loaded(topic, lane, plan, error, fresh=fresh)
            finally:
                if counted:
                    self._load_finished(topic)

        return loaded

    @staticmethod
    def _exclusive(topic: str, flow: Flow[Any]) -> Flow[Any]:
        return (yield Exclusive(topic, flow))

    def _loaded(
        self,
        topic: str,
        lane: _Files,
        plan: RecoveryPlan | None,
        error: BaseException | None,
        *,
        fresh: bool,
    ) -> None:
        core, host = self.core, self.host
        if error is not None:
            if isinstance(error, CorruptSegment):
                reason = str(error)
            elif isinstance(error, OSError):
                reason = f"the WAL directory of {topic} failed: {error}"
            else:
                raise error
            host.event("wal_load_failed", topic=topic, reason=reason)
            self._apply(core.wal_load_failed(topic, reason).effects)
            return
        assert plan is not None
        lane.checkpoint_target = lane.checkpoint_marked = plan.next_offset
        step_ = core.wal_loaded(topic, plan, now_ms=host.now_ms())
        lane.sync = core.wal_syncs_every_write(topic)
        next_offset = core.wal_durable_end(topic)
        host.event(
            "wal_loaded",
            topic=topic,
            segments=len(plan.segments),
            next_offset=next_offset,
            fresh=fresh,
        )
        self._apply(step_.effects)

    def _load_finished(self, topic: str) -> None:
        """One load of the topic ended; its waiters are answered once none is left (a
        deleted topic's load must not answer the waiters of its new record's load)."""
        left = self._loads_under_way.pop(topic, 1) - 1
        if left > 0:
            self._loads_under_way[topic] = left
            return
        waiters = self._loading.pop(topic, [])
        for then in waiters:
            then()

    def _after_loads(self, topics: list[str], then: Callable[[], None]) -> None:
        pending = [topic for topic in topics if topic in self._loading]
        if not pending:
            then()
            return
        left = [len(pending)]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                then()

        for topic in pending:
            self._loading[topic].append(one)

    def _drop(self, effect: DropWal) -> None:
        """A topic's WAL goes (`DropWal`): its lane is emptied and, once the effect under way
        is done, the files closed and, if asked, removed. A directory kept after its topic
        left (a hand-over) has no lane any more: its files are removed all the same."""
        topic = effect.topic
        self.publishes.fail(topic, 0, effect.reason)
        self.publishes.forget(topic)
        lane = self._files.get(topic)
        if lane is not None:
            lane.queue = None
            lane.epoch += 1
            lane.checkpoint_target = lane.checkpoint_marked = 0
        elif not effect.delete_files:
            return
        flow = flows.drop(topic, effect, self.objects is not None, self.host.event)
        self._run(self._exclusive(topic, flow), partial(self._dropped, topic, lane, effect))

    def _dropped(
        self, topic: str, lane: _Files | None, effect: DropWal, _value: Any, error: Any
    ) -> None:
        idle = lane is not None and not lane.busy and not lane.queue
        if idle and topic not in self._directory and self._files.get(topic) is lane:
            del self._files[topic]
        if error is not None:
            self.host.event("wal_drop_failed", topic=topic, error=repr(error))
        else:
            self.host.event("wal_dropped", topic=topic, deleted=effect.delete_files)

    # -- reads -------------------------------------------------------------------------------------

    def _read_wal(self, read: ReadWal) -> None:
        def done(outcome: flows.ReadOutcome, error: BaseException | None) -> None:
            if error is not None:
                raise error
            self._report_read(read, outcome)

        self._run(flows.read_wal(read.topic, read.plan), done)

    def _report_read(self, read: ReadWal | ReadObject, outcome: flows.ReadOutcome) -> None:
        core, now = self.core, self.host.now_ms()
        if outcome.failure is None:
            self._apply_step(lambda: core.wal_read_done(read, outcome.records, now_ms=now))
        else:
            self._apply_step(
                lambda: core.wal_read_failed(
                    read, outcome.failure or "", missing=outcome.missing, now_ms=now
                )
            )

    def _read_object(self, read: ReadObject) -> None:
        plan, host = read.plan, self.host
        host.event("object_read", topic=read.topic, plan=plan)

        def failed(attempt: int, error: BaseException) -> None:
            host.event(
                "object_read_failed", topic=read.topic, key=plan.key, attempt=attempt, error=error
            )

        def done(outcome: flows.ReadOutcome | None, error: BaseException | None) -> None:
            if error is not None:
                raise error
            if outcome is None:
                return
            if outcome.failure is None:
                host.event(
                    "object_served",
                    topic=read.topic,
                    first=plan.from_offset,
                    records=outcome.records,
                )
            self._report_read(read, outcome)

        live = lambda: not self.closed and read.topic in self._files  # noqa: E731
        self._run(flows.read_object(plan, live, self.object_read_backoff, failed), done)

    # -- the object tier ---------------------------------------------------------------------------

    def _tier_io(self, io: TierIo) -> None:
        effect, core, host = io.effect, self.core, self.host
        if isinstance(effect, UploadSegment):
            host.event("upload", topic=io.topic, key=effect.key)

            def uploaded(result: Any, error: BaseException | None) -> None:
                if error is not None:
                    raise error
                now = host.now_ms()
                if isinstance(result, flows.UploadFailed):
                    host.event(
                        "upload_failed",
                        topic=io.topic,
                        key=effect.key,
                        kind=result.kind.value,
                        error=result.reason if result.error is None else result.error,
                    )
                    self._apply_step(
                        lambda: core.tier_upload_failed(io, result.kind, result.reason, now_ms=now)
                    )
                else:
                    host.event(
                        "segment_uploaded", topic=io.topic, key=effect.key, bytes=result.size
                    )
                    self._apply_step(
                        lambda: core.tier_upload_done(
                            io, result.size, result.crc32c, result.offset_index, now_ms=now
                        )
                    )

            self._run(flows.upload(io.topic, effect), uploaded)
        elif isinstance(effect, CommitIndex):

            def committed(answer: TxnAnswer | None, error: BaseException | None) -> None:
                if error is not None:
                    raise error
                now = host.now_ms()
                if answer is not None and answer.committed:
                    host.event("index_committed", topic=io.topic, key=effect.entry.key)
                    self._apply_step(lambda: core.tier_index_committed(io, now_ms=now))
                    return
                found = None if answer is None else answer.found.get(effect.path)
                host.event(
                    "index_commit_unresolved",
                    topic=io.topic,
                    path=effect.path,
                    outcome=None if answer is None else answer.outcome.value,
                    found=found is not None,
                )
                value = None if found is None else found.value
                self._apply_step(lambda: core.tier_index_read(io, value, now_ms=now))

            # `flows.commit_index` without its generator (an index commit a message in the
            # cluster simulator): a failed build or store is None, an answer is the answer.
            try:
                txn = effect.transaction()
            except Exception:
                committed(None, None)
            else:
                self._ask(txn, lambda answer, error: committed(None if error else answer, None))
        elif isinstance(effect, ListObjects):

            def listed(objects: Any, error: BaseException | None) -> None:
                if error is not None:
                    raise error
                now = host.now_ms()
                self._apply_step(lambda: core.tier_objects_listed(io, objects, now_ms=now))

            self._run(flows.list_objects(effect.prefix), listed)
        else:
            key = effect.key
            host.event("object_delete", topic=io.topic, key=key)

            def deleted(failure: BaseException | None, error: BaseException | None) -> None:
                if error is not None:
                    raise error
                if failure is None:
                    host.event("orphan_deleted", topic=io.topic, key=key)
                else:
                    host.event("orphan_delete_failed", topic=io.topic, key=key, error=repr(failure))

            self._run(flows.delete_object(key), deleted)
