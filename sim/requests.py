"""The simulated broker's front end: the request flows the gRPC services run
(`danube.machines.requests`: publish one message or a batch, subscribe, ack one or many, nack; a
receive stream's decisions are `danube.machines.requests.receive.Receiver`'s, in `SimBroker`),
driven over the simulated broker instead of asyncio, so the simulator checks the order and
the decisions production makes, not a copy of them.

What a flow asks is answered as `danube.runtime.request_driver` answers it, with the
simulation's means: a storage wait is a row of the broker's waiter table (the one its WAL
acknowledgements and failures settle), a pause is a timer of the simulated world, metadata
is durable at once (`SimBroker._apply`), the broker is never fenced and no topic carries a
schema policy (the schema run, `sim/schema_front_end.py`, drives the gate). A crash ends
every flow of the incarnation without an answer, as a killed process would.

A flow that fails with anything but a `DanubeError` is answered INTERNAL, as the gRPC
services answer it (`grpc_util.internal_error`), and the broker's observer hears of it: the
checker makes it a violation (a bug of the broker, never a client's fault)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from danube.effects import Sleep
from danube.effects.flow import Finished, Flow, step
from danube.machines.node.requests import Acknowledgement
from danube.machines.requests import publish, receive, settle
from danube.machines.requests.effects import (
    AdmitSchema,
    Apply,
    AwaitRoom,
    AwaitStored,
    CheckFence,
    SchemaInspects,
)
from danube.values.errors import DanubeError

if TYPE_CHECKING:
    from sim.broker import SimBroker
    from sim.world import World

US_PER_MS = 1_000


# -- the requests as the services hold them once decoded ---------------------------------------
#
# The simulated clients send what a gRPC service holds after its hand decoder ran
# (`danube.runtime.wire_codec`): a `records.Record` for a SendMessage, an `Acknowledgement`
# for an Ack or a Nack, and for the batched calls the few fields the flows read. Building a
# betterproto message per request (and converting it) cost about a third of a run; the
# decoders themselves are the production code's, tested against protobuf's parsers on their
# own (tests/broker/test_wire_codec.py, tests/wal/test_records.py). The class names are the
# protobuf messages' (the trace names requests by them).


class AckRequest(Acknowledgement):
    """A `danube.AckRequest`, decoded (`wire_codec.decode_ack`)."""

    __slots__ = ()


class NackRequest(Acknowledgement):
    """A `danube.NackRequest`, decoded (`wire_codec.decode_nack`)."""

    __slots__ = ()


@dataclass(slots=True)
class PublishBatch:
    """A `danube.ext.PublishBatch`: the frame is the wire's bytes (the flow checks them)."""

    producer_id: int
    topic_name: str
    sequence: int
    frame: bytes


@dataclass(slots=True)
class AckBatchRequest:
    """A `danube.ext.AckBatchRequest`."""

    request_id: int
    topic_name: str
    subscription_name: str
    offsets: list[int]


@dataclass(slots=True)
class ProducerRequest:
    """A `danube.ProducerRequest`: what `danube.machines.node.requests.create_producer`
    reads."""

    request_id: int
    producer_name: str
    topic_name: str
    dispatch_strategy: int
    producer_access_mode: int = 0


@dataclass(slots=True)
class ProducerResponse:
    """A `danube.ProducerResponse`: the producer's id."""

    request_id: int
    producer_id: int
    producer_name: str


@dataclass(slots=True)
class ConsumerRequest:
    """A `danube.ConsumerRequest`: what `danube.machines.node.requests.subscribe` reads."""

    request_id: int
    topic_name: str
    consumer_name: str
    subscription: str
    subscription_type: int
    key_filters: tuple[str, ...] = ()


@dataclass(slots=True)
class ConsumerResponse:
    """A `danube.ConsumerResponse`: the consumer's id."""

    request_id: int
    consumer_id: int
    consumer_name: str


class Answer:
    """The answer of a publish or a settlement (`MessageResponse`, `BatchAck`, `AckResponse`,
    ...): the simulated clients read nothing of it but that it is not a refusal."""

    __slots__ = ("request_id",)

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id


class StorageWait:
    """A row of `SimBroker._waiters`: settled by the broker's acknowledgement (`ok`) or its
    failure (`fail`), perhaps before the flow asks to wait on it."""

    __slots__ = ("outcome", "resume", "world")

    def __init__(self, world: World) -> None:
        self.outcome: tuple[DanubeError | None] | None = None
        self.resume: Callable[[DanubeError | None], None] | None = None
        self.world = world

    def ok(self) -> None:
        self._settle(None)

    def fail(self, error: DanubeError) -> None:
        self._settle(error)

    def _settle(self, error: DanubeError | None) -> None:
        if self.outcome is not None:  # the waiter table answered it before: a bug of the table
            self.world.log("storage wait settled again")
            if self.world.answered_twice is not None:
                self.world.answered_twice("a publish waiting for storage")
            return
        self.outcome = (error,)
        if self.resume is not None:
            self.resume(error)


class SimRequests:
    def __init__(self, broker: SimBroker) -> None:
        self.broker = broker
        self.in_flight = 0
        """Flows of this incarnation not answered yet (invariant 18: with none, the publish
        pool holds nothing)."""

    def now(self) -> int:
        return self.broker.now_ms

    def monotonic(self) -> int:
        return self.broker.monotonic_ms

    # -- the flows ---------------------------------------------------------------------------

    def publish_one(self, message: Any) -> Flow[publish.Published]:
        return publish.publish_one(self._core(), message, self.now, monotonic=self.monotonic)

    def publish_batch(self, request: publish.BatchRequest) -> Flow[Any]:
        return publish.publish_batch(self._core(), request, self.now, monotonic=self.monotonic)

    def subscribe(self, request: Any, start: Any) -> Flow[int]:
        return receive.subscribe(self._core(), request, start, self.now())

    def ack(self, topic: str, subscription: str, offsets: list[int]) -> Flow[None]:
        return settle.ack(self._core(), topic, subscription, offsets, self.now())

    def ack_one(self, request: Any) -> Flow[None]:
        return settle.ack_one(self._core(), request, self.now())

    def nack_one(self, request: Any) -> Flow[None]:
        return settle.nack_one(self._core(), request, self.now())

    def _core(self) -> Any:
        core = self.broker.core
        assert core is not None
        return core

    # -- the driver --------------------------------------------------------------------------

    def run(self, flow: Flow[Any], done: Callable[[Any], None]) -> None:
        """Drives `flow`; `done` gets its value or the `DanubeError` that refused it. Any
        other exception of the flow (or of carrying out what it asked) is a bug: `done` gets
        INTERNAL, as production answers, and the observer hears of it."""
        self.in_flight += 1
        _Drive(self.broker, flow, _Counted(self, done)).start()


class _Counted:
    """`done`, counting the flow out of `SimRequests.in_flight` (an object, not a closure:
    see `_Drive`)."""

    __slots__ = ("done", "incarnation", "requests")

    def __init__(self, requests: SimRequests, done: Callable[[Any], None]) -> None:
        self.requests = requests
        self.done = done
        self.incarnation = requests.broker.incarnation

    def __call__(self, answer: Any) -> None:
        if self.requests.broker.incarnation == self.incarnation:
            self.requests.in_flight -= 1
        self.done(answer)


class _Drive:
    """One request flow driven to its end (`SimRequests.run`). An object with methods rather
    than closures: closures that call each other are reference cycles, which only the cyclic
    collector frees, with the flow and everything it holds."""

    __slots__ = ("broker", "done", "flow", "incarnation", "waits")

    def __init__(self, broker: SimBroker, flow: Flow[Any], done: Callable[[Any], None]) -> None:
        self.broker = broker
        self.flow = flow
        self.done = done
        self.incarnation = broker.incarnation
        self.waits: dict[int, StorageWait] = {}

    def start(self) -> None:
        try:
            first = step(self.flow)
        except DanubeError as error:  # pragma: no cover - step reports it as Finished
            self.done(error)
            return
        self.advance(first)

    def advance(self, request: Any) -> None:
        done = self.done
        try:
            finished = self.carry_on(request)
        except Exception as error:  # carrying out an effect failed: a bug
            done(self.broker.internal_error(self.flow, error))
            return
        if finished is None:
            return  # waiting, or the broker crashed
        if isinstance(finished.error, DanubeError):
            done(finished.error)
        elif finished.error is not None:
            done(self.broker.internal_error(self.flow, finished.error))
        else:
            done(finished.value)

    def carry_on(self, request: Any) -> Finished | None:
        """Answers the flow's requests up to its end (returned) or a wait (None). Dispatched
        on the request's exact type (the product's request types have no subclasses: an
        unknown type is still refused below), most frequent first: a chain of `isinstance`
        tests was most of this loop's own time, and this loop runs for every request."""
        broker, flow, waits = self.broker, self.flow, self.waits
        incarnation = self.incarnation
        while (kind := type(request)) is not Finished:
            if broker.incarnation != incarnation or not broker.up:
                return None  # the broker crashed: nobody answers
            if kind is CheckFence:
                request = step(flow, answer=None)
            elif kind is Apply:
                if request.stored is not None:
                    wait = waits[id(request.stored)] = StorageWait(broker.world)
                    broker.wait_for_storage(request.stored.topic, request.stored.through, wait)
                broker.apply_step(request.step)
                broker.publish_checked()
                request = step(flow, answer=None)
            elif kind is AwaitStored:
                wait = waits.pop(id(request))
                if wait.outcome is None:
                    wait.resume = self.resumed
                    return None
                request = _resume(flow, wait.outcome[0])
            elif kind is AdmitSchema:
                request = step(flow, answer=None)
            elif kind is SchemaInspects:
                request = step(flow, answer=False)
            elif kind is AwaitRoom:
                if request.waiter.granted:
                    request = step(flow, answer=None)
                    continue
                self.await_room(request)
                return None
            elif kind is Sleep:
                broker.world.at(request.ms * US_PER_MS, self.woke)
                return None
            else:
                raise TypeError(f"a request flow asked for {request!r}")
        return request

    def woke(self) -> None:
        self.resumed(None)

    def await_room(self, request: AwaitRoom) -> None:
        """Resumed once, by the pool admitting the waiter (next event) or the timeout."""
        world, waiter = self.broker.world, request.waiter
        core = self.broker.core
        if core is not None and core.publish_pool is not None:
            self.broker.observer.room_wait_checked(request.timeout_ms, core.publish_pool)
        pending = [True]

        def resume() -> None:
            if pending[0]:
                pending[0] = False
                waiter.wake = None
                self.woke()

        waiter.wake = lambda: world.at(0, resume)
        world.at(request.timeout_ms * US_PER_MS, resume)

    def resumed(self, error: DanubeError | None) -> None:
        if self.broker.incarnation == self.incarnation and self.broker.up:
            self.advance(_resume(self.flow, error))


def _resume(flow: Flow[Any], error: DanubeError | None) -> Any:
    return step(flow, error=error) if error is not None else step(flow, answer=None)
