"""The simulator's port of the effect interpreter (`danube.interpreter`): it performs each
I/O effect on the simulated disk, object store and metadata with their latencies and faults
(slow fsyncs, torn writes on a crash, throttling and 5xx answers, lost commit answers, a
crash right after an upload) and tells the checker what happened. It decides nothing: the
order of WAL effects, retries, what answers mean are the interpreter's, as in production.

One port serves one incarnation of the broker process: a crash closes it, and answers still
on their way are dropped (the disk, the metadata and the objects are what survive).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from danube.effects import (
    CloseTopicFiles,
    MarkDurable,
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
    StoreTxn,
    TopicFile,
    TopicScan,
    TruncateTopicFile,
    TxnAnswer,
    Work,
    WriteEpochs,
    apply_ops,
    compares_hold,
)
from danube.interpreter.host import Done
from danube.machines.dispatch.failure import EntryState
from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.node.effects import ForwardDeadLetter
from danube.machines.wal import format
from danube.machines.wal.machine import CloseSegment, CreateSegment, DeleteSegment, Fsync, Write
from danube.machines.wal.recovery import (
    ForgetCheckpoint,
    PlaceSegment,
    RebaseSegment,
    TruncateSegment,
    UnreadableSegment,
)
from danube.metadata.model import KeyValue, Put
from danube.values.errors import DanubeError, ErrorCode
from sim.objects import StoreError

if TYPE_CHECKING:
    from sim.broker import SimBroker

_WRITE_US_PER_KIB = 4
META_TXN_US = 2_000
"""A metadata transaction (an etcd round trip with its fsync) takes this plus network latency."""
SCAN_US = 20_000
"""Reading a stored topic's WAL directory for its recovery (a listing, every segment read):
long enough that a restart's deferred loads (`danube.machines.node.deferred_loads`) are still
under way when the clients come back, as with thousands of topics on a real broker."""

_FAILURES = {
    StoreError.SLOW_DOWN: ObjectFailure.THROTTLED,
    StoreError.SERVER_ERROR: ObjectFailure.TRANSIENT,
    StoreError.NO_SUCH_KEY: ObjectFailure.MISSING,
}


def op_text(op: object) -> str:
    """`repr(op)`, for trace lines: a `Put`'s without the dataclass repr's machinery (the
    line naming each committed index entry cost 1.5 % of a cluster run with data planes).
    tests/sim/test_cluster_data_sim.py checks that both texts are the same."""
    if type(op) is Put:
        return f"Put(key={op.key!r}, value={op.value!r}, lease={op.lease!r})"
    return repr(op)


def _failed(error: StoreError) -> ObjectStoreFailed:
    return ObjectStoreFailed(_FAILURES[error], error.value)


class SimPort:
    scan_us = SCAN_US
    """How long a stored topic's directory takes to read (0: at once)."""

    def __init__(self, broker: SimBroker, incarnation: int) -> None:
        self.broker = broker
        self.incarnation = incarnation
        self.writing: dict[str, Write] = {}
        """The write under way per topic: a crash may tear it."""
        self.stats: Counter[str] = broker.tier_stats

    @property
    def alive(self) -> bool:
        broker = self.broker
        return broker.up and broker.incarnation == self.incarnation

    def _later(self, delay_us: int, action: Callable[[], None]) -> None:
        """Runs `action` after `delay_us` if this incarnation still lives."""

        broker, incarnation = self.broker, self.incarnation

        def run() -> None:  # `alive`, inlined: a third of all events pass here
            if broker.up and broker.incarnation == incarnation:
                action()

        broker.world.at(delay_us, run)

    # -- Host ------------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.broker.now_ms

    def wake(self, consumer_id: int) -> None:
        self.broker.wake(consumer_id)

    def end_stream(self, generation: int) -> None:
        self.broker.end_stream(generation)

    def restart_topic(self, topic: str) -> None:
        """A standalone broker has no replicated topic; `ClusterPort` carries it out."""

    def return_memory(self, freed: int, full: bool = True) -> None:
        """`ReturnMemory` in the simulator: recorded (nothing to give back; the trace says
        when the machine decided it and whether it was full)."""
        broker = self.broker
        pressed = broker.rss_over > 0  # decided by RSS over its mark, not by a drop
        broker.memory_returns.append(
            (broker.incarnation, broker.monotonic_ms, freed, pressed, full)
        )

    def resolve(self, waiter: Any) -> None:
        waiter.ok()

    def fail(self, waiter: Any, error: DanubeError) -> None:
        waiter.fail(error)

    def _still_held(self, topic: str, subscription: str, epoch: int, offset: int) -> bool | None:
        """Whether the subscription that asked for a dead letter still holds the original
        when its store is reported (None: that incarnation is gone, a new one asks anew)."""
        core = self.broker.core
        record = core._topics.get(topic) if core is not None else None
        sub = record.subscriptions.get(subscription) if record is not None else None
        if sub is None or sub.epoch != epoch or not record.reliable:
            return None
        machine = cast(ReliableSubscription, sub.machine)  # an observer: not a touch
        return machine.entry_state(offset) is EntryState.DEAD_LETTERING

    def event(self, name: str, **f: Any) -> None:
        broker, log, observer = self.broker, self.broker.world.log, self.broker.observer
        if name == "acknowledged":
            log(f"acknowledged {f['topic']} through={f['through']}")
            observer.acknowledged(f["topic"], f["through"], broker.wal_config.durability)
        elif name == "wal_loaded":
            if f["next_offset"] is not None:
                observer.recovered(f["topic"], f["next_offset"], fresh=f["fresh"])
        elif name == "wal_load_failed":
            log(f"wal_load_failed {f['topic']} {f['reason']}")
        elif name == "topic_stopped":
            log(f"topic_stopped {f['topic']}: {f['reason']}")
            broker.stopped_topics[f["topic"]] = f["reason"]
        elif name == "publish_failed":
            log(f"publish_failed {f['topic']} from={f['from_offset']}")
        elif name == "wal_io_failed":
            log(f"io_failed {f['topic']} {f['effect']} {f['error']}")
        elif name == "tier_halted":
            log(f"tier_halted {f['topic']} resumable={f['resumable']}: {f['reason']}")
            self.stats["halts"] += 1
            observer.tier_halted(f["topic"], f["reason"], f["resumable"])
        elif name == "retention_skipped":
            log(f"retention_skipped {f['topic']}/{f['subscription']} {f['first']}-{f['end']}")
            observer.retention_skipped(f["topic"], f["subscription"], f["first"], f["end"])
        elif name == "policy_dropped":
            log(f"policy_dropped {f['topic']}/{f['subscription']} {f['offset']}")
            observer.policy_dropped(f["topic"], f["subscription"], f["offset"], f["attempts"])
            if broker.audit is not None:
                broker.audit.policy_dropped(
                    f["topic"], f["subscription"], f["offset"], f["attempts"]
                )
        elif name == "dead_lettered":
            log(f"dead_lettered {f['topic']}/{f['subscription']} {f['offset']} at "
                f"{f['dead_letter_topic']} {f['dead_letter_offset']}")  # fmt: skip
            observer.dead_lettered(
                f["topic"], f["subscription"], f["offset"], f["attempts"],
                f["dead_letter_topic"], f["dead_letter_offset"],
                self._still_held(f["topic"], f["subscription"], f["epoch"], f["offset"]),
            )  # fmt: skip
        elif name == "dead_letter_failed":
            log(f"dead_letter_failed {f['topic']}/{f['subscription']} {f['offset']}: {f['reason']}")
        elif name == "upload":
            self.stats["uploads"] += 1
            log(f"upload {f['key']}")
        elif name == "upload_failed":
            self.stats[f"upload_{f['kind']}"] += 1
            log(f"upload_failed {f['key']} {f['kind']}")
        elif name in ("index_committed", "index_commit_unresolved"):
            if name == "index_commit_unresolved" and f["found"]:
                self.stats["commits_found"] += 1
            observer.index_committed(f["topic"])
        elif name == "object_read":
            self.stats["object_reads"] += 1
            observer.object_read(f["topic"], f["plan"])
        elif name == "object_read_failed":
            self.stats["object_read_failures"] += 1
            log(f"object_read_failed {f['key']} {f['error']}")
        elif name == "object_served":
            observer.object_served(f["topic"], f["first"], f["records"])
        elif name == "object_delete":
            observer.object_deleted(f["topic"], f["key"])
            log(f"delete object {f['key']}")
        elif name == "orphan_deleted":
            self.stats["orphans_deleted"] += 1

    # -- effects ---------------------------------------------------------------------------------

    def perform(self, effect: Any, done: Done) -> None:
        # `partial`s, not lambdas: a lambda's captured variables are cells made at every
        # call of this function, whichever branch it takes (a third of all events pass here).
        broker = self.broker
        if isinstance(effect, TopicFile):
            self._file(effect, done)
        elif isinstance(effect, StoreTxn):
            if effect.purpose.startswith("index "):
                delay = META_TXN_US + broker.network.latency()
                self._later(delay, partial(self._commit, effect, done))
            else:  # durable at once (the real broker replies only after it is)
                apply_ops(effect.ops, broker.metadata)
                done(TxnAnswer(Outcome.COMMITTED))
        elif isinstance(effect, Work):
            self._answer(done, effect.run)
        elif isinstance(effect, ReadTopicFile):
            read = partial(self._read, effect)
            self._later(broker.network.latency(), partial(self._answer, done, read))
        elif isinstance(effect, MarkDurable):
            self._later(broker.faults.fsync_us, partial(self._mark, effect, done))
        elif isinstance(effect, WriteEpochs):
            self._later(broker.faults.fsync_us, partial(self._epochs, effect, done))
        elif isinstance(effect, Sleep):
            self._later(effect.ms * 1_000, partial(done, None))
        elif isinstance(effect, ScanTopic):
            # segments to read take disk time, so that a restart's deferred loads
            # (`danube.machines.node.deferred_loads`) are still under way while the clients
            # come back (issue 23); a new topic's empty directory answers at once
            topic = effect.topic
            if self.scan_us and broker.disk.scans(topic):
                self._later(self.scan_us, lambda: done(self._scan(topic)))
            else:
                done(self._scan(topic))
        elif isinstance(effect, RecoverTopic):
            self._answer(done, partial(self._recover, effect))
        elif isinstance(effect, TruncateTopicFile):
            broker.disk.truncate(effect.topic, effect.segment_base, effect.size)
            broker.disk.fsync(effect.topic, effect.segment_base)
            done(None)
        elif isinstance(effect, RemoveTopicFiles):
            broker.disk.remove_topic(effect.topic)
            done(None)
        elif isinstance(effect, CloseTopicFiles):
            done(None)
        elif isinstance(effect, ForwardDeadLetter):
            self.forward_dead_letter(effect, done)
        else:
            self._object(effect, done)

    def forward_dead_letter(self, effect: ForwardDeadLetter, done: Done) -> None:
        """A dead letter for a topic another broker serves: only a cluster has one
        (`sim.cluster_data.ClusterPort`); a lone broker serves every topic."""
        done(error=DanubeError(ErrorCode.UNAVAILABLE, "no dead-letter forwarding here"))

    @staticmethod
    def _answer(done: Done, call: Callable[[], Any]) -> None:
        try:
            answer = call()
        except Exception as error:
            done(error=error)
        else:
            done(answer)

    def _read(self, read: ReadTopicFile) -> bytes:
        end = read.end
        if end is None:
            file = self.broker._segment_file(read.topic, read.segment_base)
            end = 0 if file is None else len(file.cache)
        return self.broker.disk.read(read.topic, read.segment_base, read.start, end)

    def _file(self, request: TopicFile, done: Done) -> None:
        effect, topic = request.effect, request.topic
        if isinstance(effect, CreateSegment | CloseSegment):
            # Done at once, in this event: creating a segment (its header durable at once)
            # or closing one takes no simulated time. Each was an event 20 µs later, two of
            # a message's events at the `object` level (a segment per upload batch), and no
            # fault acts in between: the states a crash finds are the same (no file, or a
            # file holding its header), only the 20 µs between them are gone.
            self._file_done(topic, effect, request.sync, done)
            return
        delay = 20
        if isinstance(effect, Write):
            delay = 30 + _WRITE_US_PER_KIB * len(effect.data) // 1024
            if request.sync:  # the write's own fsync, slow as often as a lone one
                delay += self._fsync_us()
            self.writing[topic] = effect
        elif isinstance(effect, Fsync):
            delay = self._fsync_us()

        self._later(delay, partial(self._file_done, topic, effect, request.sync, done))

    def _fsync_us(self) -> int:
        broker = self.broker
        faults = broker.faults
        if faults.slow_fsync and broker.world.rng.random() < faults.slow_fsync:
            broker.injected["slow_fsync"] += 1
            return faults.fsync_us * 50
        return faults.fsync_us

    def _file_done(self, topic: str, effect: Any, sync: bool, done: Done) -> None:
        """A file effect completes (`_answer` of `_file_now`, inlined: every WAL write,
        fsync and segment change passes here)."""
        self.writing.pop(topic, None)
        try:
            self._file_now(topic, effect, sync)
        except Exception as error:
            done(error=error)
        else:
            done(None)

    def _file_now(self, topic: str, effect: Any, sync: bool) -> None:
        broker, disk = self.broker, self.broker.disk
        if isinstance(effect, CreateSegment):
            disk.create(topic, effect.base_offset, effect.header)
        elif isinstance(effect, Write):
            disk.write(topic, effect.segment_base, effect.position, effect.data)
            broker.observer.written(topic, effect.data)
            if sync:
                disk.fsync(topic, effect.segment_base)
        elif isinstance(effect, Fsync):
            disk.fsync(topic, effect.segment_base)
        elif isinstance(effect, DeleteSegment):
            broker._prune(topic, effect.segment_base)
            disk.delete(topic, effect.segment_base)
        else:
            assert isinstance(effect, CloseSegment)

    def _mark(self, effect: MarkDurable, done: Done) -> None:
        self.broker.disk.mark(effect.topic, effect.end)
        done(None)

    def _epochs(self, effect: WriteEpochs, done: Done) -> None:
        self.broker.disk.epochs[effect.topic] = effect.history
        done(None)

    def _scan(self, topic: str) -> TopicScan:
        disk = self.broker.disk
        scans: list[tuple[int, Any]] = []
        for base, data in disk.scans(topic):
            try:
                scans.append((base, format.scan_segment(data)))
            except format.WalFormatError as error:
                scans.append((base, UnreadableSegment(len(data), str(error))))
        return TopicScan(tuple(scans), disk.checkpoints.get(topic), None, disk.epochs.get(topic))

    def _recover(self, effect: RecoverTopic) -> None:
        disk, topic = self.broker.disk, effect.topic
        for action in effect.actions:
            if isinstance(action, PlaceSegment):  # after an accepted loss
                header = format.encode_segment_header(topic, action.segment_base, effect.now_ms)
                disk.create(topic, action.segment_base, header)
                continue
            if isinstance(action, RebaseSegment):  # a promoted follower's log, aligned
                data = disk.read(topic, action.segment_base, action.position, 1 << 62)
                header = format.encode_segment_header(topic, action.new_base, effect.now_ms)
                disk.create(topic, action.new_base, header)
                disk.write(topic, action.new_base, len(header), data)
                disk.fsync(topic, action.new_base)
                self.broker._prune(topic, action.segment_base)
                disk.delete(topic, action.segment_base)
                continue
            if isinstance(action, ForgetCheckpoint):  # a follower's log was cut below it
                disk.checkpoints.pop(topic, None)
                continue
            if isinstance(action, DeleteSegment):  # the cut of a follower's log
                self.broker._prune(topic, action.segment_base)
                disk.delete(topic, action.segment_base)
                continue
            if isinstance(action, TruncateSegment):
                disk.truncate(topic, action.segment_base, action.size)
            disk.fsync(topic, action.segment_base)
        if effect.mark is not None:
            disk.mark(topic, effect.mark)  # the kept segments are durable now

    def _commit(self, txn: StoreTxn, done: Done) -> None:
        """The compare-and-create of an index entry, durable at once. With `commit_unknown`
        the answer is lost whatever happened: the interpreter reads the entry back."""
        broker = self.broker
        faults, rng, metadata = broker.faults, broker.world.rng, broker.metadata
        unknown = bool(faults.commit_unknown) and rng.random() < faults.commit_unknown
        holds = compares_hold(txn.compares, metadata)
        if holds and (not unknown or rng.random() < 0.5):
            apply_ops(txn.ops, metadata)
            self.stats["commits"] += 1
            put = next(op for op in txn.ops if isinstance(op, Put))
            broker.world.log(f"index committed {put.key}")
            broker.adopted(str(put.value["key"]))  # type: ignore[index]
            outcome = Outcome.COMMITTED
        else:
            outcome = Outcome.REFUSED
        if unknown:
            broker.injected["commit_unknown"] += 1
            outcome = Outcome.UNKNOWN
            broker.world.log(f"index commit unknown {op_text(txn.ops[0])}")
        found: dict[str, KeyValue | None] = {}
        if outcome is not Outcome.COMMITTED:
            for key in txn.read_back:
                value = metadata.get(key)
                found[key] = None if value is None else KeyValue(key, value, 1, 1, 1, None)
        done(TxnAnswer(outcome, found))

    def _object(self, effect: Any, done: Done) -> None:
        store = self.broker.objects
        assert store is not None
        if isinstance(effect, ObjectGet):

            def got(data: bytes | None, error: StoreError | None) -> None:
                if self.alive:
                    done(data) if error is None else done(error=_failed(error))

            end = effect.end if effect.end is not None else 1 << 62
            store.get_range(effect.key, effect.start, end, got)
        elif isinstance(effect, ObjectPut):
            broker, key = self.broker, effect.key

            def landed() -> None:
                broker.landed(key)

            def put(error: StoreError | None) -> None:
                if not self.alive:
                    return
                if error is not None:
                    done(error=_failed(error))
                    return
                faults = broker.faults
                if faults.upload_crash and broker.world.rng.random() < faults.upload_crash:
                    broker.injected["upload_crash"] += 1
                    broker.crash(power=False)
                    return
                done(None)

            store.put(key, effect.data, lambda: self.alive, put, landed)
        elif isinstance(effect, ObjectList):

            def listed(found: list[tuple[str, int]] | None, error: StoreError | None) -> None:
                if self.alive:
                    self.stats["orphan_scans"] += 1
                    done(found) if error is None else done(error=_failed(error))

            store.list_prefix(effect.prefix, listed)
        else:
            assert isinstance(effect, ObjectDelete)

            def deleted(error: StoreError | None) -> None:
                if self.alive:
                    done(None) if error is None else done(error=_failed(error))

            store.delete(effect.key, deleted)
