"""One cluster run: N brokers (`sim.cluster_node`), each with its
`Membership` and `LoadManager` machines, against one simulated etcd (`sim.etcd`), under
crashes, graceful stops, broker-etcd partitions, message loss, etcd stalls, slow requests and
clock drift; the invariants of `sim.cluster_checker` hold after every event.

The brokers boot within the first 200 ms. Topics are created at random times over the first
80 % of the run, each through a random running broker (a client asks again through a random
running broker 3.5 s later), so new topics meet every fault. After `duration` the faults stop (those
under way run out) and the run goes on until the cluster has settled (d), for at most
`SETTLE_LIMIT_US`.

With data planes (`--data`) every broker also runs its ownership machine and a broker core
(`sim.cluster_data`), topics are reliable at the `object` level on one simulated object store,
each topic has a producer (`sim.cluster_clients`) from its creation to the end of the faults,
and `sim.cluster_data_checker` adds the invariants "at most one writer per topic" (g) and "no
acknowledged loss across moves and failovers" (h); settling then also means every topic is
served by exactly one broker.

An operator (`sim.cluster_admin`, `ClusterWorkload.admin` operations) drains brokers, unloads
topics, deletes topics of its own and changes the default namespace's policies at random times
under the faults, through the admin flows production runs; `AdminChecker` adds the invariants
(i), (j) and (k) of its answers.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field

from danube.machines.cluster.load_manager import (
    Aggressiveness,
    LoadManagerConfig,
    RebalancingConfig,
)
from danube.machines.cluster.membership import MembershipConfig
from danube.machines.node import paths
from danube.machines.node.core import policies_to_json
from danube.metadata.model import Put
from danube.values.config import Policies
from danube.values.load_manager_config import Strategy
from danube.values.names import parse_topic
from sim.broker import EPOCH_MS
from sim.checker import Violation
from sim.cluster_admin import AdminChecker, Operator
from sim.cluster_checker import ClusterChecker
from sim.cluster_clients import ClusterProducer
from sim.cluster_data_checker import DataChecker
from sim.cluster_faults import ClusterFaults
from sim.cluster_node import REQUEST_TIMEOUT_US, Clock, NodeSettings, SimNode
from sim.cluster_poison import (
    ClusterConsumer,
    PoisonLedger,
    dead_letter_topic,
    dispatch_rate_floor,
    setup_ops,
)
from sim.etcd import Origin, SimEtcd
from sim.faults import FAULT_TICK_US, Faults, Injected
from sim.network import Network
from sim.objects import SimObjectStore
from sim.replica_streams import ReplicaStreams
from sim.seeds import ResultMethods, changed_flags
from sim.world import US_PER_MS, US_PER_S, World

SETTLE_LIMIT_US = 60 * US_PER_S
"""A lease's TTL, fail-overs retried every second and rebalancing moves a second apart settle
well within this once the faults stop."""
SETTLE_CHECK_US = 100 * US_PER_MS
GC_THRESHOLDS = (10_000, 20, 10)
"""The cyclic collector's thresholds during a run: the default (700, 10, 10) started a young
collection every few hundred events and a full one every few simulated seconds; together
8 % of a cluster run with data planes (measured with `gc.callbacks`)."""
CYCLIC_GARBAGE_PER_S = 500
"""At most this many objects of cyclic garbage a run makes per simulated second (up to 210
on seed 1 of 10 s with data planes, replicated or not, default or heavy faults; 1,150 before
the change below; tests/sim/test_cluster_data_sim.py holds runs to it). A run's requests and
flows are objects with methods, not closures that call each other: those were reference
cycles, 314,000 objects in a run of 30 s, which only the cyclic collector frees."""
CREATE_RETRY_US = REQUEST_TIMEOUT_US + 500 * US_PER_MS
"""A client that heard nothing back about a topic creation asks another broker."""
PRODUCER_START_US = 300 * US_PER_MS
"""A topic's producer starts this long after the topic's creation was first asked for."""


@dataclass(frozen=True, slots=True)
class ClusterWorkload:
    brokers: int = 3
    topics: int = 24
    """Created at random times over the first 80 % of the run."""
    rebalance: bool = True
    """Automatic rebalancing every second (aggressive, a second of cooldown, topics older than
    two seconds), so restarted brokers draw `Move`s and the data plane's ready markers."""
    strategy: str = "balanced"
    """`load_manager.assignment_strategy`. The brokers report no CPU or memory, so `balanced`
    and `fair` count topics; `weighted_load` scores each broker's topic weight as a fraction
    of the cluster's largest (spec/cluster.md), where a move can overshoot."""
    quiet_s: int = 0
    """Once settled, the run goes on this many simulated seconds without faults: the moves
    must stop (invariant m). 0: the run ends when settled."""
    lease_ttl_ms: int = 4_000
    renew_interval_ms: int = 1_000
    drift_ms: int = 400
    retry_ms: int = 250
    """The membership's retries (grant, registration, campaign)."""
    assign_retry_ms: int = 1_000
    """The load manager's `retry_ms`: a decision not seen in the watch by then is made again."""
    report_interval_ms: int = 5_000
    data: bool = False
    """Data planes: ownership, broker cores, object store, producers (invariants g and h)."""
    replicated: bool = False
    """With data planes: topics at `fsync` that replicate to followers (spec/replication.md;
    invariants r1 and r2) instead of acknowledging once indexed at the `object` level."""
    replication_factor: int = 0
    """With `replicated`: the cluster's replication factor (`cluster.replication_factor`);
    0 is the default (2). At 3, a follower that is not promoted follows the new owner, so a
    deposed owner's frames can reach a follower that knows a newer epoch."""
    rate: float = 20.0
    """With data planes: messages per second of each topic's producer."""
    in_flight: int = 4
    """With data planes: how many publishes each producer keeps unanswered at most (a
    client's window; `sim.cluster_clients`). 4, not 1: at the `object` level a publish is
    answered once its object is indexed (a few hundred ms), so a producer with one in flight
    sent about 3 of its 20 messages a second, as no client at that level runs (issue 27: 6.5
    msg/s for a sequential producer); at 4 the sealed objects carry more messages and the CPU a
    message is lower than at 1 or 8 (bench/RESULTS.md, issue 22 round 12). 1 is reachable
    (`--in-flight 1`, and the swarm draws it)."""
    batched: float = 0.5
    """With data planes: chance that a topic's producer publishes on the batched path
    (`PublishBatch`, up to `batch` payloads a request, as our client does by default;
    `sim.cluster_clients`), the others one `SendMessage` a publish, as Danube's own clients:
    the seed draws the mix, as the standalone simulator's `Workload.batched`. 0 draws nothing
    from the seed (plain producers only, the runs of before issue 22's round 13)."""
    batch: int = 8
    """With `batched`: most payloads a `PublishBatch` carries."""
    lookup_hold_ms: int = 0
    """With data planes: the brokers' `cluster.lookup_hold_ms` as the producers' lookups see
    it (`sim.cluster_clients`, invariant t). 0: answered at once (Danube's behaviour, and
    the runs whose seeds the tests pin); `tests/sim/test_cluster_data_sim.py` runs 500 ms,
    shorter than a failover so that the deadline is exercised."""
    admin: int = 8
    """Operations of the operator (`sim.cluster_admin`): drains, unloads, deletions of its
    own topics, namespace-policy changes, at random times under the faults (0: none)."""
    scratch_topics: int = 3
    """Topics the operator creates to delete them."""
    poison: int = 0
    """With data planes: how many topics (the first ones) have a subscription whose consumer
    nacks the poison messages for ever, dead-lettered to a topic of their own, in this
    namespace or another, mostly on another broker (`sim.cluster_poison`; invariant p)."""

    def settings(self, broker: str, objects: SimObjectStore | None = None) -> NodeSettings:
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be at least 1 (got {self.in_flight})")
        membership = MembershipConfig(
            broker,
            {
                "broker_url": f"http://broker-{broker}:6650",
                "connect_url": f"http://broker-{broker}:6650",
                "admin_addr": f"http://broker-{broker}:50051",
            },
            lease_ttl_ms=self.lease_ttl_ms,
            renew_interval_ms=self.renew_interval_ms,
            drift_ms=self.drift_ms,
            retry_ms=self.retry_ms,
            load_report_interval_ms=self.report_interval_ms,
        )
        rebalancing = (
            RebalancingConfig(
                enabled=True,
                aggressiveness=Aggressiveness.AGGRESSIVE,
                check_interval_seconds=1,
                max_moves_per_hour=10_000,
                cooldown_seconds=1,
                min_topic_age_seconds=2,
            )
            if self.rebalance
            else None
        )
        manager = LoadManagerConfig(
            Strategy(self.strategy),
            load_report_interval_seconds=max(1, self.report_interval_ms // 1000),
            rebalancing=rebalancing,
            retry_ms=self.assign_retry_ms,
            replication_factor=self.replication_factor or None,
        )
        return NodeSettings(membership, manager, objects, self.in_flight)


@dataclass(slots=True)
class ClusterResult(ResultMethods):
    seed: int
    duration_s: float
    digest: str
    events: int
    wall_s: float
    injected: Injected
    violations: list[Violation]
    settled: bool
    settle_s: float
    """Simulated seconds from the end of the faults until the cluster settled."""
    created: int
    landed: dict[str, int]
    """Writes that took effect, by kind: decisions (`Assign`, `Move`, `FailOver`,
    `Release`), `campaign`s won, `register`, `create`, `ready`, `revoke`, `load report`; with
    data planes also `namespace` (the setup),
    `claim`, `release`, `writer`, `persist`, `index`."""
    data: dict[str, int] = field(default_factory=dict)
    """With data planes: messages acknowledged, objects indexed, producers' lookups."""
    admin: dict[str, int] = field(default_factory=dict)
    """The operator's calls answered, by kind and status."""
    hottest_writes: int = 0
    """The most transactions one broker sent writing one key within a simulated second
    (invariant n allows `cluster_checker.HOT_WRITES_PER_S`; `--json` shows it)."""
    most_refused: int = 0
    """The most of them refused within a second (invariant o allows
    `cluster_checker.REFUSED_WRITES_PER_S`)."""
    trace_tail: list[str] = field(default_factory=list)
    trace: list[str] | None = None


class ClusterSimulation:
    def __init__(
        self,
        seed: int,
        workload: ClusterWorkload,
        faults: ClusterFaults,
        *,
        full_trace: bool = False,
    ) -> None:
        self.seed = seed
        if (workload.replicated or workload.poison) and not workload.data:
            workload = dataclasses.replace(workload, data=True)
        self.workload = workload
        self.faults = faults
        self.world = World(seed, full_trace=full_trace)
        self.injected = Injected()
        self.network = Network(self.world, faults.network(), self.injected)
        self.etcd = SimEtcd(self.world, self.network, faults, self.injected)
        self.objects = (
            SimObjectStore(self.world, Faults(), self.injected, EPOCH_MS) if workload.data else None
        )
        rng = self.world.rng
        spread = faults.skew * workload.drift_ms / workload.lease_ttl_ms
        self.nodes = [
            SimNode(
                str(n),
                self.world,
                self.network,
                self.etcd,
                self.injected,
                workload.settings(str(n), self.objects),
                Clock(rng.randrange(10**12), 1 + rng.uniform(-spread, spread)),
            )
            for n in range(1, workload.brokers + 1)
        ]
        self.streams: ReplicaStreams | None = None
        if workload.data and workload.replicated:
            self.streams = ReplicaStreams(
                self.world, self.network, {node.name: node for node in self.nodes}
            )
            for node in self.nodes:
                node.streams = self.streams
        self.checker = ClusterChecker(self.world, self.etcd, self.nodes)
        self.topics = [f"/default/topic-{t}" for t in range(workload.topics)]
        self.admin_checker = AdminChecker(self.world, self.etcd)
        self.operator = Operator(
            self.world,
            self.nodes,
            self.admin_checker,
            self.topics,
            operations=workload.admin,
            scratch=workload.scratch_topics if workload.admin else 0,
            topic_policies=self.objects is not None,
            dispatch_rate_floor=dispatch_rate_floor(workload.rate) if workload.poison else 1,
        )
        poisoned = self.topics[: workload.poison] if workload.data else []
        self.poisoned = {t: dead_letter_topic(t, i) for i, t in enumerate(poisoned)}
        """poison topic → its dead-letter topic (created as the others, with no producer)."""
        self.created_topics = self.topics + list(self.poisoned.values())
        for topic in self.created_topics:
            self.checker.expect(topic, paths.namespace_topic(parse_topic(topic)))
        self.data_checker: DataChecker | None = None
        self.producers: dict[str, ClusterProducer] = {}
        if self.objects is not None:
            self.data_checker = DataChecker(
                self.world, self.etcd, self.objects, self.nodes, self.created_topics,
                replicated=self.streams is not None,
            )  # fmt: skip
            for node in self.nodes:
                node.data_checker = self.data_checker  # invariant 19 after each tick
            if self.streams is not None:
                self.streams.on_ack = self.data_checker.broker_acknowledged
                self.streams.on_foreign = self.data_checker.foreign_frames
            for index, topic in enumerate(self.topics):
                self.producers[topic] = ClusterProducer(
                    self.world,
                    self.network,
                    self.nodes,
                    self.data_checker,
                    name=f"producer-{index}",
                    topic=topic,
                    rate=workload.rate,
                    in_flight=workload.in_flight,
                    batch=workload.batch if _batched(self.world, workload.batched) else 1,
                    hold_ms=workload.lookup_hold_ms,
                )
        self.ledger: PoisonLedger | None = None
        self.consumers: dict[str, ClusterConsumer] = {}
        if self.data_checker is not None and self.poisoned:
            ledger = self.ledger = PoisonLedger(
                self.world, self.nodes, self.poisoned, self.data_checker
            )
            for node in self.nodes:
                node.poison = ledger
            for index, topic in enumerate(self.poisoned):
                self.consumers[topic] = ClusterConsumer(
                    self.world, self.network, self.nodes, ledger,
                    name=f"consumer-{index}", topic=topic,
                )  # fmt: skip
        self.checker.others.append(self.admin_checker.violations)
        if self.data_checker is not None:
            self.checker.others.append(self.data_checker.violations)
        if self.ledger is not None:
            self.checker.others.append(self.ledger.violations)

    @property
    def violations(self) -> list[Violation]:
        found = list(self.checker.violations) + self.admin_checker.violations
        if self.data_checker is not None:
            found += self.data_checker.violations
        if self.ledger is not None:
            found += self.ledger.violations
        return found

    def run(self, duration_s: float) -> ClusterResult:
        """The run, with the cyclic collector tuned for it (`GC_THRESHOLDS`)."""
        thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            return self._run(duration_s)
        finally:
            gc.set_threshold(*thresholds)

    def _run(self, duration_s: float) -> ClusterResult:
        started = time.perf_counter()
        world = self.world
        rng = world.rng
        end = int(duration_s * US_PER_S)
        for node in self.nodes:
            world.at(rng.randrange(200 * US_PER_MS), node.boot)
        for topic in self.topics:
            world.at(rng.randrange(end * 4 // 5 + 1), lambda t=topic: self._create(t))
        for topic in self.poisoned.values():  # dead-letter topics: from the start
            world.at(rng.randrange(end // 5 + 1), lambda t=topic: self._create(t))
        self.etcd.start()
        self.operator.start(end)
        if self.objects is not None or self.workload.admin:
            # The cluster was set up with its default namespace (as `bootstrap` writes it).
            policy = Put(paths.namespace_policy("default"), policies_to_json(Policies()))
            ops = (policy, *setup_ops(self.poisoned))
            self.etcd.txn((), ops, Origin("setup", "namespace"))
        world.at(FAULT_TICK_US, self._fault_tick)
        # After every event: `ClusterChecker.check`, which also tests the other checkers' lists.
        world.run_until(end, stop=self.checker.check)
        for producer in self.producers.values():
            producer.stop()
        settled, settle_s = False, 0.0
        if not self.violations:
            settled, settle_s = self._settle()
        if settled and self.workload.quiet_s:
            self._quiet()
        if settled and self.data_checker is not None:
            self.data_checker.final()
            if self.ledger is not None:
                gone = self.data_checker.all_unavailable_for_good()
                self.ledger.final([t for t in self.created_topics if t not in gone])
            self.operator.check_overrides()
        data: dict[str, int] = {}
        if self.data_checker is not None:
            data = dict(self.data_checker.counts)
            data["lookups"] = sum(p.lookups for p in self.producers.values())
        if self.ledger is not None:
            data.update(self.ledger.counts)
            data["poison_consumer_lookups"] = sum(c.lookups for c in self.consumers.values())
            data["poison_dead_lettered"] = sum(map(len, self.ledger.dead_lettered.values()))
        if self.streams is not None:
            data["replica_sends"] = self.streams.sent
            data["replica_streams_broken"] = self.streams.broken
            data["handed_over"] = self.streams.handed_over
            data["handed_over_unindexed"] = self.streams.handed_over_unindexed
            data["kept_directories_removed"] = self.streams.kept_removed
            data["rewind_restarts"] = self.streams.restarted
            data["rewind_served_again"] = self.streams.restarted_served
        return ClusterResult(
            seed=self.seed,
            duration_s=duration_s,
            digest=world.digest,
            events=world.events,
            wall_s=time.perf_counter() - started,
            injected=self.injected,
            violations=self.violations,
            settled=settled,
            settle_s=settle_s,
            created=len(self.checker.created),
            landed=dict(sorted(self.checker.landed.items())),
            data=data,
            admin=dict(sorted(self.operator.answers.items())),
            hottest_writes=self.checker.hottest,
            most_refused=self.checker.most_refused,
            trace_tail=list(world.recent),
            trace=world.lines,
        )

    def _settle(self) -> tuple[bool, float]:
        """No new faults; the cluster must settle (d) before `SETTLE_LIMIT_US`."""
        world = self.world
        calm = self.faults.calm()
        self.faults = self.etcd.faults = calm
        self.network.faults = calm.network()
        world.log("faults stop")
        self.operator.calm()
        began = world.now
        problems: list[str] = []
        poison: list[str] = []
        topics = self.created_topics
        waiting: list[str] = []
        while world.now < began + SETTLE_LIMIT_US:
            world.run_until(world.now + SETTLE_CHECK_US, stop=self.checker.check)
            waiting = []
            if self.violations:
                return False, 0.0
            topics, gone = self.created_topics, []
            if self.data_checker is not None:  # also the operator's scratch topics
                gone = self.data_checker.all_unavailable_for_good()
                topics = [t for t in topics if t not in gone]
                self.data_checker.counts["unavailable_for_good"] = len(gone)
            problems = self.checker.unsettled(topics, gone) + self.operator.unsettled()
            if self.data_checker is not None:
                problems += self.data_checker.unsettled(topics)
            if self.ledger is not None:
                poison = self.ledger.unsettled(topics)
            if not problems and not poison:
                if self.data_checker is not None and self.data_checker.replicated:
                    # r5 waits for a registration under way (`holding_back`)
                    waiting = self.data_checker.holding_back(topics)
                if not waiting:
                    world.log("settled")
                    return True, (world.now - began) / US_PER_S
        if waiting:  # settled but for registrations never made: `final` reports r5
            world.log("settled")
            return True, (world.now - began) / US_PER_S
        if problems:
            self.checker.unsettled_for_good(problems + poison)
        elif self.ledger is not None:  # the cluster settled, a poison message did not: p
            self.ledger.final(topics)
        return False, 0.0

    def _quiet(self) -> None:
        """Settled: `quiet_s` more seconds without faults, in which the moves must stop (m)."""
        world = self.world
        began = world.now
        world.run_until(began + self.workload.quiet_s * US_PER_S, stop=self.checker.check)
        self.checker.quiet(began, world.now)

    def _create(self, topic: str) -> None:
        if topic in self.checker.created:
            return
        producer = self.producers.get(topic)
        if producer is not None and not producer.started:
            producer.started = True
            self.world.at(PRODUCER_START_US, producer.start)
            consumer = self.consumers.get(topic)
            if consumer is not None:
                self.world.at(PRODUCER_START_US, consumer.start)
        running = [node.running for node in self.nodes if node.running is not None]
        if running:
            process = self.world.rng.choice(running)
            process.create_topic(topic)
        self.world.at(CREATE_RETRY_US, lambda: self._create(topic))

    def _fault_tick(self) -> None:
        world, faults, rng = self.world, self.faults, self.world.rng
        restart = faults.restart_us
        if faults.crash and rng.random() < faults.crash:
            up = [node for node in self.nodes if node.running is not None]
            if up:
                rng.choice(up).crash(rng.randint(restart // 2, restart * 3 // 2))
        if faults.stop and rng.random() < faults.stop:
            up = [node for node in self.nodes if node.running is not None]
            if up:
                rng.choice(up).stop(rng.randint(restart // 2, restart * 3 // 2))
        if faults.kill and rng.random() < faults.kill:
            up = [node for node in self.nodes if node.running is not None]
            if sum(not node.lost for node in self.nodes) > 2 and up:
                rng.choice(up).kill()
        if faults.partition and rng.random() < faults.partition:
            node = rng.choice(self.nodes)
            self.network.partition(
                node.name, rng.randint(faults.partition_us // 10, faults.partition_us)
            )
        if faults.stall and rng.random() < faults.stall:
            self.etcd.stall(rng.randint(faults.stall_us // 10, faults.stall_us))
        faults.peer_faults(rng, [node.name for node in self.nodes], self.network)
        if faults.power and rng.random() < faults.power:
            up = [node for node in self.nodes if node.running is not None]
            if up:
                rng.choice(up).crash(rng.randint(restart // 2, restart * 3 // 2), power=True)
        if faults.disk_full and rng.random() < faults.disk_full:
            up = [node for node in self.nodes if node.running is not None]
            if up:
                self._fill_disk(rng.choice(up))
        if faults.lease_lane and rng.random() < faults.lease_lane:
            node = rng.choice(self.nodes)
            cut = rng.randint(faults.partition_us // 10, faults.partition_us)
            node.lease_lane_cut_until = max(node.lease_lane_cut_until, world.now + cut)
            self.injected["lease_lane"] += 1
            world.log(f"fault lease_lane {node.name} for {cut}us")
        world.at(FAULT_TICK_US, self._fault_tick)

    def _fill_disk(self, node: SimNode) -> None:
        """`ClusterFaults.disk_full`: the node's WAL writes fail until it has room again."""
        disk = node.disk
        disk.full = True
        self.injected["disk_full"] += 1
        self.world.log(f"fault disk_full {node.name}")

        def room() -> None:
            disk.full = False

        self.world.at(self.faults.disk_full_us, room)


def _batched(world: World, chance: float) -> bool:
    """Whether a producer takes the batched path: nothing drawn at 0 (the runs of before)."""
    return chance > 0 and world.rng.random() < chance


def cluster_replay_command(
    seed: int, duration_s: float, workload: ClusterWorkload, faults: ClusterFaults
) -> str:
    """The command line that reruns exactly this run (from `--profile none`)."""
    args = [f"python -m sim --cluster --seed {seed} --duration {duration_s:g} --profile none"]
    args += changed_flags(workload, ClusterWorkload()) + changed_flags(faults, ClusterFaults())
    return " ".join(args)
