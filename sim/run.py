"""One simulation run: a broker, its clients, the fault clock, a drain phase and the final
checks. Everything random comes from the world's one RNG, seeded by `--seed`. A tiered run
adds a simulated object store, uploads, local retention and a late `audit` subscription that
reads the whole history from the start, most of it from objects; with `history_every_ms`,
history readers (sim/history_readers.py) keep starting such subscriptions all through the
load."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from danube.machines.dispatch.reliable import DEFAULT_POLICY, ReliableSubscription
from danube.machines.dispatch.types import StartKind, StartPosition, SubscriptionType
from danube.machines.memory.budget import MemoryPools
from danube.machines.tiering import UploaderConfig, layout
from danube.machines.wal.machine import Durability, WalConfig
from danube.proto import danube as pb
from danube.values.config import DispatchStrategy
from danube.values.names import parse_topic
from sim.broker import EPOCH_MS, SimBroker
from sim.checker import InvariantChecker, Violation
from sim.clients import SimBatchConsumer, SimBatchProducer, SimConsumer, SimProducer
from sim.disk import SimDisk
from sim.faults import FAULT_TICK_US, Faults, Injected
from sim.history_readers import HistoryReaders
from sim.network import Network
from sim.objects import SimObjectStore, StoredBlob, impostor_segment
from sim.operator import Operator
from sim.poison import POISON_KEY, PoisonDuty
from sim.seeds import ResultMethods, changed_flags
from sim.world import US_PER_MS, US_PER_S, World

if TYPE_CHECKING:
    from sim.audit_output import AuditOutput

SUB_TYPES = {kind.name.lower(): kind for kind in SubscriptionType}
NO_PROGRESS_US = (
    DEFAULT_POLICY.ack_timeout_ms + DEFAULT_POLICY.max_redelivery_delay_ms + 10_000
) * US_PER_MS
"""How long the drain waits for a new first delivery before it judges the backlog stuck
(invariant 4b): 100 s. Once the faults stop, the longest a working subscription goes without
one is a message whose consumer will never answer (its stream or its ack was lost) failing at
its ack timeout (30 s) and then waiting its redelivery delay (at most 60 s under Danube's
backoff; an Exclusive or Failover subscription sends nothing new meanwhile), plus 10 s for
consumers to reconnect and the broker to restart. The operator's policies are all shorter.
A clock the faults set back adds its deficit (`_clock_deficit_us`). The drain has no total
limit: it runs as long as it makes progress, so an overloaded run drains its backlog."""
CURSOR_CHECK_US = 100 * US_PER_MS
"""How often the dispatchers' cursors are judged (invariant 4): a skipped message is
reported within this much simulated time, not at the end."""
SIM_STATE = (64, 32, 32)
"""Accounted bytes of a topic, a subscription, a consumer in the simulated broker: its pools
are kilobytes, so state costs scale down with them (spec/memory.md, "State"); small enough
that the workload's setup is never refused (it would not retry)."""
SIM_TRANSPORT = (16, 32)
"""Accounted bytes of an open receive stream and of a client holding one in the simulated
broker (the real ones: 18 KiB and 40 KiB), scaled down like `SIM_STATE`."""

AUDIT = "audit"
"""Tiered runs: an Exclusive subscription created halfway through, starting at the earliest
offset, after local retention pruned the start of the history."""
UPLOADS = UploaderConfig(
    max_in_flight=2,
    retry_base_ms=200,
    retry_max_ms=3_000,
    index_interval_bytes=256,
    orphan_scan_interval_ms=1_000,
    orphan_grace_ms=2_000,
)
"""Scaled to a run of seconds: two uploads at a time (commits still go in order), retries
within a second or so, several sparse-index pairs per object, and orphan scans often enough to
collect within the run. The sparse index gets a pair every 256 bytes, several per 1 KiB
segment of `TIERED`."""


@dataclass(frozen=True, slots=True)
class Workload:
    topics: int = 1
    producers: int = 2
    """Per topic."""
    rate: float = 10.0
    """Messages per second per producer (one at a time, as Danube's clients send). The
    default offers 20 a second per topic, under what each subscription takes under the default
    faults, so a backlog stays bounded however long the run: an Exclusive subscription with
    Danube's window and 2 % nacks (each stalls it for the 1 s redelivery delay) takes about
    44 a second without faults, far less while clock jumps freeze its timers; Key-Shared
    (one message per key in flight) is the slowest under faults. `--rate 100` (the default
    before issue 22) overloads the subscriptions on purpose: the drain then takes minutes of
    simulated time, and passes as long as it makes progress (invariant 4b)."""
    subscriptions: tuple[str, ...] = ("exclusive", "shared", "failover", "key_shared")
    consumers: int = 2
    """Per subscription."""
    keys: int = 8
    durability: str = "fsync"
    synced_writes: bool = False
    """The WAL driver fsyncs each write before reporting it done, as the broker's does
    (`WalConfig.synced_writes`): no Fsync follows a write under `fsync` durability."""
    max_unacked: int = 10
    ack_delay_ms: int = 20
    nack: float = 0.02
    segment_bytes: int = 64 * 1024
    cache_bytes: int = 16 * 1024
    """Small, so lagging subscriptions read segment files."""
    cache_pool: int = 24 * 1024
    """The broker-wide pool every topic's hot cache shares (spec/memory.md), in accounted
    bytes: below `topics × cache_bytes` once there are two topics, so the ledger evicts
    across topics. 0: no ledger (each topic bounded by `cache_bytes` alone)."""
    tiered: bool = False
    """An object tier: sealed segments go to a simulated object store and its index, local
    retention prunes what is indexed, and an `audit` subscription reads from the start."""
    retention_bytes: int = 0
    """Tiered runs: local retention keeps about this many bytes of segments (0: all)."""
    operator: float = 0.0
    """Chance per fault tick that an operator changes a subscription's window, failure
    policy or dispatch rate while the load runs (sim/operator.py)."""
    batched: float = 0.5
    """Chance that a producer publishes on the batched path (`PublishBatches`, up to
    `batch` messages a request) and that a consumer acknowledges with `AckBatch`: the seed
    chooses the mix, as real deployments mix our client (batched) and others (plain).
    0 draws nothing from the seed: plain clients only."""
    batch: int = 8
    poison: str = ""
    """"drop", "block" or "dead_letter": every consumer nacks the messages of one routing
    key, and each subscription's failure policy drops, blocks or dead-letters them after
    `poison_limit` redeliveries
    (sim/poison.py). "" (the default): no poison, digests as before."""
    poison_limit: int = 2
    departing: bool = False
    """Clients leave and come back (spec/memory.md, "Departed clients"): producers
    health-check every 250 ms and now and then go silent for 1 to 6 s (half of them only
    pause their publishes and keep health-checking), against a producer idle timeout of
    `DEPARTING_IDLE_MS`, and consumers close their stream for as long, against the consumer
    pool's grace of `DEPARTING_GRACE_MS`. False (the default): digests as before."""
    history_every_ms: int = 0
    """Tiered runs: once local retention pruned a segment, a new Exclusive subscription per
    topic starts at the earliest offset every this many ms (sim/history_readers.py), so
    history is read from objects all through the load, not only by the audit. 0 (the
    default): none, digests as before."""

    def memory_pools(self) -> MemoryPools | None:
        """A budget whose cache pool is `cache_pool` and whose publish pool is an eighth of
        it (a few publishes' worth: a batch or a slow fsync makes publishes borrow from the
        cache, the memory-pressure fault makes them wait, a second at most; spec/memory.md)."""
        if not self.cache_pool:
            return None
        pool = self.cache_pool
        return MemoryPools(
            2 * pool,
            pool,
            pool // 8,
            pool - pool // 8,
            publish_wait_ms=1_000,
            state_costs=SIM_STATE,
            transport_costs=SIM_TRANSPORT,
            producer_idle_ms=DEPARTING_IDLE_MS if self.departing else 0,
            departed_grace_ms=DEPARTING_GRACE_MS if self.departing else 10_000,
        )

    def wal_config(self) -> WalConfig:
        return WalConfig(
            durability=Durability(self.durability),
            segment_bytes=self.segment_bytes,
            cache_bytes=self.cache_bytes,
            flush_interval_ms=200,
            synced_writes=self.synced_writes,
            retention_bytes=self.retention_bytes if self.tiered and self.retention_bytes else None,
        )


DEPARTING_IDLE_MS = 3_000
"""`--departing`: the producer idle timeout, twelve health intervals as the broker's default
(60 s against Danube's 5 s), scaled to the simulation's short runs."""
DEPARTING_GRACE_MS = 2_000
"""`--departing`: the consumer pool's grace before a subscription with no connected consumer
lets go of what it holds (10 s in the broker), scaled down likewise."""

TIERED = Workload(tiered=True, segment_bytes=1024, retention_bytes=1024)
"""What `--tiered` starts from: segments of about a dozen messages, sealed about twice a second
at the default rate, and local retention that keeps little more than the open segment, so
history moves to objects within the run."""
OVERLOAD = Workload(rate=100.0)
"""The default before issue 22 (`--rate 100`): 200 messages a second per topic, about four
times what an Exclusive subscription takes with 2 % nacks. The backlog grows all through the
load and the drain delivers it; only the drain's progress rule (invariant 4b) judges it."""


@dataclass(slots=True)
class Result(ResultMethods):
    seed: int
    duration_s: float
    digest: str
    events: int
    wall_s: float
    """The whole run: set-up, the load phase, the drain and the final restart."""
    load_wall_s: float
    """The load phase alone, which is what `duration_s` of simulated time took."""
    load_events: int
    injected: Injected
    violations: list[Violation]
    produced: int
    acknowledged: int
    received: int
    duplicates: int
    lost: dict[str, int]
    stopped_topics: dict[str, str]
    drained: bool
    drain_s: float = 0.0
    """Simulated seconds the drain ran (until everything was delivered, or no progress)."""
    owed_at_drain: int = 0
    """Acknowledged messages the judged subscriptions had not received when the drain began
    (summed over subscriptions)."""
    drain_delivered: int = 0
    """First deliveries to judged subscriptions during the drain."""
    quiet_limit_s: float = 0.0
    """The drain's bound on time without a first delivery (`NO_PROGRESS_US` plus the clock's
    deficit)."""
    tier: dict[str, int] = field(default_factory=dict)
    """Tiered runs: what the object tier did (uploads, commits, segments pruned, reads...)."""
    tier_halts: list[str] = field(default_factory=list)
    """Why uploads stopped (`TierHalted`): no invariant breaks, but history stops moving."""
    trace_tail: list[str] = field(default_factory=list)
    trace: list[str] | None = None


FINAL_RECOVERY_LIMIT_US = 120_000_000
"""How long the final restart's deferred loads may take before the final check reads the
storage anyway (a load that never ends leaves its topic unchecked by recovery, and the check
then reports what is on disk)."""


class Simulation:
    def __init__(
        self,
        seed: int,
        workload: Workload,
        faults: Faults,
        *,
        full_trace: bool = False,
        audit_dir: Path | None = None,
    ) -> None:
        """`audit_dir`: where the run leaves its client logs and storage images for the Spark
        audit (sim/audit_output.py)."""
        self.seed = seed
        self.workload = workload
        self.faults = faults
        self.world = World(seed, full_trace=full_trace)
        self.injected = Injected()
        self.disk = SimDisk()
        self.network = Network(self.world, faults, self.injected)
        self.metadata: dict[str, Any] = {}
        self.objects = (
            SimObjectStore(self.world, faults, self.injected, EPOCH_MS) if workload.tiered else None
        )
        self.impostors: set[str] = set()
        self.audit_output: AuditOutput | None = None
        if audit_dir is not None:
            from sim.audit_output import AuditOutput  # pyarrow: only with the audit extra

            self.audit_output = AuditOutput(audit_dir, self.world)
        wal = workload.wal_config()
        self.checker = InvariantChecker(
            self.world, self.disk, wal.durability, metadata=self.metadata, objects=self.objects
        )
        self.world.answered_twice = self.checker.answered_twice
        self.broker = SimBroker(
            self.world,
            self.network,
            self.disk,
            faults,
            self.injected,
            wal,
            self.checker,
            max_unacked=workload.max_unacked,
            metadata=self.metadata,
            objects=self.objects,
            uploads=UPLOADS if workload.tiered else None,
            memory=workload.memory_pools(),
        )
        self.broker.audit = self.audit_output
        self.producers: list[SimProducer] = []
        self.consumers: list[SimConsumer] = []
        self.audits: list[SimConsumer] = []
        self.subscriptions: list[tuple[str, str]] = []
        """Created before anything is published."""
        self.judged: list[tuple[str, str]] = []
        """Every subscription owed every acknowledged message (the audits too)."""
        self.topics = [f"/default/sim-{t}" for t in range(workload.topics)]
        for t, topic in enumerate(self.topics):
            if workload.tiered:
                self.judged.append((topic, AUDIT))
                self.audits.append(
                    SimConsumer(
                        self.world,
                        self.network,
                        self.broker,
                        self.checker,
                        name="a0",
                        topic=topic,
                        subscription=AUDIT,
                        sub_type=int(SubscriptionType.EXCLUSIVE),
                        ack_delay_us=workload.ack_delay_ms * US_PER_MS,
                        nack=workload.nack,
                        start=StartPosition(StartKind.EARLIEST),
                        audit=self.audit_output,
                    )
                )
            for name in workload.subscriptions:
                self.subscriptions.append((topic, name))
                self.judged.append((topic, name))
                for c in range(workload.consumers):
                    consumer = (
                        SimBatchConsumer
                        if workload.batched and self.world.rng.random() < workload.batched
                        else SimConsumer
                    )
                    self.consumers.append(
                        consumer(
                            self.world,
                            self.network,
                            self.broker,
                            self.checker,
                            name=f"c{c}",
                            topic=topic,
                            subscription=name,
                            sub_type=int(SUB_TYPES[name]),
                            ack_delay_us=workload.ack_delay_ms * US_PER_MS,
                            nack=workload.nack,
                            audit=self.audit_output,
                            poison_key=POISON_KEY if workload.poison else None,
                        )
                    )
            for p in range(workload.producers):
                options: dict[str, Any] = dict(
                    name=f"p{t}-{p}",
                    topic=topic,
                    rate=workload.rate,
                    keys=workload.keys,
                    strategy=pb.DispatchStrategy.Reliable,
                    audit=self.audit_output,
                )
                producer = SimProducer
                if workload.batched and self.world.rng.random() < workload.batched:
                    producer, options["batch"] = SimBatchProducer, workload.batch
                self.producers.append(
                    producer(self.world, self.network, self.broker, self.checker, **options)
                )
        if workload.departing:
            for client in (*self.producers, *self.consumers):
                client.departing = True
        self.history: HistoryReaders | None = None
        if workload.tiered and workload.history_every_ms:
            self.history = HistoryReaders(
                self.world,
                self.network,
                self.broker,
                self.checker,
                self.topics,
                every_us=workload.history_every_ms * US_PER_MS,
                ack_delay_us=workload.ack_delay_ms * US_PER_MS,
                nack=workload.nack,
                judged=self.judged,
            )
        self._disk_full_until = 0
        self._pruned_before_audit = 0
        self._raised = False
        """An event raised (`_run_until`): the run stops."""
        self._skew_high_ms = 0
        """The highest clock skew the broker had: a jump back freezes its machines' timers
        until its clock is past what they saw (`_clock_deficit_us`)."""
        self.operator = Operator(self.world, self.broker, self.injected, self.subscriptions)
        self.poison: PoisonDuty | None = None
        if workload.poison:
            self.poison = PoisonDuty(
                self.world,
                self.broker,
                self.checker,
                self.judged,
                workload.poison,
                workload.poison_limit,
            )
            self.operator.poison = (workload.poison, workload.poison_limit)

    def _operator_tick(self) -> None:
        if self.world.rng.random() < self.workload.operator:
            self.operator.act()
        self.world.at(FAULT_TICK_US, self._operator_tick)

    def _setup(self) -> None:
        """The topics and subscriptions exist before anything is published, so every
        acknowledged message is owed to every subscription."""
        self.broker.start()
        core = self.broker.core
        assert core is not None
        for topic in self.topics:
            self.broker._apply(core.create_topic(topic, DispatchStrategy.RELIABLE).effects)
        if self.poison is not None:
            self.poison.set_policies()
        for topic, name in self.subscriptions:
            self.broker._apply(
                core.subscribe(topic, "setup", name, int(SUB_TYPES[name]), (), now_ms=0).effects
            )

    def _fault_tick(self) -> None:
        faults, rng, world = self.faults, self.world.rng, self.world
        if faults.crash and rng.random() < faults.crash:
            self.broker.crash(power=False)
        if faults.power_failure and rng.random() < faults.power_failure:
            self.checker.power_failed()
            self.broker.crash(power=True)
        if faults.partition and rng.random() < faults.partition:
            consumers = self.consumers + self.audits
            if self.history is not None:
                consumers = consumers + self.history.consumers
            clients = [c.client for c in consumers] + [p.name for p in self.producers]
            client = rng.choice(clients)
            self.network.partition(client, faults.partition_us)
            self.broker.break_streams(client)
        if faults.disk_full and rng.random() < faults.disk_full:
            self.disk.full = True
            self._disk_full_until = world.now + 500_000
            self.injected["disk_full"] += 1
            world.log("fault disk_full")
        if self.disk.full and world.now >= self._disk_full_until:
            self.disk.full = False
        if faults.memory_pressure and rng.random() < faults.memory_pressure:
            self.broker.memory_pressure(rng.randint(1_000_000, 5_000_000))
        if faults.connection_flood and rng.random() < faults.connection_flood:
            self.broker.connection_flood(rng)
        if faults.bit_flip and rng.random() < faults.bit_flip:
            flipped = self.disk.flip_bit(rng)
            if flipped is not None:
                self.injected["bit_flip"] += 1
                world.log(f"fault bit_flip {flipped}")
        if faults.newest_damage and rng.random() < faults.newest_damage:
            self.broker.crash(power=False)
            damaged = self.disk.damage_newest(rng)
            if damaged is not None:
                self.injected["newest_damage"] += 1
                world.log(f"fault newest_damage {damaged}")
        if faults.clock_jump and rng.random() < faults.clock_jump:
            self._skew_high_ms = max(self._skew_high_ms, self.broker.clock_skew_ms)
            jump = rng.randint(-30_000, 30_000)
            self.broker.clock_skew_ms += jump
            self.injected["clock_jump"] += 1
            world.log(f"fault clock_jump {jump}ms")
        if (
            self.objects is not None
            and faults.fenced_upload
            and rng.random() < faults.fenced_upload
        ):
            self._fenced_upload()
        if (
            self.objects is not None
            and faults.s3_get_outage
            and rng.random() < faults.s3_get_outage
        ):
            self.objects.get_outage()
        self.world.at(FAULT_TICK_US, self._fault_tick)

    def _start_audits(self) -> None:
        """Halfway through: by now local retention has pruned the start of the history."""
        self._pruned_before_audit = self.broker.tier_stats["segments_pruned"]
        self.world.log(f"audit starts after {self._pruned_before_audit} segments were pruned")
        for audit in self.audits:
            audit.start()

    def _fenced_upload(self) -> None:
        """A former owner's late upload lands: an object, with records no producer sent,
        whose range starts inside the indexed history but that no entry names. It can never
        be indexed; readers must never see it and the orphan scan must delete it."""
        store, rng = self.objects, self.world.rng
        assert store is not None
        topic = rng.choice(self.topics)
        entries = self.checker.indexed(topic)
        if not entries:
            return
        start = rng.randrange(min(entries), max(e.next_offset for e in entries.values()))
        next_offset = start + rng.randint(1, 20)
        if start in entries and entries[start].next_offset == next_offset:
            next_offset += 1
        key = layout.object_key(parse_topic(topic), start, next_offset)
        data = impostor_segment(topic, range(start, next_offset), store.now_ms)
        store.objects[key] = StoredBlob(data, store.now_ms)
        self.impostors.add(key)
        self.injected["fenced_upload"] += 1
        self.world.log(f"fault fenced_upload {key}")

    def _run_until(self, end_us: int, stop: Callable[[], bool] = lambda: False) -> bool:
        """`world.run_until`, with an exception out of an event (a broker timer whose
        dispatcher state a bug corrupted: no request flow to answer INTERNAL) reported as
        invariant 16 with where it was raised; the run stops there. False when it did."""
        try:
            self.world.run_until(end_us, stop)
        except Exception as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            where = f"an event ({Path(frame.filename).name}:{frame.lineno} {frame.name})"
            self.checker.internal_error(where, error)
            self._raised = True
            return False
        return True

    def _judged_now(self) -> list[tuple[str, str]]:
        """The judged subscriptions of topics still serving."""
        poison, stopped = self.poison, self.broker.stopped_topics
        if poison is not None:  # under DeadLetter, a stopped dead-letter topic holds them too
            return [(t, s) for t, s in self.judged if not poison.halted(t)]
        return [(t, s) for t, s in self.judged if t not in stopped]

    def _drained(self) -> bool:
        """Everything acknowledged reached every subscription (of topics still serving);
        with poison, every message is settled too (acknowledged or dropped)."""
        if self.poison is not None and not self.poison.settled():
            return False
        return all(not self.checker.owed(topic, sub) for topic, sub in self._judged_now())

    def _progress(self) -> int:
        """First deliveries; with poison, settled offsets too (drops come after them)."""
        judged, checker = self._judged_now(), self.checker
        progress = sum(checker.first_deliveries(t, s) for t, s in judged)
        if self.poison is not None:
            progress += sum(len(checker.subscriptions[j].acks.offsets) for j in judged)
        return progress

    def _check_cursors(self) -> None:
        """Invariant 4 at each tick: every offset a judged subscription's cursor passed is
        acknowledged by its consumers, or its message is owed elsewhere (the checker)."""
        core = self.broker.core
        if core is not None and self.broker.up:
            topics = core._topics
            for topic, name in self.judged:
                record = topics.get(topic)
                sub = record.subscriptions.get(name) if record is not None else None
                machine = sub.machine if sub is not None else None  # not a touch
                if isinstance(machine, ReliableSubscription):
                    self.checker.cursor_at(topic, name, machine.cursor)
        self.world.at(CURSOR_CHECK_US, self._check_cursors)

    def _clock_deficit_us(self) -> int:
        """How far the broker's clock is behind the highest it showed (at most): its machines
        take a clock that went back as standing still, so their timers wait that much more."""
        return max(0, self._skew_high_ms - self.broker.clock_skew_ms) * US_PER_MS

    def _drain(self) -> dict[str, Any]:
        """No more faults or publishes: runs until every judged subscription received every
        acknowledged message, or until no subscription got a new message for the quiet limit
        (then invariant 4b is broken, if offsets are still judged)."""
        world, checker = self.world, self.checker
        for producer in self.producers:
            producer.stopped = True
        if self.history is not None:
            self.history.stopped = True
        calm = self.faults.without_faults()
        self.network.faults = calm
        self.broker.faults = calm
        if self.objects is not None:
            self.objects.faults = calm
            self.objects.gets_fail_until = 0
        self.faults = calm
        self.disk.full = False
        quiet_limit = NO_PROGRESS_US + self._clock_deficit_us()
        owed = sum(checker.owed(t, s) for t, s in self._judged_now())
        world.log(f"drain owed={owed} quiet_limit={quiet_limit // US_PER_MS}ms")
        started = last_progress = world.now
        progress = first = self._progress()
        drained = False
        while not drained:
            if not self._run_until(world.now + 100 * US_PER_MS):
                break
            drained = self._drained() and self.broker.up
            now_progress = self._progress()
            if now_progress != progress:
                progress, last_progress = now_progress, world.now
            elif world.now - last_progress >= quiet_limit:
                break
        drain_s = (world.now - started) / US_PER_S
        world.log(f"drain ends drained={drained} after {drain_s:.1f}s")
        if not drained and checker.offsets_judged:
            detail = (
                f"the drain ran {drain_s:.1f} s and delivered {progress - first} message(s) "
                f"of the {owed} owed when it began, then none for "
                f"{(world.now - last_progress) / US_PER_S:.1f} s (limit "
                f"{quiet_limit / US_PER_S:.0f} s)"
            )
            for topic, sub in self._judged_now():
                if checker.owed(topic, sub):
                    checker.backlog_stalled(topic, sub, detail)
        if self.poison is not None and checker.offsets_judged and self.broker.up:
            self.poison.judge_end()
        return dict(
            drained=drained,
            drain_s=drain_s,
            owed_at_drain=owed,
            drain_delivered=progress - first,
            quiet_limit_s=quiet_limit / US_PER_S,
        )

    def run(self, duration_s: float) -> Result:
        started = time.perf_counter()
        world = self.world
        self._setup()
        for consumer in self.consumers:
            consumer.start()
        for producer in self.producers:
            world.at(100 * US_PER_MS, producer.start)
        world.at(FAULT_TICK_US, self._fault_tick)
        world.at(CURSOR_CHECK_US, self._check_cursors)
        if self.workload.operator:
            world.at(FAULT_TICK_US, self._operator_tick)
        if self.poison is not None:
            self.poison.start()
        end = int(duration_s * US_PER_S)
        if self.audits:
            world.at(end // 2, self._start_audits)
        if self.history is not None:
            self.history.start()
        load_started, events_before = time.perf_counter(), world.events
        self._run_until(end, stop=lambda: bool(self.checker.violations))
        load_wall_s = time.perf_counter() - load_started
        load_events = world.events - events_before
        drain: dict[str, Any] = dict(drained=False)
        if not self.checker.violations:
            drain = self._drain()
        if drain.get("drain_s") is not None and not self._raised:
            # One last restart: recovery must accept what is on disk, or stop a topic whose
            # durable bytes went bad (an injected bit flip) rather than serve them.
            self.broker.crash(power=False, fault=False)
            # ... and, since recovery is lazy, once every topic's load has run: the sweep
            # repairs or stops what the restart itself no longer reads (seed 1100, tiered).
            if self._run_until(world.now + self.faults.restart_us) and self._run_until(
                world.now + FINAL_RECOVERY_LIMIT_US, stop=self.broker.recovered
            ):
                if not self.broker.recovered():
                    self.checker.recovery_unfinished(*self.broker.loading())
                self.checker.final(self.judged, self.broker.stopped_topics)
        if self.audit_output is not None:
            self.audit_output.write_storage(self.disk, self.objects, self.metadata)
        return Result(
            seed=self.seed,
            duration_s=duration_s,
            digest=world.digest,
            events=world.events,
            wall_s=time.perf_counter() - started,
            load_wall_s=load_wall_s,
            load_events=load_events,
            injected=self.injected,
            violations=list(self.checker.violations),
            produced=sum(p.sent for p in self.producers),
            acknowledged=sum(p.acknowledged for p in self.producers),
            received=sum(c.received for c in self.consumers),
            duplicates=self.checker.duplicates,
            lost={f"{t}/{s}": n for (t, s), n in self.checker.lost.items()},
            stopped_topics=dict(self.broker.stopped_topics),
            tier=self._tier_summary(),
            tier_halts=[
                f"{'resumable' if resumable else 'final'}: {reason}"
                for _, reason, resumable in self.checker.tier_halts
            ],
            trace_tail=list(world.recent),
            trace=world.lines,
            **drain,
        )

    def _tier_summary(self) -> dict[str, int]:
        if self.objects is None:
            return {}
        summary = dict(self.broker.tier_stats)
        summary["objects"] = len(self.objects.objects)
        summary["indexed"] = sum(len(self.checker.indexed(topic)) for topic in self.topics)
        summary["impostors_left"] = len(self.impostors & self.objects.objects.keys())
        summary["audit_received"] = sum(audit.received for audit in self.audits)
        summary["pruned_before_audit"] = self._pruned_before_audit
        if self.history is not None:
            summary["history_subscriptions"] = self.history.generations * len(self.topics)
            summary["history_received"] = self.history.received
        return summary


def drain_line(result: Result) -> str:
    """The report's line for invariant 4b: how long the drain ran and what it delivered."""
    if not result.drain_s:
        return "  drain: not run (a violation stopped the load)"
    return (
        f"  drain: {'drained' if result.drained else 'NOT drained'} in {result.drain_s:.1f} s "
        f"simulated, {result.drain_delivered} first deliveries of {result.owed_at_drain} owed "
        f"when it began (no-progress limit {result.quiet_limit_s:.0f} s)"
    )


def replay_command(seed: int, duration_s: float, workload: Workload, faults: Faults) -> str:
    """The command line that reruns exactly this simulation: `--tiered` and `--profile none`
    first, since the command line starts from the tiered workload and the default profile."""
    args = [f"python -m sim --seed {seed} --duration {duration_s:g}"]
    if workload.tiered:
        args.append("--tiered")
    args.append("--profile none")
    args += changed_flags(workload, TIERED if workload.tiered else Workload(), skip=("tiered",))
    args += changed_flags(faults, Faults())
    return " ".join(args)
