"""One simulated broker: the real `BrokerCore` (with its WAL and dispatch machines) and the
real request translation of `danube.node.requests`, driven by simulated I/O instead of trio.

It does what `danube.broker.runtime` does with the core's effects, with the disk and the
network of the simulation: metadata changes become durable at once (the real broker replies
only after they are), WAL file effects run one at a time per topic with simulated latencies,
receive streams carry stored records over ordered simulated streams. With an object tier it
also does what the runtime's object-store driver does: uploads sealed segments read from the
simulated disk, commits index entries with a compare-and-create on the metadata, lists and
deletes objects, and serves history reads from the simulated store (retrying the store's
transient failures). A crash throws all of it away except the disk, the metadata and the
object store, exactly what a restarted process would find.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from danube.core.config import Policies
from danube.core.errors import DanubeError, ErrorCode
from danube.dispatch import ConsumerReady, QueueLimits
from danube.dispatch.reliable import ReliableSubscription
from danube.dispatch.types import SubscriptionType
from danube.node import requests
from danube.node.core import (
    BrokerCore,
    BrokerIdentity,
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
    TierHalted,
    TierIo,
    TopicStopped,
    WalIo,
)
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from danube.requests.publish import BatchRequest
from danube.tiering import (
    CommitIndex,
    ListObjects,
    ObjectRead,
    StoredObject,
    UploaderConfig,
    UploadError,
    UploadSegment,
    decode_object_read,
    describe_object,
)
from danube.wal import format, records
from danube.wal.machine import (
    CloseSegment,
    CreateSegment,
    DeleteSegment,
    Durability,
    Fsync,
    WalConfig,
    Write,
    decode_file_read,
)
from danube.wal.recovery import (
    CorruptSegment,
    PlaceSegment,
    RecoveryEvidence,
    TruncateSegment,
    UnreadableSegment,
    plan_recovery,
)
from sim.disk import SimDisk, SimFile
from sim.faults import Faults, Injected
from sim.network import Network, Stream
from sim.objects import SimObjectStore, StoreError
from sim.requests import SimRequests
from sim.world import World

URL = "http://sim-broker:6650"
TICK_US = 50_000
EPOCH_MS = 1_795_000_000_000
"""Where the broker's wall clock starts (November 2026), so clock jumps stay realistic."""
STREAM_BATCH = 64
_WRITE_US_PER_KIB = 4
META_TXN_US = 2_000
"""A metadata transaction (an etcd round trip with its fsync) takes this plus network latency."""
OBJECT_READ_ATTEMPTS = 6
"""As the runtime: a history read retries the store's failures, then stops the topic."""


class Reply:
    """Where a request's answer goes (the client's callback, over the network)."""

    def __init__(self, network: Network, client: str, deliver: Callable[[Any], None]) -> None:
        self._network = network
        self._client = client
        self._deliver = deliver
        self.done = False

    def __call__(self, answer: Any) -> None:
        if not self.done:
            self.done = True
            shown = f"error {answer.code.name}" if isinstance(answer, DanubeError) else "ok"
            self._network.world.log(f"reply {self._client} {shown}")
            self._network.send(self._client, lambda: self._deliver(answer))

    @property
    def client(self) -> str:
        return self._client


@dataclass(slots=True)
class OpenStream:
    consumer_id: int
    generation: int
    wire: Stream
    on_message: Callable[[records.Record], None]
    on_end: Callable[[str], None]
    pumping: bool = False


@dataclass(slots=True)
class TopicIo:
    queue: deque[Any] = field(default_factory=deque)
    busy: bool = False


class Observer:
    """What the checker wants to hear from inside the broker."""

    def acknowledged(self, topic: str, through: int, durability: Durability) -> None: ...

    def restarted(self) -> None:
        """The broker process started (again): nothing is in flight any more."""

    def sent(
        self, topic: str, sub: SubscriptionRecordView, consumer_id: int, offset: int, key: str
    ) -> None: ...

    def written(self, topic: str, data: bytes) -> None:
        """Frames reached the topic's segment file (a torn write passes its prefix)."""

    def retention_skipped(self, topic: str, subscription: str, first: int, end: int) -> None:
        """The broker found offsets [first, end) in no tier for a subscription's read."""

    def index_committed(self, topic: str) -> None:
        """An index entry of the topic was created in the metadata."""

    def object_read(self, topic: str, plan: ObjectRead) -> None:
        """The broker plans a history read from an object."""

    def object_served(self, topic: str, first: int, records: tuple[bytes, ...]) -> None:
        """An object read decoded these records, from offset `first` on."""

    def object_deleted(self, topic: str, key: str) -> None:
        """The broker deletes an object (an orphan, it believes)."""

    def segment_deleted(self, topic: str, base: int, next_offset: int) -> None:
        """Local retention deletes a segment file holding offsets [base, next_offset)."""

    def tier_halted(self, topic: str, reason: str, resumable: bool) -> None: ...

    def recovered(self, topic: str, next_offset: int, *, fresh: bool) -> None:
        """A topic's WAL was loaded (not stopped): offsets continue at `next_offset`;
        `fresh`: a topic created now, owning no earlier offsets."""


@dataclass(frozen=True, slots=True)
class SubscriptionRecordView:
    name: str
    sub_type: SubscriptionType
    dispatcher: ReliableSubscription | None


class SimBroker:
    def __init__(
        self,
        world: World,
        network: Network,
        disk: SimDisk,
        faults: Faults,
        injected: Injected,
        wal_config: WalConfig,
        observer: Observer,
        *,
        max_unacked: int = 10,
        metadata: dict[str, Any] | None = None,
        objects: SimObjectStore | None = None,
        uploads: UploaderConfig | None = None,
    ) -> None:
        """`objects` and `uploads` together turn the object tier on."""
        self.world = world
        self.network = network
        self.disk = disk
        self.faults = faults
        self.injected = injected
        self.wal_config = wal_config
        self.observer = observer
        self.max_unacked = max_unacked
        self.metadata: dict[str, Any] = {} if metadata is None else metadata
        self.objects = objects
        self.uploads = uploads
        self.tier_stats: Counter[str] = Counter()
        self._landed: set[str] = set()
        """Objects uploaded since the last crash whose index entry is not committed yet."""
        self._left: set[str] = set()
        """Objects a crash left without an index entry, until an upload commits them."""
        self.clock_skew_ms = 0
        self.incarnation = 0
        self.up = False
        self.core: BrokerCore | None = None
        self.requests = SimRequests(self)
        self._io: dict[str, TopicIo] = {}
        self._waiters: dict[str, deque[tuple[int, Any]]] = {}
        self._streams: dict[int, OpenStream] = {}
        """By generation."""
        self._current: dict[int, int] = {}
        """consumer id -> generation of its newest stream."""
        self.stopped_topics: dict[str, str] = {}
        self._marking: set[str] = set()
        """Topics with a checkpoint write in flight."""
        self._mark_epochs: Counter[str] = Counter()
        """Bumped when a topic's directory is removed: a checkpoint write started before
        must not land in its successor's."""

    @property
    def now_ms(self) -> int:
        """The broker's wall clock: an epoch-like start, the simulated time, and any injected
        clock jumps."""
        return EPOCH_MS + self.world.now_ms + self.clock_skew_ms

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.incarnation += 1
        self.world.log(f"broker start incarnation={self.incarnation}")
        self.observer.restarted()
        core = self.core = self._new_core()
        self._io, self._waiters, self._streams, self._current = {}, {}, {}, {}
        self._marking = set()
        restored = core.restore(self.metadata)
        self._apply(core.bootstrap(["default"]).effects)
        self._apply(restored.effects)  # WAL loads complete at once, before requests arrive
        self.up = True
        incarnation = self.incarnation
        self.world.at(TICK_US, lambda: self._tick(incarnation))

    def _new_core(self, **options: Any) -> BrokerCore:
        return BrokerCore(
            BrokerIdentity(URL, URL),
            rng=random.Random(self.world.rng.getrandbits(64)),
            default_policies=Policies(),
            queue_limits=QueueLimits(),
            wal_config=self.wal_config,
            max_unacked_messages=self.max_unacked,
            routing_key_of=records.routing_key,
            uploads=self.uploads,
            **options,
        )

    def crash(self, *, power: bool, fault: bool = True) -> None:
        """Dies at once: in-flight I/O is lost (a write under way may be torn), streams
        break, and the process restarts after `restart_us`. `fault=False`: the checker's
        own restart at the end of a run, not counted as an injected fault."""
        if not self.up:
            return
        kind = "power_failure" if power else "crash"
        if fault:
            self.injected[kind] += 1
        self.world.log(f"fault {kind}" if fault else "final restart")
        self.up = False
        self.core = None
        if self._landed:
            if fault:
                self.injected["orphan_left"] += len(self._landed)
            self.world.log(f"orphans left {sorted(self._landed)}")
            self._left.update(self._landed)
            self._landed.clear()
        for topic, io in self._io.items():
            torn = io.queue[0] if io.busy and io.queue else None
            if isinstance(torn, Write) and self.world.rng.random() < 0.5:
                keep = self.world.rng.randrange(len(torn.data))
                self._torn_write(topic, torn, keep)
        for stream in list(self._streams.values()):
            self._break(stream, "broker crashed")
        self.disk.crash(power=power, rng=self.world.rng)
        self.world.at(self.faults.restart_us, self.start)

    def _torn_write(self, topic: str, write: Write, keep: int) -> None:
        if not keep:
            return
        self.injected["torn_write"] += 1
        self.world.log(f"fault torn_write {topic} segment={write.segment_base} kept={keep}")
        file = self.disk.topics[topic].files.get(write.segment_base)
        if file is not None and len(file.cache) == write.position:
            file.cache += write.data[:keep]
            self.observer.written(topic, write.data[:keep])

    def _alive(self, incarnation: int) -> BrokerCore | None:
        return self.core if self.up and self.incarnation == incarnation else None

    def _tick(self, incarnation: int) -> None:
        core = self._alive(incarnation)
        if core is None:
            return
        self._apply(core.tick(self.now_ms).effects)
        self.world.at(TICK_US, lambda: self._tick(incarnation))

    # -- requests ---------------------------------------------------------------------------------

    def handle(self, request: Any, reply: Reply, **stream: Any) -> None:
        """A request arrived; `reply` gets the response message or a `DanubeError`. Publishes
        and acknowledgements run the request flows the gRPC services run (`sim.requests`)."""
        core = self.core
        self.world.log(f"request {reply.client} {_describe(request)}")
        if not self.up or core is None:
            reply(DanubeError(ErrorCode.UNAVAILABLE, "connection refused (broker down)"))
            return
        try:
            if isinstance(request, pb.StreamMessage):
                self._publish(core, request, reply)
            elif isinstance(request, ext_pb.PublishBatch):
                self._publish_batch(request, reply)
            elif isinstance(request, pb.ProducerRequest):
                step = requests.create_producer(core, request)
                self._apply(step.effects)
                reply(pb.ProducerResponse(request.request_id, step.value, request.producer_name))
            elif isinstance(request, pb.ConsumerRequest):
                step = requests.subscribe(core, request, stream["start"], self.now_ms)
                self._apply(step.effects)
                reply(pb.ConsumerResponse(request.request_id, step.value, request.consumer_name))
            elif isinstance(request, pb.ReceiveRequest):
                self._open_stream(core, request.consumer_id, reply, **stream)
            elif isinstance(request, pb.AckRequest):
                flow = self.requests.ack_one(requests.acknowledgement(request))
                self.requests.run(flow, _answered(reply, pb.AckResponse(request.request_id)))
            elif isinstance(request, ext_pb.AckBatchRequest):
                flow = self.requests.ack(
                    request.topic_name, request.subscription_name, list(request.offsets)
                )
                response = ext_pb.AckBatchResponse(request.request_id)
                self.requests.run(flow, _answered(reply, response))
            elif isinstance(request, pb.NackRequest):
                flow = self.requests.nack_one(requests.acknowledgement(request))
                self.requests.run(flow, _answered(reply, pb.NackResponse(request.request_id)))
            else:
                raise TypeError(f"unexpected request {type(request).__name__}")
        except DanubeError as error:
            reply(error)

    def _publish(self, core: BrokerCore, message: pb.StreamMessage, reply: Reply) -> None:
        flow = self.requests.publish_one(requests.record_of(message))
        self.requests.run(flow, _answered(reply, pb.MessageResponse(message.request_id)))

    def _publish_batch(self, request: ext_pb.PublishBatch, reply: Reply) -> None:
        batch = BatchRequest(request.producer_id, request.topic_name, request.frame)

        def done(answer: Any) -> None:
            if isinstance(answer, DanubeError):
                reply(answer)
            else:
                reply(ext_pb.BatchAck(request.sequence, answer.first_offset, answer.count))

        self.requests.run(self.requests.publish_batch(batch), done)

    # -- hooks of the request flows (`sim.requests`) ----------------------------------------

    def apply_step(self, step: Any) -> None:
        """A flow's `Apply`: the core step's effects, metadata durable at once."""
        self._apply(step.effects)

    def wait_for_storage(self, topic: str, through: int, waiter: Any) -> None:
        """A flow's storage wait joins the table the WAL's acknowledgements settle."""
        self._waiters.setdefault(topic, deque()).append((through, waiter))

    def _open_stream(
        self,
        core: BrokerCore,
        consumer_id: int,
        reply: Reply,
        *,
        client: str,
        on_message: Callable[[records.Record], None],
        on_end: Callable[[str], None],
        **_: Any,
    ) -> None:
        step = core.open_stream(consumer_id, now_ms=self.now_ms)
        stream = OpenStream(
            consumer_id, step.value, self.network.open_stream(client), on_message, on_end
        )
        self._streams[step.value] = stream
        self._current[consumer_id] = step.value
        reply(step.value)
        self._apply(step.effects)
        self._pump(stream)

    def break_streams(self, client: str) -> None:
        """The client is cut off: its streams break on both sides."""
        for stream in list(self._streams.values()):
            if stream.wire.client == client:
                self._break(stream, "connection lost")

    def _break(self, stream: OpenStream, why: str) -> None:
        stream.wire.alive = False
        self._streams.pop(stream.generation, None)
        if self._current.get(stream.consumer_id) == stream.generation:
            del self._current[stream.consumer_id]
        if self.up and self.core is not None:
            closed = self.core.close_stream(
                stream.consumer_id, stream.generation, now_ms=self.now_ms
            )
            self._apply(closed.effects)
        # the client notices a broken connection a little later
        self.world.at(self.network.latency() * 4, lambda: stream.on_end(why))

    def _pump(self, stream: OpenStream) -> None:
        """The stream writer: sends what the consumer's queue holds."""
        core = self.core
        if core is None or stream.pumping or self._streams.get(stream.generation) is not stream:
            return
        batch = core.take(stream.consumer_id, stream.generation, STREAM_BATCH)
        if not batch:
            return
        view = self._subscription_view(stream.consumer_id)
        for item in batch:
            record = records.decode(item)  # what the consumer's client decodes
            self.world.log(f"send {view.name} offset={record.topic_offset} to {stream.wire.client}")
            self.observer.sent(
                record.topic_name,
                view,
                stream.consumer_id,
                record.topic_offset,
                record.key.decode(),
            )
            if not self.network.stream_send(stream.wire, lambda r=record: stream.on_message(r)):
                self._break(stream, "stream broken")
                return
        stream.pumping = True

        def again() -> None:
            stream.pumping = False
            self._pump(stream)

        self.world.at(0, again)

    def _subscription_view(self, consumer_id: int) -> SubscriptionRecordView:
        core = self.core
        assert core is not None
        record = core._consumers[consumer_id]
        sub = core._topics[record.topic.full].subscriptions[record.subscription]
        dispatcher = sub.dispatcher if isinstance(sub.dispatcher, ReliableSubscription) else None
        return SubscriptionRecordView(sub.name, sub.sub_type, dispatcher)

    # -- effects ----------------------------------------------------------------------------------

    def _apply(self, effects: Any) -> None:
        for effect in effects:
            if isinstance(effect, PersistMeta):
                self._persist(effect)
            elif isinstance(effect, WalIo):
                io = self._io.setdefault(effect.topic, TopicIo())
                io.queue.extend(effect.effects)
                self._run_io(effect.topic, io)
            elif isinstance(effect, PublishAcked):
                self._acknowledge(effect.topic, effect.through_offset)
            elif isinstance(effect, ConsumerReady):
                generation = self._current.get(effect.consumer_id)
                stream = self._streams.get(generation) if generation is not None else None
                if stream is not None:
                    self.world.at(0, lambda s=stream: self._pump(s))
            elif isinstance(effect, EndStream):
                stream = self._streams.get(effect.generation)
                if stream is not None:
                    self._streams.pop(effect.generation)
                    self.network.stream_send(stream.wire, lambda s=stream: s.on_end("ended"))
            elif isinstance(effect, (LoadWal, RepairWal)):
                self._load(effect)
            elif isinstance(effect, DropWal):
                self._io.pop(effect.topic, None)
                self._fail_waiters(effect.topic, 0, effect.reason)
                if effect.delete_files:
                    self._mark_epochs[effect.topic] += 1
                    self.disk.remove_topic(effect.topic)
            elif isinstance(effect, ReadWal):
                self.world.at(
                    self.network.latency(),
                    lambda e=effect, i=self.incarnation: self._read(i, e),
                )
            elif isinstance(effect, PublishFailed):
                self.world.log(f"publish_failed {effect.topic} from={effect.from_offset}")
                self._fail_waiters(effect.topic, effect.from_offset, effect.reason)
            elif isinstance(effect, TopicStopped):
                self.world.log(f"topic_stopped {effect.topic}")
                self.stopped_topics[effect.topic] = effect.reason
                self._fail_waiters(effect.topic, 0, effect.reason)
            elif isinstance(effect, TierIo):
                self.world.at(0, lambda e=effect, i=self.incarnation: self._tier_io(i, e))
            elif isinstance(effect, ReadObject):
                self.observer.object_read(effect.topic, effect.plan)
                self.world.at(0, lambda e=effect, i=self.incarnation: self._read_object(i, e, 0))
            elif isinstance(effect, TierHalted):
                self.world.log(f"tier_halted {effect.topic} resumable={effect.resumable}")
                self.tier_stats["halts"] += 1
                self.observer.tier_halted(effect.topic, effect.reason, effect.resumable)
            else:
                assert isinstance(effect, RetentionSkipped), effect
                self.world.log(
                    f"retention_skipped {effect.topic}/{effect.subscription} "
                    f"{effect.first}-{effect.end}"
                )
                self.observer.retention_skipped(
                    effect.topic, effect.subscription, effect.first, effect.end
                )

    def _persist(self, effect: PersistMeta) -> None:
        effect.apply_to(self.metadata)

    def _acknowledge(self, topic: str, through: int) -> None:
        self.world.log(f"acknowledged {topic} through={through}")
        self.observer.acknowledged(topic, through, self.wal_config.durability)
        waiting = self._waiters.get(topic)
        while waiting and waiting[0][0] <= through:
            waiting.popleft()[1].ok()

    def _fail_waiters(self, topic: str, from_offset: int, reason: str) -> None:
        waiting = self._waiters.get(topic)
        while waiting and waiting[-1][0] >= from_offset:
            waiting.pop()[1].fail(DanubeError(ErrorCode.UNAVAILABLE, reason))

    # -- WAL I/O ----------------------------------------------------------------------------------

    def _run_io(self, topic: str, io: TopicIo) -> None:
        if io.busy or not io.queue or self._io.get(topic) is not io:
            return
        effect = io.queue[0]
        io.busy = True
        delay = 20
        if isinstance(effect, Write):
            delay = 30 + _WRITE_US_PER_KIB * len(effect.data) // 1024
            if self.core is not None and self.core.wal_syncs_every_write(topic):
                delay += self.faults.fsync_us
        elif isinstance(effect, Fsync):
            delay = self.faults.fsync_us
            if self.faults.slow_fsync and self.world.rng.random() < self.faults.slow_fsync:
                self.injected["slow_fsync"] += 1
                delay *= 50
        incarnation = self.incarnation
        self.world.at(delay, lambda: self._io_done(incarnation, topic, io, effect))

    def _io_done(self, incarnation: int, topic: str, io: TopicIo, effect: Any) -> None:
        core = self._alive(incarnation)
        if core is None or self._io.get(topic) is not io:
            return
        io.queue.popleft()
        io.busy = False
        error = None
        try:
            if isinstance(effect, CreateSegment):
                self.disk.create(topic, effect.base_offset, effect.header)
            elif isinstance(effect, Write):
                self.disk.write(topic, effect.segment_base, effect.position, effect.data)
                self.observer.written(topic, effect.data)
                if core.wal_syncs_every_write(topic):
                    self.disk.fsync(topic, effect.segment_base)
            elif isinstance(effect, Fsync):
                self.disk.fsync(topic, effect.segment_base)
            elif isinstance(effect, DeleteSegment):
                self._prune(topic, effect.segment_base)
                self.disk.delete(topic, effect.segment_base)
            else:
                assert isinstance(effect, CloseSegment)
        except OSError as failure:
            error = f"{type(failure).__name__}: {failure}"
            self.world.log(f"io_failed {topic} {type(effect).__name__} {error}")
        self._apply(core.wal_io_done(topic, effect, error, now_ms=self.now_ms).effects)
        self._mark_durable(topic)
        self._run_io(topic, io)

    def _mark_durable(self, topic: str) -> None:
        """The broker's checkpoint writer (`BrokerRuntime._run_checkpoints`): beside the
        topic's I/O queue, one write (an fsync's time) at a time, coalescing the durable ends
        that arrive meanwhile. A crash loses a write in flight: the previous mark stays."""
        core = self.core
        end = None if core is None else core.wal_durable_end(topic)
        if end is None or end <= self.disk.checkpoints.get(topic, 0) or topic in self._marking:
            return
        self._marking.add(topic)
        incarnation, epoch = self.incarnation, self._mark_epochs[topic]

        def written() -> None:
            if self._alive(incarnation) is None:
                return
            self._marking.discard(topic)
            if self._mark_epochs[topic] == epoch:
                self.disk.mark(topic, end)
                self._mark_durable(topic)

        self.world.at(self.faults.fsync_us, written)

    def _load(self, effect: LoadWal | RepairWal) -> None:
        core = self.core
        assert core is not None
        topic = effect.topic
        if isinstance(effect, RepairWal):
            self._io.pop(topic, None)  # effects not started are discarded
            self.disk.truncate(topic, effect.segment_base, effect.truncate_to)
            self.disk.fsync(topic, effect.segment_base)
        elif effect.fresh:
            self._mark_epochs[topic] += 1
            self.disk.remove_topic(topic)
        scans: list[Any] = []
        for base, data in self.disk.scans(topic):
            try:
                scans.append((base, format.scan_segment(data)))
            except format.WalFormatError as error:
                scans.append((base, UnreadableSegment(len(data), str(error))))
        acknowledged_end, indexed_end = core.recovery_evidence(topic)
        evidence = RecoveryEvidence(
            checkpoint_end=self.disk.checkpoints.get(topic),
            acknowledged_end=acknowledged_end,
            indexed_end=indexed_end,
        )
        try:
            plan = plan_recovery(topic, scans, evidence)
        except CorruptSegment as error:
            self.world.log(f"wal_corrupt {topic} {error.segment} byte={error.position}")
            self._apply(core.wal_load_failed(topic, str(error)).effects)
            return
        for action in plan.actions:
            if isinstance(action, PlaceSegment):  # after an accepted loss
                header = format.encode_segment_header(topic, action.segment_base, self.now_ms)
                self.disk.create(topic, action.segment_base, header)
                continue
            if isinstance(action, TruncateSegment):
                self.disk.truncate(topic, action.segment_base, action.size)
            self.disk.fsync(topic, action.segment_base)
        if plan.next_offset or topic in self.disk.checkpoints:
            self.disk.mark(topic, plan.next_offset)  # the kept segments are durable now
        self._apply(core.wal_loaded(topic, plan, now_ms=self.now_ms).effects)
        next_offset = core.wal_durable_end(topic)
        if next_offset is not None:
            fresh = isinstance(effect, LoadWal) and effect.fresh
            self.observer.recovered(topic, next_offset, fresh=fresh)

    def _read(self, incarnation: int, effect: ReadWal) -> None:
        core = self._alive(incarnation)
        if core is None:
            return
        plan = effect.plan
        try:
            data = self.disk.read(effect.topic, plan.segment_base, plan.start, plan.end)
            records = decode_file_read(plan, data)
        except FileNotFoundError as error:
            step = core.wal_read_failed(effect, str(error), missing=True, now_ms=self.now_ms)
        except format.WalFormatError as error:
            step = core.wal_read_failed(effect, str(error), missing=False, now_ms=self.now_ms)
        else:
            step = core.wal_read_done(effect, records, now_ms=self.now_ms)
        self._apply(step.effects)

    # -- object tier ------------------------------------------------------------------------------

    def _prune(self, topic: str, base: int) -> None:
        """Local retention deletes a segment: tell the checker which offsets leave the disk."""
        file = self._segment_file(topic, base)
        if file is None or self.objects is None:
            return
        self.tier_stats["segments_pruned"] += 1
        try:
            next_offset = format.scan_segment(bytes(file.cache)).next_offset
        except format.WalFormatError:
            next_offset = base
        self.observer.segment_deleted(topic, base, next_offset)

    def _segment_file(self, topic: str, base: int) -> SimFile | None:
        files = self.disk.topics.get(topic)
        return None if files is None else files.files.get(base)

    def _tier_io(self, incarnation: int, io: TierIo) -> None:
        if self._alive(incarnation) is None:
            return
        effect = io.effect
        if isinstance(effect, UploadSegment):
            self._upload(incarnation, io, effect)
        elif isinstance(effect, CommitIndex):
            self.world.at(
                META_TXN_US + self.network.latency(),
                lambda: self._commit(incarnation, io, effect),
            )
        elif isinstance(effect, ListObjects):
            self._list(incarnation, io)
        else:
            self._delete_object(io.topic, effect.key)

    def _upload(self, incarnation: int, io: TierIo, effect: UploadSegment) -> None:
        """As the runtime: read the local segment whole, verify it (`describe_object`), put
        it; a segment that is gone or does not verify is `FATAL`."""
        store, key, topic = self.objects, effect.key, io.topic
        assert store is not None
        self.tier_stats["uploads"] += 1
        self.world.log(f"upload {key}")
        file = self._segment_file(topic, effect.segment_base)
        try:
            if file is None:
                raise FileNotFoundError(f"segment {effect.segment_base} of {topic} is gone")
            data = bytes(file.cache)
            facts = describe_object(
                data, effect.segment_base, effect.next_offset, effect.index_interval_bytes
            )
        except (OSError, format.WalFormatError) as error:
            reason = f"{type(error).__name__}: {error}"
            self._upload_failed(incarnation, io, UploadError.FATAL, reason)
            return

        def landed() -> None:
            self._landed.add(key)
            self.world.log(f"object landed {key}")

        def done(error: StoreError | None) -> None:
            if self._alive(incarnation) is None:
                return
            if error is not None:
                kind = (
                    UploadError.THROTTLED
                    if error is StoreError.SLOW_DOWN
                    else UploadError.SERVER_ERROR
                )
                self._upload_failed(incarnation, io, kind, error.value)
                return
            faults = self.faults
            if faults.upload_crash and self.world.rng.random() < faults.upload_crash:
                self.injected["upload_crash"] += 1
                self.crash(power=False)
                return
            core = self._alive(incarnation)
            assert core is not None
            step = core.tier_upload_done(
                io, facts.size, facts.crc32c, facts.offset_index, now_ms=self.now_ms
            )
            self._apply(step.effects)

        store.put(key, data, lambda: self._alive(incarnation) is not None, done, landed)

    def _upload_failed(self, incarnation: int, io: TierIo, kind: UploadError, reason: str) -> None:
        core = self._alive(incarnation)
        if core is None:
            return
        self.tier_stats[f"upload_{kind.value}"] += 1
        assert isinstance(io.effect, UploadSegment)
        self.world.log(f"upload_failed {io.effect.key} {kind.value}")
        step = core.tier_upload_failed(io, kind, reason, now_ms=self.now_ms)
        self._apply(step.effects)

    def _commit(self, incarnation: int, io: TierIo, effect: CommitIndex) -> None:
        """The runtime's transaction: if `path` does not exist, put the entry and the `cur`
        pointer (durable at once). With `commit_unknown` the answer is lost whatever
        happened, and the uploader hears only that the outcome is unknown."""
        core = self._alive(incarnation)
        if core is None:
            return  # the process died before its request went out
        faults, rng, topic = self.faults, self.world.rng, io.topic
        unknown = bool(faults.commit_unknown) and rng.random() < faults.commit_unknown
        if effect.path not in self.metadata and (not unknown or rng.random() < 0.5):
            self.metadata[effect.path] = effect.value
            self.metadata[effect.current_path] = effect.current_value
            self.tier_stats["commits"] += 1
            self.world.log(f"index committed {effect.path}")
            key = effect.entry.key
            self._landed.discard(key)
            if key in self._left:
                self._left.discard(key)
                self.tier_stats["orphans_adopted"] += 1
            self.observer.index_committed(topic)
            created = True
        else:
            created = False
        if unknown:
            self.injected["commit_unknown"] += 1
            self.world.log(f"index commit unknown {effect.path}")
            step = core.tier_commit_failed(io, now_ms=self.now_ms)
        elif created:
            step = core.tier_index_committed(io, now_ms=self.now_ms)
        else:
            self.tier_stats["commits_found"] += 1
            step = core.tier_index_read(io, self.metadata[effect.path], now_ms=self.now_ms)
        self._apply(step.effects)

    def _list(self, incarnation: int, io: TierIo) -> None:
        store, effect = self.objects, io.effect
        assert store is not None and isinstance(effect, ListObjects)

        def done(listed: list[tuple[str, int]] | None, error: StoreError | None) -> None:
            core = self._alive(incarnation)
            if core is None:
                return
            # as the runtime: a failed listing is an empty one; the next scan tries again
            self.tier_stats["orphan_scans"] += 1
            found = [StoredObject(key, modified) for key, modified in listed or []]
            step = core.tier_objects_listed(io, found, now_ms=self.now_ms)
            self._apply(step.effects)

        store.list_prefix(effect.prefix, done)

    def _delete_object(self, topic: str, key: str) -> None:
        store = self.objects
        assert store is not None
        self.observer.object_deleted(topic, key)
        self.world.log(f"delete object {key}")

        def done(error: StoreError | None) -> None:
            if error is None:
                self.tier_stats["orphans_deleted"] += 1

        store.delete(key, done)

    def _read_object(self, incarnation: int, read: ReadObject, attempt: int) -> None:
        """As the runtime: a range GET, decoded and verified; the store's failures are
        retried with a doubling delay, and only data that does not verify (or a store that
        fails `OBJECT_READ_ATTEMPTS` times in a row) stops the topic."""
        store, plan = self.objects, read.plan
        assert store is not None
        if self._alive(incarnation) is None:
            return
        if attempt == 0:
            self.tier_stats["object_reads"] += 1

        def done(data: bytes | None, error: StoreError | None) -> None:
            core = self._alive(incarnation)
            if core is None:
                return
            if error is not None:
                self.world.log(f"object_read_failed {plan.key} {error.value}")
                self.tier_stats["object_read_failures"] += 1
                if attempt + 1 < OBJECT_READ_ATTEMPTS:
                    delay = min(200_000 << attempt, 5_000_000)
                    self.world.at(delay, lambda: self._read_object(incarnation, read, attempt + 1))
                    return
                reason = f"object {plan.key} cannot be read: {error.value}"
                step = core.wal_read_failed(read, reason, missing=False, now_ms=self.now_ms)
            else:
                assert data is not None
                try:
                    records = decode_object_read(plan, data)
                except format.WalFormatError as failure:
                    reason = f"object {plan.key} does not verify: {failure}"
                    step = core.wal_read_failed(read, reason, missing=False, now_ms=self.now_ms)
                else:
                    self.observer.object_served(read.topic, plan.from_offset, records)
                    step = core.wal_read_done(read, records, now_ms=self.now_ms)
            self._apply(step.effects)

        store.get_range(plan.key, plan.start_byte, plan.end_byte, done)


def _answered(reply: Reply, response: Any) -> Callable[[Any], None]:
    """A flow's end as the reply: its refusal, or `response`."""

    def done(answer: Any) -> None:
        reply(answer if isinstance(answer, DanubeError) else response)

    return done


def _describe(request: Any) -> str:
    """One trace line's worth of a request."""
    if isinstance(request, pb.StreamMessage):
        return f"SendMessage payload={request.payload.decode(errors='replace')}"
    if isinstance(request, (pb.AckRequest, pb.NackRequest)):
        return f"{type(request).__name__} offset={request.msg_id.topic_offset}"
    if isinstance(request, ext_pb.PublishBatch):
        return f"PublishBatch sequence={request.sequence}"
    return type(request).__name__
