"""The simulator checks what production decides: a publish (one message and a batch), an
ack (one and many), a nack, a subscription and a receive stream, run by the broker's
gRPC-side driver (`danube.runtime.request_driver`, `runtime/streams.py`) and by a simulator
run (`sim/requests.py`, `SimBroker`'s streams), go through the same decision modules and
the same request-flow functions; so does the schema gate, in the broker's `SchemaGate` and
in the schema run (`sim/schema_front_end.py`)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from danube.machines.dispatch import QueueLimits
from danube.machines.node import paths, requests
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.machines.requests import receive, settle
from danube.machines.requests.publish import BatchRequest, publish_batch, publish_one
from danube.machines.schema import flows as schema_flows
from danube.machines.schema.formats import SchemaType, parse
from danube.machines.schema.policy import TopicSchemaConfig, ValidationPolicy
from danube.machines.wal import records
from danube.machines.wal.format import encode_frame
from danube.machines.wal.machine import WalConfig
from danube.metadata.state import MetadataState
from danube.proto import danube as pb
from danube.runtime.request_driver import RequestDriver
from danube.runtime.schema_gate import SchemaGate
from danube.runtime.schema_service import SchemaService
from danube.runtime.stage_metrics import StageLatency
from danube.runtime.streams import serve_consumer
from danube.testing import CoreDriver
from danube.values.config import Policies
from danube.values.names import parse_topic
from sim.__main__ import PROFILES
from sim.clients import SimBatchConsumer, SimBatchProducer
from sim.run import Simulation, Workload
from sim.schema_run import SCHEMA_PROFILES, SchemaSimulation, SchemaWorkload

URL = "http://broker:6650"
TOPIC = "/default/decisions"


def _decision_module(name: str) -> bool:
    return name == "danube.machines.node.requests" or name.startswith("danube.machines.requests")


@contextmanager
def _recording() -> Iterator[set[tuple[str, str]]]:
    """(module, function) of every call into the request decision modules. Garbage of
    earlier tests is collected first: a suspended flow of an old simulation (an operator's
    call to `danube.machines.requests.admin`) that the collector finalizes meanwhile is
    resumed to close, which the profile sees as a call."""
    seen: set[tuple[str, str]] = set()
    gc.collect()

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if _decision_module(module):
                seen.add((module, frame.f_code.co_name))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


class _Done:
    def __await__(self) -> Any:
        return None
        yield  # pragma: no cover


class _InstantRuntime:
    """What `RequestDriver` asks of `BrokerRuntime`, with every effect done at once (the
    runtime is I/O: it is not on the decision path)."""

    fenced = None
    stopping = False

    def __init__(self, wal: CoreDriver) -> None:
        self._wal = wal
        self.core = wal.core
        self.metrics = _Metrics()
        self.slot: Any = None

    def start(self, step: Any) -> _Done:
        self._wal.run(step.effects)
        return _Done()

    async def run(self, step: Any) -> Any:
        self._wal.run(step.effects)
        return step.value

    def apply(self, effects: Any) -> None:
        self._wal.run(effects)

    def attach_stream(self, consumer_id: int, generation: int) -> Any:
        self.slot = _Slot(generation)
        return self.slot

    def detach_stream(self, consumer_id: int, slot: Any) -> None:
        pass

    def start_publish(self, topic: str, step: Any, through: int) -> Any:
        self._wal.run(step.effects)

        async def stored() -> None:
            return None

        return stored()


class _Metrics:
    def __init__(self) -> None:
        self.stages = StageLatency()

    def consumer_sent(self, *_: Any) -> None:
        pass


class _Slot:
    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.ended = False
        self.wakeup = asyncio.Event()


class _Wire:
    """A gRPC server stream that takes one turn of messages; the client then leaves."""

    async def send_initial_metadata(self) -> None:
        pass


class _NoSchemas:
    """A gate over a broker without schema bindings (as the simulator's main run has)."""

    async def inspects(self, topic: str) -> bool:
        return False

    async def admit_batch(self, topic: str, messages: Any) -> None:
        return None


def _broker_side() -> set[tuple[str, str]]:
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
        wal_config=WalConfig(),
        max_unacked_messages=10,
        routing_key_of=records.routing_key,
    )
    wal = CoreDriver(core)
    wal.run(core.bootstrap(["default"]).effects)
    driver = RequestDriver(_InstantRuntime(wal), _NoSchemas())  # type: ignore[arg-type]
    now: Callable[[], int] = lambda: wal.now_ms  # noqa: E731

    async def scenario() -> None:
        producer = requests.create_producer(
            core, pb.ProducerRequest(request_id=1, producer_name="p", topic_name=TOPIC)
        )
        wal.run(producer.effects)
        consumer = pb.ConsumerRequest(
            request_id=2, topic_name=TOPIC, consumer_name="c", subscription="s"
        )
        consumer_id = await driver.run(receive.subscribe(core, consumer, None, now()))
        message = requests.record_of(
            pb.StreamMessage(
                request_id=3,
                msg_id=pb.MsgId(producer_id=producer.value, topic_name=TOPIC),
                payload=b"one",
            )
        )
        await driver.run(publish_one(core, message, now, monotonic=now))
        frame = encode_frame(
            0, 0, [records.encode(records.Record(payload=b"two", has_msg_id=False))] * 2
        )
        await driver.run(
            publish_batch(core, BatchRequest(producer.value, TOPIC, frame), now, monotonic=now)
        )
        one = requests.Acknowledgement(4, True, TOPIC, 0, "s")
        await driver.run(settle.ack_one(core, one, now()))
        await driver.run(settle.ack(core, TOPIC, "s", [1, 2], now()))
        await driver.run(
            settle.nack_one(core, requests.Acknowledgement(5, True, TOPIC, 1, "s"), now())
        )
        runtime = driver._runtime

        async def send(items: list[Any]) -> int:
            runtime.slot.ended = True  # the client leaves after one turn
            runtime.slot.wakeup.set()
            return len(items)

        await serve_consumer(runtime, _Wire(), consumer_id, receive.turn_limit(None), send)  # type: ignore[arg-type]

    with _recording() as seen:
        asyncio.run(scenario())
    return seen


CUT_OFF = dataclasses.replace(PROFILES["none"], partition=0.2)
"""No faults but clients cut off now and then, so receive streams end and close."""


def _simulator_side() -> set[tuple[str, str]]:
    workload = Workload(nack=0.2, batched=0.5)
    for seed in range(1, 20):
        simulation = Simulation(seed, workload, CUT_OFF)
        kinds = {type(p) for p in simulation.producers} | {type(c) for c in simulation.consumers}
        if SimBatchProducer in kinds and SimBatchConsumer in kinds and len(kinds) == 4:
            with _recording() as seen:
                result = simulation.run(2)
            assert result.ok and result.acknowledged > 0
            return seen
    raise AssertionError("no seed in 1-19 mixes plain and batched clients")


def test_broker_and_simulator_decide_publishes_and_acks_in_the_same_code() -> None:
    broker, simulator = _broker_side(), _simulator_side()
    assert {m for m, _ in broker} == {m for m, _ in simulator}
    flows = {f for f in broker if f[0].startswith("danube.machines.requests")}
    assert flows == {f for f in simulator if f[0].startswith("danube.machines.requests")}
    assert ("danube.machines.requests.publish", "publish_batch") in flows
    assert ("danube.machines.requests.settle", "nack_one") in flows
    assert ("danube.machines.requests.receive", "subscribe") in flows
    assert ("danube.machines.requests.receive", "turn") in flows


class _StoreService(SchemaService):
    """The broker's schema service over an in-memory store (`MetadataState`): its flows
    are driven by `SchemaService._drive`, as over etcd, with CPU work done at once."""

    def __init__(self, state: MetadataState) -> None:
        super().__init__(store=None, offload=None, placement=None)  # type: ignore[arg-type]
        self._state = state

    async def _drive(self, flow: Any) -> Any:
        answer: Any = None
        try:
            while True:
                step = flow.send(answer)
                if isinstance(step, schema_flows.Read):
                    answer = self._state.get(step.key)
                elif isinstance(step, schema_flows.Write):
                    answer = self._state.txn(step.compares, step.ops)[0].succeeded
                else:
                    answer = step.run()
        except StopIteration as done:
            return done.value


AVRO = b'{"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}'


def _broker_gate() -> set[tuple[str, str]]:
    state = MetadataState()
    service = _StoreService(state)
    topic = "/default/gated"
    parsed = parse(SchemaType.AVRO, AVRO)
    registration = asyncio.run(
        service._drive(
            schema_flows.register(
                "gated", parsed, service._read, now_ms=0, created_by="t", description="", tags=()
            )
        )
    )
    config = TopicSchemaConfig("gated", ValidationPolicy.WARN, True)
    state.put(paths.topic_schema_config(parse_topic(topic)), config.to_json())
    schema_id = registration.subject.schema_id
    good = records.Record(payload=b"\x02", schema_id=schema_id, schema_version=1)
    bad = records.Record(payload=b"", schema_id=schema_id, schema_version=1)
    gate = SchemaGate(service)
    with _recording() as seen:
        asyncio.run(gate.admit(topic, good))
        asyncio.run(gate.admit(topic, bad))  # the schema run publishes one message a time
    return seen


def _simulator_gate() -> set[tuple[str, str]]:
    with _recording() as seen:
        result = SchemaSimulation(1, SchemaWorkload(), SCHEMA_PROFILES["none"]).run(1.5)
    assert result.ok and result.publishes.get("warned", 0) > 0
    return seen


def test_broker_and_simulator_decide_the_schema_gate_in_the_same_code() -> None:
    """Issue 21: the gate's binding cache, the schemas messages name and the verdicts are
    `danube.machines.requests.schema_gate`'s, in the broker's `SchemaGate` and in the schema run."""
    broker = {f for f in _broker_gate() if f[0] == "danube.machines.requests.schema_gate"}
    simulator = {f for f in _simulator_gate() if f[0] == "danube.machines.requests.schema_gate"}
    assert broker <= simulator, broker - simulator
    for name in ("admit", "binding", "schema_of", "payload_problems"):
        assert ("danube.machines.requests.schema_gate", name) in broker
