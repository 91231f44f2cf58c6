"""One simulation run: a broker, its clients, the fault clock, a drain phase and the final
checks. Everything random comes from the world's one RNG, seeded by `--seed`."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from danube.core.config import DispatchStrategy
from danube.dispatch.types import SubscriptionType
from danube.proto import danube as pb
from danube.wal.machine import Durability, WalConfig
from sim.broker import SimBroker
from sim.checker import InvariantChecker, Violation
from sim.clients import SimConsumer, SimProducer
from sim.disk import SimDisk
from sim.faults import FAULT_TICK_US, Faults, Injected
from sim.network import Network
from sim.world import US_PER_MS, US_PER_S, World

SUB_TYPES = {
    "exclusive": SubscriptionType.EXCLUSIVE,
    "shared": SubscriptionType.SHARED,
    "failover": SubscriptionType.FAILOVER,
    "key_shared": SubscriptionType.KEY_SHARED,
}
DRAIN_LIMIT_US = 90 * US_PER_S
"""Ack timeouts (30 s) and redelivery backoff bound how long delivering everything can take
once the faults stop."""


@dataclass(frozen=True, slots=True)
class Workload:
    topics: int = 1
    producers: int = 2
    """Per topic."""
    rate: float = 100.0
    """Messages per second per producer (one at a time, as Danube's clients send)."""
    subscriptions: tuple[str, ...] = ("exclusive", "shared", "failover", "key_shared")
    consumers: int = 2
    """Per subscription."""
    keys: int = 8
    durability: str = "fsync"
    max_unacked: int = 10
    ack_delay_ms: int = 20
    nack: float = 0.02
    segment_bytes: int = 64 * 1024
    cache_bytes: int = 16 * 1024
    """Small, so lagging subscriptions read segment files."""

    def wal_config(self) -> WalConfig:
        return WalConfig(
            durability=Durability(self.durability),
            segment_bytes=self.segment_bytes,
            cache_bytes=self.cache_bytes,
            flush_interval_ms=200,
        )


@dataclass(slots=True)
class Result:
    seed: int
    duration_s: float
    digest: str
    events: int
    wall_s: float
    injected: Injected
    violations: list[Violation]
    produced: int
    acknowledged: int
    received: int
    duplicates: int
    lost: dict[str, int]
    stopped_topics: dict[str, str]
    drained: bool
    trace_tail: list[str] = field(default_factory=list)
    trace: list[str] | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("trace_tail")
        data.pop("trace")
        data["injected"] = dict(self.injected)
        data["violations"] = [asdict(v) for v in self.violations]
        return data


class Simulation:
    def __init__(
        self,
        seed: int,
        workload: Workload,
        faults: Faults,
        *,
        full_trace: bool = False,
    ) -> None:
        self.seed = seed
        self.workload = workload
        self.faults = faults
        self.world = World(seed, full_trace=full_trace)
        self.injected = Injected()
        self.disk = SimDisk()
        self.network = Network(self.world, faults, self.injected)
        wal = workload.wal_config()
        self.checker = InvariantChecker(self.world, self.disk, wal.durability)
        self.broker = SimBroker(
            self.world,
            self.network,
            self.disk,
            faults,
            self.injected,
            wal,
            self.checker,
            max_unacked=workload.max_unacked,
        )
        self.producers: list[SimProducer] = []
        self.consumers: list[SimConsumer] = []
        self.subscriptions: list[tuple[str, str]] = []
        for t in range(workload.topics):
            topic = f"/default/sim-{t}"
            for name in workload.subscriptions:
                self.subscriptions.append((topic, name))
                for c in range(workload.consumers):
                    self.consumers.append(
                        SimConsumer(
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
                        )
                    )
            for p in range(workload.producers):
                self.producers.append(
                    SimProducer(
                        self.world,
                        self.network,
                        self.broker,
                        self.checker,
                        name=f"p{t}-{p}",
                        topic=topic,
                        rate=workload.rate,
                        keys=workload.keys,
                        strategy=pb.DispatchStrategy.Reliable,
                    )
                )
        self._disk_full_until = 0

    def _setup(self) -> None:
        """The topics and subscriptions exist before anything is published, so every
        acknowledged message is owed to every subscription."""
        self.broker.start()
        core = self.broker.core
        assert core is not None
        for topic in dict.fromkeys(t for t, _ in self.subscriptions):
            self.broker._apply(core.create_topic(topic, DispatchStrategy.RELIABLE).effects)
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
            clients = [c.client for c in self.consumers] + [p.name for p in self.producers]
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
        if faults.bit_flip and rng.random() < faults.bit_flip:
            flipped = self.disk.flip_bit(rng)
            if flipped is not None:
                self.injected["bit_flip"] += 1
                world.log(f"fault bit_flip {flipped}")
        if faults.clock_jump and rng.random() < faults.clock_jump:
            jump = rng.randint(-30_000, 30_000)
            self.broker.clock_skew_ms += jump
            self.injected["clock_jump"] += 1
            world.log(f"fault clock_jump {jump}ms")
        self.world.at(FAULT_TICK_US, self._fault_tick)

    def _drained(self) -> bool:
        """Everything acknowledged reached every subscription (of topics still serving)."""
        acknowledged = self.checker.acknowledged_payloads
        for topic, sub in self.subscriptions:
            if topic in self.broker.stopped_topics:
                continue
            received = self.checker.subscriptions[(topic, sub)].received
            if any(not received[p] for p in acknowledged[topic]):
                return False
        return True

    def run(self, duration_s: float) -> Result:
        started = time.perf_counter()
        world = self.world
        self._setup()
        for consumer in self.consumers:
            consumer.start()
        for producer in self.producers:
            world.at(100 * US_PER_MS, producer.start)
        world.at(FAULT_TICK_US, self._fault_tick)
        end = int(duration_s * US_PER_S)
        world.run_until(end, stop=lambda: bool(self.checker.violations))
        drained = False
        if not self.checker.violations:
            # Drain: no more faults or publishes; everything acknowledged must arrive.
            for producer in self.producers:
                producer.stopped = True
            calm = self.faults.without_faults()
            self.network.faults = calm
            self.broker.faults = calm
            self.faults = calm
            self.disk.full = False
            world.log("drain")
            check_every = 100 * US_PER_MS
            deadline = world.now + DRAIN_LIMIT_US
            while world.now < deadline and not drained:
                world.run_until(world.now + check_every)
                drained = self._drained() and self.broker.up
            # One last restart: recovery must accept what is on disk, or stop a topic whose
            # durable bytes went bad (an injected bit flip) rather than serve them.
            self.broker.crash(power=False, fault=False)
            world.run_until(world.now + self.faults.restart_us)
            self.checker.final(self.subscriptions, self.broker.stopped_topics)
        return Result(
            seed=self.seed,
            duration_s=duration_s,
            digest=world.digest,
            events=world.events,
            wall_s=time.perf_counter() - started,
            injected=self.injected,
            violations=list(self.checker.violations),
            produced=sum(p.sent for p in self.producers),
            acknowledged=sum(p.acknowledged for p in self.producers),
            received=sum(c.received for c in self.consumers),
            duplicates=self.checker.duplicates,
            lost={f"{t}/{s}": n for (t, s), n in self.checker.lost.items()},
            stopped_topics=dict(self.broker.stopped_topics),
            drained=drained,
            trace_tail=list(world.recent),
            trace=world.lines,
        )


def replay_command(seed: int, duration_s: float, workload: Workload, faults: Faults) -> str:
    """The command line that reruns exactly this simulation."""
    args = [f"python -m sim --seed {seed} --duration {duration_s:g}"]
    default_workload, default_faults = Workload(), Faults()
    for item in fields(Workload):
        value = getattr(workload, item.name)
        if value != getattr(default_workload, item.name):
            shown = ",".join(value) if isinstance(value, tuple) else value
            args.append(f"--{item.name.replace('_', '-')} {shown}")
    for item in fields(Faults):
        value = getattr(faults, item.name)
        if value != getattr(default_faults, item.name):
            args.append(f"--{item.name.replace('_', '-')} {value}")
    return " ".join(args)
