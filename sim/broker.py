"""One simulated broker: the real `BrokerCore` (with its WAL and dispatch machines) and the
real request translation of `danube.machines.node.requests`, driven by simulated I/O instead of
trio.

It does what `danube.runtime.broker` does with the core's effects, with the disk and the
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

import gc
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from danube.interpreter import Interpreter
from danube.kernels import find_frame, scan_frames
from danube.machines.dispatch import QueueLimits
from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.memory.budget import MemoryPools
from danube.machines.memory.publish import PublishPool
from danube.machines.memory.rss import HIGH_WATER
from danube.machines.node import requests
from danube.machines.node.core import (
    BrokerCore,
    BrokerIdentity,
)
from danube.machines.node.phase import TopicPhase
from danube.machines.requests import receive
from danube.machines.requests.publish import BatchRequest
from danube.machines.requests.receive import Receiver, Send
from danube.machines.tiering import (
    UploaderConfig,
)
from danube.machines.wal import format, records
from danube.machines.wal.batches import check_batch, stamp
from danube.machines.wal.checkpoint import encode_checkpoint, next_mark
from danube.machines.wal.machine import (
    WalConfig,
    Write,
)
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from danube.values.config import Policies
from danube.values.errors import DanubeError, ErrorCode
from sim.broker_io import SimPort
from sim.connections import SimConnections
from sim.disk import SimDisk, SimFile

if TYPE_CHECKING:
    from sim.audit_output import AuditOutput  # pyarrow: only with the audit extra
from sim.broker_checks import (
    HeldPastGrace,
    expired_early,
    expired_for_idleness,
    held_records,
    paused_in_vain,
    relieve_pool,
    squeezed_room,
)
from sim.broker_observer import Observer, SubscriptionRecordView
from sim.faults import Faults, Injected
from sim.late_timers import late_timers
from sim.network import Network, Stream
from sim.objects import SimObjectStore
from sim.requests import (
    AckBatchRequest,
    AckRequest,
    Answer,
    ConsumerRequest,
    ConsumerResponse,
    NackRequest,
    ProducerRequest,
    ProducerResponse,
    PublishBatch,
    SimRequests,
)
from sim.world import US_PER_MS, World

URL = "http://sim-broker:6650"
_DECODED_KEPT = 4096
_LOADING_PHASES = (TopicPhase.LOADING, TopicPhase.UNLOADING_LOADING)
"""Decoded records `SimBroker._decoded` keeps (a few seconds' worth)."""
TICK_US = 50_000
LOAD_SWEEP_WIDTH = 1
"""A restart's sweep loads one stored topic at a time (`deferred_loads`; the broker's is
wider): with two topics or more, clients come back to topics whose load has not started,
whose first use must start it (issue 23)."""
EPOCH_MS = 1_795_000_000_000
"""Where the broker's wall clock starts (November 2026), so clock jumps stay realistic."""


_kernels_warm = False


def warm_kernels() -> None:
    """Calls each numba kernel the broker's machines use (`danube.kernels`) once, with the
    argument types they get, so their first call in the process (which loads the compiled
    code and initialises numba's compiler, 0.3-0.5 s) falls into a run's set-up, not into its
    load phase, whose wall time measures the simulator's speed. Draws nothing from any RNG.

    Then it moves every object alive (modules, numba's and numpy's state: hundreds of
    thousands) out of reach of the cyclic garbage collector (`gc.freeze`): a run allocates
    enough to start a full collection every few simulated seconds, and each walked all of
    them (about a tenth of a run's time, measured with `gc.callbacks`)."""
    global _kernels_warm
    if _kernels_warm:
        return
    _kernels_warm = True
    message = records.encode(records.Record(payload=b"w", producer_name="w", has_msg_id=False))
    frame = format.encode_frame(0, 0, [message, message])
    header = format.encode_segment_header("/default/warm", 0, 0)
    for segment in (header + frame, memoryview(header + frame)):
        format.scan_segment(segment)
    for data in (frame, memoryview(frame)):
        scan = scan_frames(data, 0, len(frame), 0)
        format.decode_frame(data, int(scan.positions[0]))
        find_frame(data, 0, len(frame))
    stamp(check_batch(frame), 1, 1, 1, "/default/warm", URL)
    encode_checkpoint(next_mark(None, 2))
    gc.freeze()  # no collection first: it would cost more than the garbage it frees


class Reply:
    """Where a request's answer goes (the client's callback, over the network)."""

    def __init__(self, network: Network, client: str, deliver: Callable[[Any], None]) -> None:
        self._network = network
        self._client = client
        self._deliver = deliver
        self.done = False

    def __call__(self, answer: Any) -> None:
        if self.done:
            world = self._network.world
            world.log(f"reply {self._client} again")
            if world.answered_twice is not None:
                world.answered_twice(self._client)
            return
        if not self.done:
            self.done = True
            shown = f"error {answer.code.name}" if isinstance(answer, DanubeError) else "ok"
            self._network.world.log(f"reply {self._client} {shown}")
            self._network.send(self._client, partial(self._deliver, answer))

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
    receiver: Receiver
    batched: bool = False
    """A `ReceiveBatches` stream: each turn goes out as one `MessageBatch`."""
    pumping: bool = False


PRESSURE_LEFT = 512
"""What the memory-pressure fault leaves free of the publish pool: room for one small publish
(so some go on) and not for a batch (so streams pause)."""


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
        memory: MemoryPools | None = None,
    ) -> None:
        """`objects` and `uploads` together turn the object tier on. `memory`: the broker's
        pools, whose cache pool bounds every topic's hot cache together."""
        warm_kernels()
        self.world = world
        self.network = network
        self.disk = disk
        self.faults = faults
        self.injected = injected
        self.wal_config = wal_config
        self.observer = observer
        self.audit: AuditOutput | None = None
        """Where a run for the Spark audit logs what the broker settled (`sim/audit_output.py`)."""
        self.max_unacked = max_unacked
        self.memory = memory
        self.metadata: dict[str, Any] = {} if metadata is None else metadata
        self.objects = objects
        self.uploads = uploads
        self.tier_stats: Counter[str] = Counter()
        self.memory_returns: list[tuple[int, int, int, bool, bool]] = []
        """(incarnation, simulated ms, accounted bytes whose fall decided it, whether RSS was
        over its mark then, whether it was full) of each `ReturnMemory` (spec/memory.md,
        "Giving memory back")."""
        self.rss_over = 0
        """Bytes the synthetic RSS is over the high-water mark while the memory-pressure
        fault lasts (0: RSS follows what the pools account, under the mark)."""
        self._landed: set[str] = set()
        """Objects uploaded since the last crash whose index entry is not committed yet."""
        self._left: set[str] = set()
        """Objects a crash left without an index entry, until an upload commits them."""
        self.clock_skew_ms = 0
        self.incarnation = 0
        self.up = False
        self.core: BrokerCore | None = None
        self.port: SimPort | None = None
        self.interpreter: Interpreter | None = None
        self.requests = SimRequests(self)
        self._streams: dict[int, OpenStream] = {}
        self.connections = SimConnections()
        """The incarnation's connection gate (the `connection_flood` fault, sim/connections.py)."""
        """By generation."""
        self._current: dict[int, int] = {}
        """consumer id -> generation of its newest stream."""
        self.stopped_topics: dict[str, str] = {}
        self._records: dict[bytes, tuple[records.Record, str]] = {}
        """Stored records decoded lately (`_decoded`)."""
        self.expired_producers = 0
        self.subscriptions_let_go = 0
        """Producers removed for idleness, subscriptions that let go of their records, over
        every incarnation (`--departing`)."""
        self._let_go_mark: tuple[BrokerCore | None, int] = (None, 0)
        self._held_past_grace = HeldPastGrace()
        self.producer_seen: dict[int, int] = {}
        """Producer id -> the broker's monotonic ms when it last created, published or
        health-checked it (a request that reached a core knowing the producer): what
        invariant 20 judges an idleness removal by."""

    @property
    def now_ms(self) -> int:
        """The broker's wall clock: an epoch-like start, the simulated time, and any injected
        clock jumps."""
        return EPOCH_MS + self.world.now // US_PER_MS + self.clock_skew_ms

    @property
    def monotonic_ms(self) -> int:
        """The broker's monotonic clock: the simulated time, which clock jumps never move
        (the runtime's `io_port.monotonic_ms`)."""
        return self.world.now // US_PER_MS

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.incarnation += 1
        self.world.log(f"broker start incarnation={self.incarnation}")
        self.observer.restarted()
        core = self.core = self._new_core()
        core.logs.deferred.width = LOAD_SWEEP_WIDTH
        self.port = SimPort(self, self.incarnation)
        self.interpreter = Interpreter(core, self.port, objects=self.objects is not None)
        self._streams, self._current = {}, {}
        self.connections = SimConnections()  # a new process: no connection survives
        self.requests.in_flight = 0  # the last incarnation's flows are never answered
        self.up = True  # the port performs for a live incarnation only
        restored = core.restore(self.metadata)
        self._apply(core.bootstrap(["default"]).effects)
        self._apply(restored.effects)  # the first sweep loads: the rest on use or later
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
            memory=self.memory,
            **options,
        )

    def recovered(self) -> bool:
        """Up, with every stored topic's WAL loaded or given up on: no deferred load left to
        start and no topic still loading (`deferred_loads`). The final check waits for it: a
        lazily recovered topic is repaired, or stopped as damaged, by its load, not by the
        restart itself."""
        core = self.core
        if core is None or core.logs.deferred.left:
            return False
        return not any(
            record.phase in _LOADING_PHASES for record in core.catalogue.topics_by_name.values()
        )

    def loading(self) -> tuple[list[str], int]:
        """The topics still loading and the deferred loads not started (what keeps
        `recovered` False)."""
        core = self.core
        if core is None:
            return [], 0
        topics = core.catalogue.topics_by_name
        still = [t for t, r in topics.items() if r.phase in _LOADING_PHASES]
        return sorted(still), core.logs.deferred.left

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
        port, self.port = self.port, None
        if self.interpreter is not None:
            self.interpreter.close()
            self.interpreter = None
        if self._landed:
            if fault:
                self.injected["orphan_left"] += len(self._landed)
            self.world.log(f"orphans left {sorted(self._landed)}")
            self._left.update(self._landed)
            self._landed.clear()
        for topic, torn in (port.writing if port is not None else {}).items():
            if self.world.rng.random() < 0.5:
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
        transport = self._transport_open()
        core.transport_open(*transport)  # as the runtime reports its gRPC streams and connections
        remembered = len(core.producers.remembered)  # charged as the tick begins
        idle_ms = core.producers.idle.idle_ms
        producers = set(core.producers.by_id) if idle_ms else set()
        rss = self._synthetic_rss(core)
        effects = core.tick(self.now_ms, self.monotonic_ms, rss=rss).effects
        if producers:
            self.observer.producers_checked(expired_early(core, producers, self))
            self.expired_producers += sum(
                1 for p in producers.difference(core.producers.by_id)
                if expired_for_idleness(core, p)
            )  # fmt: skip
        marked, count = self._let_go_mark
        self.subscriptions_let_go += core.departed.let_go - (count if marked is core else 0)
        self._let_go_mark = (core, core.departed.let_go)
        self.observer.timers_checked(late_timers(core, self.now_ms))
        # judged as the tick left them: its effects may answer publishes, whose room
        # goes to paused reads at the next tick
        in_vain = paused_in_vain(core) if core.logs.consumer_pool is not None else []
        if effects:  # most ticks: nothing for the interpreter (it would only run nothing)
            self._apply(effects)
        self.observer.connections_checked(self.connections, self.world.now)
        ledger = core.cache_ledger
        if ledger is not None:
            self.observer.memory_checked(ledger.pool, ledger.total, core.cached_bytes_held())
            topics = core.catalogue.topics_by_name
            subscriptions = sum(len(r.subscriptions) for r in topics.values())
            state = core.state_pool
            costs = state.costs if state is not None else (0, 0, 0)
            transport_costs = state.transport_costs if state is not None else (0, 0)
            self.observer.state_checked(
                core.state_counts(),
                subscriptions,
                ledger.state,
                costs,
                transport,
                transport_costs,
                remembered,
            )
            if core.logs.consumer_pool is not None:
                held = held_records(core)
                held[1].extend(self._held_past_grace(core, self.monotonic_ms))
                self.observer.held_checked(core.logs.consumer_pool.used, held)
                self.observer.paused_checked(in_vain)
            returning = core.pools.memory_return
            if returning is not None:
                self.observer.returns_checked(self.memory_returns, returning.drop_bytes)
            self.observer.idle_checked(ledger, self.monotonic_ms)
            if rss is not None and core.memory is not None:
                self.observer.rss_checked(ledger, rss, int(core.memory.budget * HIGH_WATER))
        self.publish_checked(idle=not self.requests.in_flight)
        self.world.at(TICK_US, lambda: self._tick(incarnation))

    def publish_checked(self, *, idle: bool = False) -> None:
        """Invariant 18 over the publish pool too (`Observer.publish_pool_checked`)."""
        core = self.core
        pool = core.publish_pool if core is not None else None
        if core is None or pool is None or core.memory is None or core.cache_ledger is None:
            return
        pools = core.memory.cache + core.memory.publish
        ledger = core.cache_ledger
        cached = ledger.total + ledger.state
        lent = ledger.consumers + squeezed_room(pool, ledger)  # both shrink the capacity
        self.observer.publish_pool_checked(pool, cached, pools, idle, lent)
        held = core.logs.consumer_pool
        state = core.state_pool
        over_share = max(0, ledger.state - state.limit) if state is not None else 0
        self.observer.budget_checked(
            (
                ledger.total,
                ledger.state,
                pool.used,
                held.used + held.queued if held is not None else 0,
            ),
            core.memory.budget,
            over_share,
        )

    def connection_flood(self, rng: random.Random) -> None:
        """The `connection_flood` fault (sim/connections.py), against a live incarnation."""
        if not self.up:
            return
        count = self.connections.flood(rng, self.world.now, self.world.at)
        self.injected["connection_flood"] += 1
        self.world.log(f"fault connection_flood {count} idle connections")
        self.observer.connections_checked(self.connections, self.world.now)

    def memory_pressure(self, duration_us: int) -> None:
        """The memory-pressure fault: for `duration_us` memory outside the pools leaves the
        publish pool only `PRESSURE_LEFT` bytes of the room it had free, and the process's
        RSS (synthetic, `_synthetic_rss`) is over its high-water mark by half the cache
        pool: the caches give way to it, then recover."""
        core = self.core
        pool = core.publish_pool if self.up and core is not None else None
        if pool is None or core is None or core.memory is None:
            return
        pool.pressure = max(0, pool.capacity - pool.used - PRESSURE_LEFT)
        self.rss_over = max(1, core.memory.cache // 2)
        self.injected["memory_pressure"] += 1
        self.world.log(
            f"fault memory_pressure {pool.pressure} bytes, RSS {self.rss_over} over its mark, "
            f"for {duration_us} us"
        )
        self.world.at(duration_us, lambda: self._relieved(pool))

    def _relieved(self, pool: PublishPool) -> None:
        self.rss_over = 0
        relieve_pool(pool)

    def _synthetic_rss(self, core: BrokerCore) -> int | None:
        """The RSS fed to a tick: what the pools account, capped under the high-water mark
        (the simulated process holds nothing else), or the mark and `rss_over` more while
        the memory-pressure fault lasts; None without a budget."""
        memory, ledger, publish = core.memory, core.cache_ledger, core.publish_pool
        if memory is None or ledger is None or publish is None:
            return None
        high = int(memory.budget * HIGH_WATER)
        if self.rss_over:
            return high + self.rss_over
        held = core.logs.consumer_pool.used if core.logs.consumer_pool is not None else 0
        return min(high, ledger.total + ledger.state + publish.used + held)

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
            kind = type(request)
            if kind is records.Record:  # a SendMessage
                self._seen(core, request.producer_id)
                flow = self.requests.publish_one(request)
                self.requests.run(flow, _answered(reply, Answer(request.request_id)))
            elif kind is AckRequest:
                flow = self.requests.ack_one(request)
                self.requests.run(flow, _answered(reply, Answer(request.request_id)))
                self._acked(core, request.topic_name, request.subscription_name)
            elif kind is PublishBatch:
                self._seen(core, request.producer_id)
                batch = BatchRequest(request.producer_id, request.topic_name, request.frame)
                flow = self.requests.publish_batch(batch)
                self.requests.run(flow, _answered(reply, Answer(request.sequence)))
            elif kind is AckBatchRequest:
                flow = self.requests.ack(
                    request.topic_name, request.subscription_name, request.offsets
                )
                self.requests.run(flow, _answered(reply, Answer(request.request_id)))
                self._acked(core, request.topic_name, request.subscription_name)
            elif kind is NackRequest:
                flow = self.requests.nack_one(request)
                self.requests.run(flow, _answered(reply, Answer(request.request_id)))
                self._retry_scheduled(core, request)
            elif kind is ProducerRequest:
                step = requests.create_producer(core, request)
                self._apply(step.effects)
                self._seen(core, step.value)
                reply(ProducerResponse(request.request_id, step.value, request.producer_name))
            elif kind is ConsumerRequest:
                self._subscribe(request, stream.get("start"), reply)
            elif isinstance(request, pb.HealthCheckRequest):
                healthy = core.producer_healthy(request.id)
                if healthy:
                    self.producer_seen[request.id] = self.monotonic_ms
                status = pb.HealthCheckResponseClientStatus
                reply(pb.HealthCheckResponse(status=status.OK if healthy else status.CLOSE))
            elif isinstance(request, pb.ReceiveRequest):
                self._open_stream(core, request.consumer_id, reply, None, **stream)
            elif isinstance(request, ext_pb.ReceiveBatchesRequest):
                self._open_stream(core, request.consumer_id, reply, request.max_messages, **stream)
            else:
                raise TypeError(f"unexpected request {type(request).__name__}")
        except DanubeError as error:
            reply(error)
        except Exception as error:  # answered INTERNAL, as the gRPC services do
            reply(self.internal_error(_describe(request), error))

    def _seen(self, core: BrokerCore, producer_id: int) -> None:
        if producer_id in core.producers.by_id:
            self.producer_seen[producer_id] = self.monotonic_ms

    def _acked(self, core: BrokerCore, topic: str, subscription: str) -> None:
        """Invariant 18 after acknowledgements: the reads they let go on went on."""
        if core.logs.consumer_pool is not None and core.memory is not None:
            self.observer.paused_checked(paused_in_vain(core, (topic, subscription)))

    def _retry_scheduled(self, core: BrokerCore, request: Any) -> None:
        """Tells the observer when a nacked message goes out again (the backoff's cap)."""
        record = core._topics.get(request.topic_name)
        sub = record.subscriptions.get(request.subscription_name) if record is not None else None
        if sub is None or record is None or not record.reliable:
            return
        machine = cast(ReliableSubscription, sub.machine)  # an observer: not a touch
        due = machine.retry_due(request.topic_offset)
        if due is not None:
            self.observer.retry_scheduled(
                request.topic_name, request.subscription_name, request.topic_offset,
                due - machine._now, machine.policy.max_redelivery_delay_ms,
            )  # fmt: skip

    def _subscribe(self, request: ConsumerRequest, start: Any, reply: Reply) -> None:
        def done(answer: Any) -> None:
            if isinstance(answer, DanubeError):
                reply(answer)
            else:
                reply(ConsumerResponse(request.request_id, answer, request.consumer_name))

        self.requests.run(self.requests.subscribe(request, start), done)

    # -- hooks of the request flows (`sim.requests`) ----------------------------------------

    def internal_error(self, request: Any, error: Exception) -> DanubeError:
        """`request` (a flow, or its description) failed with `error`, which no rule foresaw:
        the observer hears of it, and the client gets what production answers, INTERNAL."""
        what = request if isinstance(request, str) else getattr(request, "__name__", "a flow")
        self.world.log(f"internal error in {what}: {type(error).__name__}: {error}")
        self.observer.internal_error(what, error)
        return DanubeError(ErrorCode.INTERNAL, "internal broker error (see broker log)")

    def apply_step(self, step: Any) -> None:
        """A flow's `Apply`: the core step's effects, metadata durable at once."""
        self._apply(step.effects)

    def wait_for_storage(self, topic: str, through: int, waiter: Any) -> None:
        """A flow's storage wait joins the interpreter's table of waiting publishes."""
        self.wait_stored(topic, through, waiter)

    def _open_stream(
        self,
        core: BrokerCore,
        consumer_id: int,
        reply: Reply,
        max_messages: int | None,
        *,
        client: str,
        on_message: Callable[[records.Record], None],
        on_end: Callable[[str], None],
        **_: Any,
    ) -> None:
        """`max_messages`: None for a plain `ReceiveMessages` stream, else a
        `ReceiveBatches` one's (0: the broker's default)."""
        batched = max_messages is not None
        limit = receive.turn_limit(max_messages, receive.RECEIVE_BATCH if batched else 0)
        receiver = Receiver(core, consumer_id, limit)
        step = receiver.open(self.now_ms)
        wire = self.network.open_stream(client)
        stream = OpenStream(consumer_id, step.value, wire, on_message, on_end, receiver, batched)
        self._streams[step.value] = stream
        self._current[consumer_id] = step.value
        reply(step.value)
        self._apply(step.effects)
        self._pump(stream)

    def _transport_open(self) -> tuple[int, int]:
        """Open receive streams and the clients holding them: what the runtime reports to the
        core at each tick (its gRPC streams and connections, spec/memory.md "State")."""
        streams = self._streams.values()
        idle = self.connections.gate.open  # the flood's idle connections the gate keeps
        return len(streams), len({stream.wire.client for stream in streams}) + idle

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
        self._close(stream)
        # the client notices a broken connection a little later
        self.world.at(self.network.latency() * 4, lambda: stream.on_end(why))

    def _close(self, stream: OpenStream) -> None:
        """The stream ended, whatever ended it: the core hears it once (as in production's
        `serve_consumer`), if this incarnation opened it."""
        if self.up and self.core is not None and stream.receiver.core is self.core:
            closed = stream.receiver.close(self.now_ms)
            if closed is not None:
                self._apply(closed.effects)

    def _pump(self, stream: OpenStream) -> None:
        """The stream writer: sends what the consumer's queue holds (`Receiver.turn`
        decides how much, and when the stream is over)."""
        core = self.core
        if core is None or stream.pumping or self._streams.get(stream.generation) is not stream:
            return
        turn = stream.receiver.turn()
        if not isinstance(turn, Send):
            return
        view = self._subscription_view(stream.consumer_id)
        log, sent, consumer_id = self.world.log, self.observer.sent, stream.consumer_id
        head, tail = f"send {view.name} offset=", f" to {stream.wire.client}"
        sending = []
        for item in turn.items:
            record, key = self._decoded(item)  # what the consumer's client decodes
            offset = record.topic_offset
            log(f"{head}{offset}{tail}")
            sent(record.topic_name, view, consumer_id, offset, key)
            if stream.batched:
                sending.append(record)
            elif not self.network.stream_send(stream.wire, partial(stream.on_message, record)):
                self._break(stream, "stream broken")
                return
        if sending and not self.network.stream_send(
            stream.wire, lambda rs=sending: [stream.on_message(r) for r in rs]
        ):
            self._break(stream, "stream broken")
            return
        stream.pumping = True

        def again() -> None:
            stream.pumping = False
            self._pump(stream)

        self.world.at(0, again)

    def _decoded(self, item: bytes) -> tuple[records.Record, str]:
        """The record of a stored one, and its Key-Shared key: decoded once for all the
        subscriptions that send it (and its redeliveries); nobody changes a delivered
        record."""
        found = self._records.get(item)
        if found is None:
            if len(self._records) >= _DECODED_KEPT:
                self._records.clear()
            record = records.decode(item)
            found = self._records[item] = (record, record.key.decode())
        return found

    def _subscription_view(self, consumer_id: int) -> SubscriptionRecordView:
        core = self.core
        assert core is not None
        record = core._consumers[consumer_id]
        sub = core._topics[record.topic.full].subscriptions[record.subscription]
        machine = sub.machine  # an observer: `sub.dispatcher` would touch the topic
        dispatcher = machine if isinstance(machine, ReliableSubscription) else None
        return SubscriptionRecordView(sub.name, sub.sub_type, dispatcher)

    # -- effects ----------------------------------------------------------------------------------

    def _apply(self, effects: Any) -> None:
        """The interpreter carries the core's effects out on this incarnation's port."""
        assert self.interpreter is not None
        self.interpreter.apply(effects)

    def wait_stored(self, topic: str, through: int, waiter: Any) -> None:
        """`waiter.ok()` once the WAL acknowledged offsets up to `through` of `topic`,
        `waiter.fail(error)` when they are lost (the interpreter's waiter table, as
        production's `BrokerRuntime.start_publish`). Call before applying the step."""
        assert self.interpreter is not None
        self.interpreter.wait_stored(topic, through, waiter)

    def wake(self, consumer_id: int) -> None:
        generation = self._current.get(consumer_id)
        stream = self._streams.get(generation) if generation is not None else None
        if stream is not None:
            self.world.at(0, lambda s=stream: self._pump(s))

    def end_stream(self, generation: int) -> None:
        """The core ended the stream (a takeover, its topic gone): the client hears the end
        and, as production's stream writer does on its way out, the core hears it closed
        (after the effect at hand)."""
        stream = self._streams.pop(generation, None)
        if stream is not None:
            if not self.network.stream_send(stream.wire, lambda s=stream: s.on_end("ended")):
                # the end was lost with the connection: the client notices the break later,
                # as `_break` has it (else it would wait on a stream that no longer exists)
                self.world.at(
                    self.network.latency() * 4, lambda s=stream: s.on_end("stream broken")
                )
            self.world.at(0, lambda s=stream: self._close(s))

    def landed(self, key: str) -> None:
        """An uploaded object landed in the store; its index entry is not committed yet."""
        self._landed.add(key)
        self.world.log(f"object landed {key}")

    def adopted(self, key: str) -> None:
        """An index entry naming `key` was committed."""
        self._landed.discard(key)
        if key in self._left:
            self._left.discard(key)
            self.tier_stats["orphans_adopted"] += 1

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


def _answered(reply: Reply, response: Any) -> Callable[[Any], None]:
    """A flow's end as the reply: its refusal, or `response`."""

    def done(answer: Any) -> None:
        reply(answer if isinstance(answer, DanubeError) else response)

    return done


def _describe(request: Any) -> str:
    """One trace line's worth of a request."""
    kind = type(request)
    if kind is records.Record:
        return f"SendMessage payload={request.payload.decode(errors='replace')}"
    if kind is AckRequest or kind is NackRequest:
        return f"{kind.__name__} offset={request.topic_offset}"
    if kind is PublishBatch:
        return f"PublishBatch sequence={request.sequence}"
    return kind.__name__
