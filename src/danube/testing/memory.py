"""The instant in-memory port: files, objects and metadata in dicts, every effect answered
at once. With `danube.interpreter` it runs a `BrokerCore` through the very flows production
runs, without threads, a clock or a disk: for unit tests (ours, and anyone's who embeds the
core)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    StoreList,
    StoreRead,
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
from danube.machines.node.effects import (
    AskEpochEnd,
    ForwardDeadLetter,
    ReplicaAnswer,
    ReplicaSend,
)
from danube.machines.wal import format
from danube.machines.wal.machine import CloseSegment, CreateSegment, DeleteSegment, Fsync, Write
from danube.machines.wal.recovery import (
    ForgetCheckpoint,
    PlaceSegment,
    RebaseSegment,
    SyncSegment,
    TruncateSegment,
    UnreadableSegment,
)
from danube.metadata.model import KeyValue
from danube.values.errors import DanubeError

MAX_SLEEPS_PER_CALL = 10_000
"""An instant port answers a `Sleep` at once, without moving its clock (the test moves
time): a flow that retries a failure forever would spin. Past this many sleeps in one call
the port refuses (a test's store that never heals)."""


@dataclass
class WaiterResult:
    """A waiter the testing port answers: `done` once answered, `error` when failed."""

    done: bool = False
    error: DanubeError | None = None
    answers: int = 0


@dataclass
class MemoryPort:
    """The state a broker process would find on disk, in its object store and its metadata
    store; `perform` carries an effect out on it at once."""

    files: dict[str, dict[int, bytearray]] = field(default_factory=dict)
    objects: dict[str, bytes] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[str, int] = field(default_factory=dict)
    loss_accepted: dict[str, int] = field(default_factory=dict)
    """An operator's `accept-loss` file per topic (the offset it holds)."""
    clock_ms: int = 1_000
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    woken: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    """Topics the core asked to restart under a new epoch (`Host.restart_topic`)."""
    memory_returns: list[int] = field(default_factory=list)
    """`ReturnMemory` effects carried out, by the bytes whose fall decided each."""
    full_returns: list[bool] = field(default_factory=list)
    """Whether each of them was full (every generation collected)."""
    hold: Callable[[Any], bool] | None = None
    """Effects for which this returns True are kept in `held` instead of being performed
    (an upload still under way): `release` performs them later."""
    held: list[tuple[Any, Done]] = field(default_factory=list)
    sleeps: int = 0
    epochs: dict[str, Any] = field(default_factory=dict)
    """Each topic's epochs file (`WriteEpochs`)."""
    sent: list[Any] = field(default_factory=list)
    """Replication sends and answers, in the order they were queued on their streams (when
    no `network` carries them)."""
    store: Any = None
    """An `InstantStore` (revisions, etcd's compares) answering the store effects instead
    of `metadata`, when a test needs revisions (fencing on a claim's revision)."""
    network: Any = None
    forward_dead_letter: Callable[[ForwardDeadLetter], None] | None = None
    """Cluster mode: publishes a dead letter on the broker serving its topic (a test's
    stand-in for the runtime's internal producer); None: no other broker is reachable."""
    """A `danube.testing.replication.ReplicaNetwork` carrying this broker's replication."""
    broker_id: str = ""

    # -- Host ------------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.clock_ms

    def event(self, name: str, **fields: Any) -> None:
        self.events.append((name, fields))

    def wake(self, consumer_id: int) -> None:
        self.woken.append(consumer_id)

    def end_stream(self, generation: int) -> None:
        self.ended.append(generation)

    def restart_topic(self, topic: str) -> None:
        self.restarted.append(topic)

    def return_memory(self, freed: int, full: bool = True) -> None:
        self.memory_returns.append(freed)
        self.full_returns.append(full)

    def resolve(self, waiter: Any) -> None:
        waiter.answers += 1
        waiter.done = True

    def fail(self, waiter: Any, error: DanubeError) -> None:
        waiter.answers += 1
        waiter.done = True
        waiter.error = error

    def perform(self, effect: Any, done: Done) -> None:
        if self.hold is not None and self.hold(effect):
            self.held.append((effect, done))
            return
        try:
            answer = self.answer(effect)
        except Exception as error:
            done(error=error)
        else:
            done(answer)

    def release(self) -> None:
        """Performs the held effects now."""
        held, self.held = self.held, []
        for effect, done in held:
            try:
                answer = self.answer(effect)
            except Exception as error:
                done(error=error)
            else:
                done(answer)

    # -- the effects -----------------------------------------------------------------------------

    def answer(self, effect: Any) -> Any:
        if self.store is not None and isinstance(effect, (StoreRead, StoreList, StoreTxn)):
            return self.store.perform(effect)
        if isinstance(effect, TopicFile):
            self._file(effect.topic, effect.effect)
            return None
        if isinstance(effect, StoreTxn):
            return self._txn(effect)
        if isinstance(effect, ReadTopicFile):
            segment = self.files.get(effect.topic, {}).get(effect.segment_base)
            if segment is None:
                raise FileNotFoundError(f"segment {effect.segment_base} of {effect.topic}")
            return bytes(segment[effect.start : effect.end])
        if isinstance(effect, Work):
            return effect.run()
        if isinstance(effect, MarkDurable):
            if effect.end > self.checkpoints.get(effect.topic, 0):
                self.checkpoints[effect.topic] = effect.end
            return None
        if isinstance(effect, Sleep):
            self.sleeps += 1
            if self.sleeps > MAX_SLEEPS_PER_CALL:
                raise AssertionError("a flow slept too often: a failure that never ends?")
            return None
        if isinstance(effect, ScanTopic):
            return self._scan(effect.topic)
        if isinstance(effect, RecoverTopic):
            self._recover(effect)
            return None
        if isinstance(effect, TruncateTopicFile):
            del self.files[effect.topic][effect.segment_base][effect.size :]
            return None
        if isinstance(effect, WriteEpochs):
            self.epochs[effect.topic] = effect.history
            return None
        if isinstance(effect, RemoveTopicFiles):
            self.files.pop(effect.topic, None)
            self.epochs.pop(effect.topic, None)
            self.checkpoints.pop(effect.topic, None)
            self.loss_accepted.pop(effect.topic, None)
            return None
        if isinstance(effect, CloseTopicFiles):
            return None
        if isinstance(effect, ObjectGet):
            data = self.objects.get(effect.key)
            if data is None:
                raise ObjectStoreFailed(ObjectFailure.MISSING, f"no object {effect.key}")
            return data[effect.start : effect.end]
        if isinstance(effect, ObjectPut):
            self.objects[effect.key] = effect.data
            return None
        if isinstance(effect, ObjectList):
            return [(key, 0) for key in sorted(self.objects) if key.startswith(effect.prefix)]
        if isinstance(effect, ObjectDelete):
            self.objects.pop(effect.key, None)
            return None
        if isinstance(effect, (ReplicaSend, ReplicaAnswer)):
            if self.network is not None:
                self.network.send(self.broker_id, effect)
            else:
                self.sent.append(effect)
            return None
        if isinstance(effect, ForwardDeadLetter):
            if self.forward_dead_letter is None:
                raise ConnectionError(f"no broker serving {effect.publish.topic} is reachable")
            self.forward_dead_letter(effect)
            return None
        if isinstance(effect, AskEpochEnd):
            if self.network is None:
                raise ConnectionError("no replication network")
            return self.network.ask(self.broker_id, effect)
        if isinstance(effect, StoreRead):
            return self._read(effect.key)
        if isinstance(effect, StoreList):
            return [self._read(k) for k in sorted(self.metadata) if k.startswith(effect.prefix)]
        raise TypeError(f"the memory port cannot perform {effect!r}")

    def _read(self, key: str) -> KeyValue | None:
        if key not in self.metadata:
            return None
        return KeyValue(key, self.metadata[key], 1, 1, 1, None)

    def _txn(self, txn: StoreTxn) -> TxnAnswer:
        if compares_hold(txn.compares, self.metadata):
            apply_ops(txn.ops, self.metadata)
            return TxnAnswer(Outcome.COMMITTED)
        return TxnAnswer(Outcome.REFUSED, {key: self._read(key) for key in txn.read_back})

    def _file(self, topic: str, effect: Any) -> None:
        segments = self.files.setdefault(topic, {})
        if isinstance(effect, CreateSegment):
            segments[effect.base_offset] = bytearray(effect.header)
        elif isinstance(effect, Write):
            segment = segments[effect.segment_base]
            assert len(segment) == effect.position, "writes are sequential"
            segment += effect.data
        elif isinstance(effect, DeleteSegment):
            segments.pop(effect.segment_base, None)
        else:
            assert isinstance(effect, (Fsync, CloseSegment)), effect

    def _scan(self, topic: str) -> TopicScan:
        scans: list[tuple[int, Any]] = []
        for base, data in sorted(self.files.get(topic, {}).items()):
            try:
                scans.append((base, format.scan_segment(bytes(data))))
            except format.WalFormatError as error:
                scans.append((base, UnreadableSegment(len(data), str(error))))
        return TopicScan(
            tuple(scans),
            self.checkpoints.get(topic),
            self.loss_accepted.get(topic),
            self.epochs.get(topic),
        )

    def _recover(self, effect: RecoverTopic) -> None:
        segments = self.files.setdefault(effect.topic, {})
        for action in effect.actions:
            if isinstance(action, PlaceSegment):
                header = format.encode_segment_header(
                    effect.topic, action.segment_base, effect.now_ms
                )
                segments[action.segment_base] = bytearray(header)
            elif isinstance(action, TruncateSegment):
                del segments[action.segment_base][action.size :]
            elif isinstance(action, DeleteSegment):
                segments.pop(action.segment_base, None)
            elif isinstance(action, ForgetCheckpoint):
                self.checkpoints.pop(effect.topic, None)
            elif isinstance(action, RebaseSegment):
                header = format.encode_segment_header(effect.topic, action.new_base, effect.now_ms)
                old = segments.pop(action.segment_base)
                segments[action.new_base] = bytearray(header) + old[action.position :]
            else:
                assert isinstance(action, SyncSegment), action
        if effect.mark is not None:
            self.checkpoints[effect.topic] = effect.mark
        if effect.clear_loss_accepted:
            self.loss_accepted.pop(effect.topic, None)
