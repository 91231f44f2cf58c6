"""One schema run (`python -m sim --schemas`): a subject under each of the seven
compatibility modes, each bound to a topic with a random validation policy, and producers
that evolve their schema step by step, switch between the versions they know, and now and
then send a message that does not fit (while an operator now and then changes a topic's
validation policy), through two brokers' registries
(`sim.schema_front_end`) sharing one simulated etcd, under lost messages, slow and stalled
store requests, broker-store partitions and broker crashes. `sim.schema_checker` judges.

Setup: an operator per subject registers its first version and sets the mode (retrying
until both are done), then the subject's producers start. After `duration` the producers
stop, the requests under way run out, and the checker reads the store."""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fastavro

from danube.machines.node import paths
from danube.machines.schema import records
from danube.machines.schema.compatibility import CompatibilityMode
from danube.machines.schema.policy import TopicSchemaConfig, ValidationPolicy
from danube.machines.schema.registry import Registration, Subject
from danube.proto import danube as pb
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic
from sim import schema_workload
from sim.checker import Violation
from sim.cluster_faults import ClusterFaults
from sim.etcd import SimEtcd
from sim.faults import FAULT_TICK_US, Faults, Injected
from sim.network import Network
from sim.schema_bomb import Bomber
from sim.schema_checker import DEFECTS, SchemaChecker, Told
from sim.schema_front_end import FrontEnd
from sim.seeds import ResultMethods, changed_flags
from sim.world import US_PER_MS, US_PER_S, World

CLIENT_TIMEOUT_US = 5 * US_PER_S
"""Longer than the brokers' store timeout, so a broker's UNAVAILABLE usually arrives first."""
RETRY_US = 100 * US_PER_MS
DRAIN_LIMIT_US = 30 * US_PER_S
UNKNOWN_VERSION = 10_000
"""A version no subject reaches in a run."""


@dataclass(frozen=True, slots=True)
class SchemaWorkload:
    producers: int = 2
    """Per subject; they evolve the same subject at once, so registrations race."""
    rate: float = 40.0
    """Steps per second of each producer (a publish, a registration or a switch)."""
    evolve: float = 0.06
    """Per step: register the next step of the producer's schema."""
    switch: float = 0.04
    """Per step: write with another version the producer knows (older or newer)."""
    bad: float = 0.1
    """Per publish: a message that does not fit (see `sim.schema_checker.DEFECTS`)."""
    brokers: int = 2
    rebind: float = 0.05
    """Per 100 ms: an operator changes a topic's validation policy or payload checks."""
    batch: float = 0.3
    """Per publish: the producer sends 2 to 4 messages in one request (the batched path,
    judged as one by the gate) instead of one."""


@dataclass(frozen=True, slots=True)
class SchemaFaults:
    latency_us: int = 500
    loss: float = 0.0
    """Per message, between clients and brokers and between brokers and etcd."""
    slow: float = 0.0
    """Per store request: it, or its answer, takes 1 to 6 s longer."""
    stall: float = 0.0
    """Per fault tick: etcd stalls for up to `stall_us`."""
    stall_us: int = 2_000_000
    partition: float = 0.0
    """Per fault tick: a broker is cut off from etcd for 0.5 to 4 s."""
    crash: float = 0.0
    """Per fault tick: a broker dies (requests under way are never answered, caches are
    lost) and serves again at once as a new process."""

    def network(self) -> Faults:
        return Faults(latency_us=self.latency_us, loss=self.loss)

    def store(self) -> ClusterFaults:
        return ClusterFaults(latency_us=self.latency_us, loss=self.loss, slow=self.slow)


SCHEMA_PROFILES = {
    "none": SchemaFaults(),
    "default": SchemaFaults(loss=0.005, slow=0.005, stall=0.005, partition=0.01, crash=0.01),
    "heavy": SchemaFaults(loss=0.02, slow=0.02, stall=0.02, partition=0.03, crash=0.03),
}


@dataclass
class SchemaResult(ResultMethods):
    seed: int
    duration_s: float
    events: int
    wall_s: float
    digest: str
    registrations: dict[str, int]
    publishes: dict[str, int]
    subjects: dict[str, str]
    """Per subject (one per mode): the versions it ended with and its topic's policy."""
    promises_checked: int
    violations: list[Violation]
    injected: Injected
    trace_tail: list[str] = field(repr=False)
    trace: list[str] | None = field(default=None, repr=False)


class Calls:
    """Client requests to brokers over the client network, each answered once: with the
    broker's answer, or `TimeoutError` after CLIENT_TIMEOUT_US."""

    def __init__(self, world: World, network: Network) -> None:
        self.world = world
        self.network = network

    def call(
        self,
        client: str,
        ask: Callable[[Callable[[Any], None]], None],
        done: Callable[[Any], None],
    ) -> None:
        answered = False

        def finish(result: Any) -> None:
            nonlocal answered
            if not answered:
                answered = True
                done(result)

        def at_broker(answer: Any) -> None:
            self.network.send(client, lambda: finish(answer))

        self.world.at(CLIENT_TIMEOUT_US, lambda: finish(TimeoutError("no answer")))
        self.network.send(client, lambda: ask(at_broker))


class SchemaSimulation:
    def __init__(
        self,
        seed: int,
        workload: SchemaWorkload,
        faults: SchemaFaults,
        *,
        full_trace: bool = False,
    ) -> None:
        self.world = World(seed, full_trace=full_trace)
        self.workload = workload
        self.faults = faults
        self.injected = Injected()
        self.etcd = SimEtcd(
            self.world,
            Network(self.world, faults.network(), self.injected),
            faults.store(),
            self.injected,
        )
        self.calls = Calls(self.world, Network(self.world, faults.network(), self.injected))
        self.checker = SchemaChecker(self.world)
        self.front_ends = [
            FrontEnd(f"b{i}", self.world, self.etcd, self.checker) for i in range(workload.brokers)
        ]
        self.registrations: Counter[str] = Counter()
        self.stopping = False
        self.operators_failed = 0
        self.subjects = [f"orders-{mode.value}" for mode in CompatibilityMode]
        self.ids: dict[str, int] = {}
        self.ready: set[str] = set()
        self.producers: list[SchemaProducer] = []
        self.bomber = Bomber(self)
        self._setup()

    def front_end(self) -> FrontEnd:
        return self.world.rng.choice(self.front_ends)

    def _setup(self) -> None:
        rng = self.world.rng
        for mode, subject in zip(CompatibilityMode, self.subjects, strict=True):
            topic = f"/sim/{subject}"
            config = TopicSchemaConfig(
                subject, rng.choice(list(ValidationPolicy)), rng.random() < 0.7
            )
            self.etcd.state.put(paths.topic_schema_config(parse_topic(topic)), config.to_json())
            self.checker.bound(topic, config)
            first = schema_workload.initial(rng)
            Operator(self, subject, topic, mode, first).start()

    def started(self, subject: str, topic: str, registration: Registration, first: Any) -> None:
        self.ids[subject] = registration.subject.schema_id
        self.ready.add(subject)
        for index in range(self.workload.producers):
            producer = SchemaProducer(
                self, f"{subject}-p{index}", subject, topic, registration, first
            )
            self.producers.append(producer)
            producer.start()

    def _fault_tick(self) -> None:
        if self.stopping:
            return
        rng, faults = self.world.rng, self.faults
        if faults.crash and rng.random() < faults.crash:
            self.injected["crash"] += 1
            self.front_end().crash()
        if faults.stall and rng.random() < faults.stall:
            self.etcd.stall(rng.randint(faults.stall_us // 10, faults.stall_us))
        if faults.partition and rng.random() < faults.partition:
            self.etcd.network.partition(self.front_end().name, rng.randint(500_000, 4_000_000))
        self.world.at(FAULT_TICK_US, self._fault_tick)

    def _rebind_tick(self) -> None:
        """Now and then an operator changes a topic's validation policy or payload checks
        through another broker (straight into the store): the brokers' binding caches must
        take the change within their TTL."""
        if self.stopping:
            return
        rng = self.world.rng
        if rng.random() < self.workload.rebind:
            subject = rng.choice(self.subjects)
            topic = f"/sim/{subject}"
            current = self.checker.bindings[topic]
            choices = [
                TopicSchemaConfig(subject, policy, checked)
                for policy in ValidationPolicy
                for checked in (False, True)
            ]
            config = rng.choice([c for c in choices if c != current])
            self.etcd.state.put(paths.topic_schema_config(parse_topic(topic)), config.to_json())
            self.checker.bound(topic, config)
            self.injected["rebind"] += 1
            self.world.log(f"operator rebinds {topic}: {config}")
        self.world.at(FAULT_TICK_US, self._rebind_tick)

    def run(self, duration_s: float) -> SchemaResult:
        started = time.perf_counter()
        self.etcd.start()
        self.world.at(FAULT_TICK_US, self._fault_tick)
        if self.workload.rebind:
            self.world.at(FAULT_TICK_US, self._rebind_tick)
        end = int(duration_s * US_PER_S)
        self.world.run_until(end)
        self.stopping = True
        self.world.log("producers stop")
        # In the drain, after every fault of the run was drawn: the bomb leaves the seeds'
        # fault sequences as they were.
        self.bomber.start()
        self.world.run_until(end + DRAIN_LIMIT_US, lambda: self.idle)
        self.checker.final(self.etcd.state, self.subjects, self.ready)
        if not self.bomber.done:
            self.checker.violation("progress", "the comparison bomb was never answered")
        return SchemaResult(
            seed=self.world.seed,
            duration_s=duration_s,
            events=self.world.events,
            wall_s=time.perf_counter() - started,
            digest=self.world.digest,
            registrations=dict(sorted(self.registrations.items())),
            publishes=dict(sorted(self.checker.outcomes.items())),
            subjects=self._subjects_summary(),
            promises_checked=self.checker.promises_checked,
            violations=self.checker.violations,
            injected=self.injected,
            trace_tail=list(self.world.recent),
            trace=self.world.lines,
        )

    @property
    def idle(self) -> bool:
        settled = len(self.ready) + self.operators_failed == len(self.subjects)
        return settled and self.bomber.done and all(p.pending is None for p in self.producers)

    def _subjects_summary(self) -> dict[str, str]:
        shown = {}
        for subject in self.subjects:
            config = self.checker.bindings[f"/sim/{subject}"]
            assert config is not None
            found = self.etcd.state.get(records.subject_key(subject))
            versions = 0 if found is None else len(records.subject_from_json(found.value).versions)
            checked = "payloads checked" if config.payload_validation else "ids only"
            shown[subject] = f"{versions} versions; topic {config.policy.value} ({checked})"
        return shown


class Operator:
    """Registers a subject's first version and sets its mode, retrying until both are done,
    then starts its producers."""

    def __init__(
        self,
        sim: SchemaSimulation,
        subject: str,
        topic: str,
        mode: CompatibilityMode,
        first: dict[str, Any],
    ) -> None:
        self.sim = sim
        self.subject = subject
        self.topic = topic
        self.mode = mode
        self.first = first
        self.name = f"{subject}-operator"
        self.registration: Registration | None = None

    def start(self) -> None:
        definition = schema_workload.encoded(self.first)
        self.sim.calls.call(
            self.name,
            lambda answer: self.sim.front_end().register(self.subject, "avro", definition, answer),
            self._registered,
        )

    def _registered(self, result: Any) -> None:
        if not isinstance(result, Registration):
            self._again(result, self.start)
            return
        self.registration = result
        self._set_mode()

    def _again(self, result: Any, action: Callable[[], None]) -> None:
        """Retries after a timeout or UNAVAILABLE; any other answer can never change."""
        if isinstance(result, DanubeError) and result.code is not ErrorCode.UNAVAILABLE:
            self.sim.operators_failed += 1
            self.sim.checker.violation("progress", f"{self.name}: {result}")
            return
        self.sim.world.log(f"{self.name} asks again after {result!r}")
        self.sim.world.at(RETRY_US, action)

    def _set_mode(self) -> None:
        self.sim.calls.call(
            self.name,
            lambda answer: self.sim.front_end().set_mode(self.subject, self.mode.value, answer),
            self._mode_set,
        )

    def _mode_set(self, result: Any) -> None:
        if not isinstance(result, Subject):
            self._again(result, self._set_mode)
            return
        assert self.registration is not None
        self.sim.world.log(f"{self.name} ready: id {result.schema_id}, mode {result.mode.value}")
        self.sim.checker.registered(
            Told(
                self.name,
                self.subject,
                self.registration.subject.schema_id,
                self.registration.version.version,
                schema_workload.encoded(self.first),
            )
        )
        self.sim.started(self.subject, self.topic, self.registration, self.first)


class SchemaProducer:
    def __init__(
        self,
        sim: SchemaSimulation,
        name: str,
        subject: str,
        topic: str,
        first: Registration,
        schema: dict[str, Any],
    ) -> None:
        self.sim = sim
        self.name = name
        self.subject = subject
        self.topic = topic
        self.schema_id = first.subject.schema_id
        self.known: dict[int, dict[str, Any]] = {first.version.version: schema}
        self.version = first.version.version
        self.pending: dict[str, Any] | None = None
        """A schema being registered (asked again until an answer comes)."""
        self._writers: dict[bytes, Any] = {}
        self._requests = 0

    def start(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        rate = self.sim.workload.rate
        self.sim.world.at(int(self.sim.world.rng.expovariate(rate) * US_PER_S), self._step)

    def _step(self) -> None:
        if self.sim.stopping:
            return
        self._schedule()
        if self.pending is not None:
            return
        rng, workload = self.sim.world.rng, self.sim.workload
        chance = rng.random()
        if chance < workload.evolve:
            step, proposed = schema_workload.evolve(rng, self.known[self.version])
            self.sim.world.log(f"{self.name} proposes {step}")
            self.pending = proposed
            self._register()
        elif chance < workload.evolve + workload.switch and len(self.known) > 1:
            self.version = rng.choice(sorted(self.known))
            self.sim.world.log(f"{self.name} switches to v{self.version}")
        else:
            self._publish()

    def _register(self) -> None:
        assert self.pending is not None
        definition = schema_workload.encoded(self.pending)
        self.sim.calls.call(
            self.name,
            lambda answer: self.sim.front_end().register(self.subject, "avro", definition, answer),
            self._registered,
        )

    def _registered(self, result: Any) -> None:
        counts = self.sim.registrations
        assert self.pending is not None
        if isinstance(result, Registration):
            counts["accepted" if result.is_new else "already_there"] += 1
            version = result.version.version
            self.sim.checker.registered(
                Told(
                    self.name, self.subject, result.subject.schema_id, version,
                    schema_workload.encoded(self.pending),
                )
            )  # fmt: skip
            self.known[version] = self.pending
            self.version = version
            self.pending = None
            self.sim.world.log(f"{self.name} writes with v{version}")
        elif isinstance(result, DanubeError) and result.code is ErrorCode.FAILED_PRECONDITION:
            counts["refused"] += 1
            self.pending = None
            self.sim.world.log(f"{self.name} stays on v{self.version}: refused")
        elif isinstance(result, DanubeError) and result.code is not ErrorCode.UNAVAILABLE:
            self.pending = None
            self.sim.checker.violation("registration", f"{self.name}: unexpected {result}")
        elif self.sim.stopping:
            self.pending = None
        else:
            counts["retried"] += 1
            self.sim.world.at(RETRY_US, self._register)

    def _publish(self) -> None:
        rng = self.sim.world.rng
        count = 1
        if self.sim.workload.batch and rng.random() < self.sim.workload.batch:
            count = rng.randint(2, 4)
        sent = [self._message() for _ in range(count)]
        subject, topic, checker = self.subject, self.topic, self.sim.checker

        def ask(answer: Callable[[Any], None]) -> None:
            front_end, began = self.sim.front_end(), self.sim.world.now

            def decided(outcome: Any, config: TopicSchemaConfig | None) -> None:
                judged = (front_end.name, config, began)
                checker.admitted_batch(topic, subject, sent, outcome, judged)
                answer(outcome)

            front_end.publish(topic, [message for _, message in sent], decided)

        self.sim.calls.call(self.name, ask, lambda _: None)

    def _message(self) -> tuple[str | None, pb.StreamMessage]:
        """One message written with the producer's version, with a defect now and then."""
        rng = self.sim.world.rng
        schema = self.known[self.version]
        # By definition, not version: under a planted registry bug two schemas get one
        # version number, and `known` keeps the later.
        definition = schema_workload.encoded(schema)
        if definition not in self._writers:
            self._writers[definition] = fastavro.parse_schema(json.loads(definition))
        buffer = io.BytesIO()
        fastavro.schemaless_writer(
            buffer, self._writers[definition], schema_workload.datum(rng, schema)
        )
        payload = buffer.getvalue()
        schema_id: int | None = self.schema_id
        version: int | None = self.version
        defect = rng.choice(DEFECTS) if rng.random() < self.sim.workload.bad else None
        others = [i for s, i in sorted(self.sim.ids.items()) if s != self.subject]
        if defect == "other_subject" and not others:
            defect = "missing_id"
        if defect == "missing_id":
            schema_id = version = None
        elif defect == "unknown_version":
            version = UNKNOWN_VERSION
        elif defect == "other_subject":
            schema_id, version = rng.choice(others), 1
        elif defect == "truncated":
            payload = payload[:-1]
        elif defect == "trailing":
            payload += b"\x00"
        self._requests += 1
        message = pb.StreamMessage(
            request_id=self._requests,
            msg_id=pb.MsgId(topic_name=self.topic),
            payload=payload,
            producer_name=self.name,
            schema_id=schema_id,
            schema_version=version,
        )
        return defect, message


def schema_replay_command(
    seed: int, duration_s: float, workload: SchemaWorkload, faults: SchemaFaults
) -> str:
    """The command line that reruns exactly this run (from `--profile none`)."""
    args = [f"python -m sim --schemas --seed {seed} --duration {duration_s:g} --profile none"]
    args += changed_flags(workload, SchemaWorkload()) + changed_flags(faults, SchemaFaults())
    return " ".join(args)
