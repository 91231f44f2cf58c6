"""A broker's schema registry and publish check in the schema run: the registry's flows
(`danube.machines.schema.flows`: register, update, the version a message names) and the publish
check (`danube.machines.requests.schema_gate.admit`, with its binding cache on the simulated clock)
driven over the simulated etcd as `danube.runtime.schema_service` drives them over etcd.

Every store call crosses the simulated network, so two brokers' reads, decisions and
compare-and-puts interleave as they would. A store call that gets no answer within the
request timeout fails it (thrown into the flow as UNAVAILABLE, as production's store calls
fail: the gate serves the binding it had, the registry's flows end with it and the client
retries); a crash ends every request of the incarnation without an answer and forgets the
caches, as a restarted process would. CPU-bound steps (`flows.Work`) run at once; one over
a limit is thrown in as RESOURCE_EXHAUSTED."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

from danube.machines.requests import schema_gate as gate
from danube.machines.requests.binding_cache import BindingCache
from danube.machines.schema import flows, registry
from danube.machines.schema.budget import LimitExceeded
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.formats import ParsedSchema, SchemaType, parse, schema_type
from danube.machines.schema.policy import Problem, TopicSchemaConfig
from danube.machines.schema.registry import SchemaVersion
from danube.metadata.model import MetadataError
from danube.proto import danube as pb
from danube.values.errors import DanubeError, ErrorCode, invalid
from sim.cluster_node import REQUEST_TIMEOUT_US
from sim.etcd import Origin, SimEtcd
from sim.world import US_PER_S, World

Request = Generator[flows.Step, Any, Any]


class ReadObserver(Protocol):
    def store_read(self, front_end: str, key: str, answer: Any) -> None:
        """A read of `key` was answered (a `KeyValue`, None) or failed (an exception),
        just before the flow that asked gets it."""

    def crashed(self, front_end: str) -> None:
        """The front end lost its caches."""


class Judged(gate.Report):
    """One publish's report: the binding it was judged under (for the checker)."""

    def __init__(self) -> None:
        self.config: TopicSchemaConfig | None = None

    def judged(self, topic: str, config: TopicSchemaConfig, problem: Problem | None) -> None:
        self.config = config

    def warned(self, topic: str, problem: Problem, detail: str) -> None:
        pass


class FrontEnd:
    def __init__(
        self,
        name: str,
        world: World,
        etcd: SimEtcd,
        observer: ReadObserver | None = None,
    ) -> None:
        """`observer` hears each store read this front end's flows get an answer to (or
        fail) and each crash: the checker follows the gate's binding cache with them."""
        self.name = name
        self.world = world
        self.etcd = etcd
        self.incarnation = 0
        self._observer = observer
        self._parsed: dict[tuple[SchemaType, str, str], ParsedSchema] = {}
        self._new_caches()

    def _new_caches(self) -> None:
        """As a broker's `SchemaService`: bindings (`BindingCache`) and the schemas messages
        named, on the simulated clock."""
        clock = self._clock
        self.bindings: BindingCache[gate.Binding] = BindingCache(clock)
        self._by_id = gate.NamedCache(clock)

    def _clock(self) -> float:
        return self.world.now / US_PER_S

    def crash(self) -> None:
        self.incarnation += 1
        self._parsed.clear()
        self._new_caches()
        self.world.log(f"fault front-end {self.name} crashes")
        if self._observer is not None:
            self._observer.crashed(self.name)

    # -- requests ----------------------------------------------------------------------------

    def register(
        self, subject: str, kind: str, definition: bytes, answer: Callable[[Any], None]
    ) -> None:
        """`answer` gets a `Registration` or a `DanubeError`."""
        self._run(f"register {subject}", self._register(subject, kind, definition), answer)

    def set_mode(self, subject: str, mode: str, answer: Callable[[Any], None]) -> None:
        """`answer` gets the changed `Subject` or a `DanubeError`."""
        self._run(f"mode {subject}", self._set_mode(subject, mode), answer)

    def publish(
        self,
        topic: str,
        messages: list[pb.StreamMessage],
        answer: Callable[[Any, TopicSchemaConfig | None], None],
    ) -> None:
        """`answer` gets the `Verdict`s of accepted messages (one per message: a batch is
        admitted whole, as `PublishBatches` and `SendMessage` both go through
        `gate.admit`) or the `DanubeError` that refused them, with the binding they were
        judged under (None: none, or not judged)."""
        judged = Judged()
        flow = gate.admit(self.bindings, self._by_id, self._read, topic, messages, judged)
        self._run(
            f"publish {topic}",
            flow,
            lambda outcome: answer(
                outcome.verdicts if isinstance(outcome, gate.Admission) else outcome,
                outcome.config if isinstance(outcome, gate.Admission) else judged.config,
            ),
        )

    # -- requests as the broker serves them ---------------------------------------------

    def _register(self, name: str, kind: str, definition: bytes) -> Request:
        registry.check_subject_name(name)
        try:
            parsed = parse(schema_type(kind), definition)
        except SchemaParseError as error:
            raise invalid(f"invalid {kind} schema: {error}") from None
        return (
            yield from flows.register(
                name, parsed, self._read, now_ms=self.world.now_ms, created_by=self.name,
                description="", tags=(),
            )
        )  # fmt: skip

    def _set_mode(self, name: str, mode_text: str) -> Request:
        mode = registry.parse_mode(mode_text)
        return (yield from flows.update(name, lambda subject: registry.set_mode(subject, mode)))

    # -- helpers -----------------------------------------------------------------------------

    def _read(self, version: SchemaVersion) -> ParsedSchema:
        key = (version.schema_type, version.fingerprint, version.message)
        if key not in self._parsed:
            self._parsed[key] = registry.parse_version(version)
        return self._parsed[key]

    def _store_call(self, step: flows.Read | flows.Write) -> tuple[str, Callable[[], Any]]:
        if isinstance(step, flows.Read):
            return f"get {step.key}", lambda: self.etcd.get(step.key)
        origin = Origin(self.name, "schema")
        return "txn", lambda: self.etcd.txn(step.compares, step.ops, origin).succeeded

    def _run(self, what: str, request: Request, answer: Callable[[Any], None]) -> None:
        """Drives `request` over the store until it returns or raises; a crash of this
        incarnation leaves it unanswered."""
        incarnation = self.incarnation

        def step(value: Any) -> None:
            while incarnation == self.incarnation:
                try:
                    thrown = isinstance(value, BaseException)
                    call = request.throw(value) if thrown else request.send(value)
                    if isinstance(call, flows.Work):
                        try:
                            value = call.run()
                        except LimitExceeded as error:  # as SchemaService._work maps it
                            value = DanubeError(ErrorCode.RESOURCE_EXHAUSTED, str(error))
                        continue
                except StopIteration as done:
                    answer(done.value)
                except DanubeError as error:
                    answer(error)
                except LimitExceeded as error:  # as SchemaService._work maps it
                    answer(DanubeError(ErrorCode.RESOURCE_EXHAUSTED, str(error)))
                except (TimeoutError, MetadataError) as error:
                    self.world.log(f"front-end {self.name} {what}: store failed: {error!r}")
                    answer(DanubeError(ErrorCode.UNAVAILABLE, f"metadata store: {error}"))
                else:
                    ask(call)
                return

        def ask(call: flows.Read | flows.Write) -> None:
            answered = False
            what, run = self._store_call(call)

            def finish(result: Any) -> None:
                nonlocal answered
                if answered:
                    return
                answered = True
                observed = isinstance(call, flows.Read) and incarnation == self.incarnation
                if observed and self._observer is not None:
                    self._observer.store_read(self.name, call.key, result)
                if isinstance(result, (TimeoutError, MetadataError)):
                    self.world.log(f"front-end {self.name} {what}: store failed: {result!r}")
                    result = DanubeError(ErrorCode.UNAVAILABLE, f"metadata store: {result}")
                step(result)

            self.world.at(REQUEST_TIMEOUT_US, lambda: finish(TimeoutError(f"no answer to {what}")))
            self.etcd.request(self.name, what, run, finish)

        step(None)
