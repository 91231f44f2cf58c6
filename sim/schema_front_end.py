"""A broker's schema registry and publish check in the schema run: the registry's flows
(`danube.schema.flows`: register, update, the version a message names) driven over the
simulated etcd as `danube.broker.schema_service` drives them over etcd, and the publish
check `danube.broker.schema_gate` makes (`policy.inspects`, `policy.admission`).

Every store call crosses the simulated network, so two brokers' reads, decisions and
compare-and-puts interleave as they would. A store call that gets no answer within the
request timeout ends the request with UNAVAILABLE (the client retries); a crash ends every
request of the incarnation without an answer and forgets the caches, as a restarted process
would. CPU-bound steps (`flows.Work`) run at once."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from danube.core.errors import DanubeError, ErrorCode, invalid
from danube.core.names import parse_topic
from danube.metadata.model import MetadataError
from danube.node import paths
from danube.proto import danube as pb
from danube.schema import flows, policy, registry
from danube.schema.budget import LimitExceeded
from danube.schema.errors import SchemaParseError
from danube.schema.formats import ParsedSchema, SchemaType, parse, schema_type
from danube.schema.policy import TopicSchemaConfig, Verdict
from danube.schema.registry import SchemaVersion
from sim.cluster_node import REQUEST_TIMEOUT_US
from sim.etcd import Origin, SimEtcd
from sim.world import US_PER_S, World

NAMED_TTL_US = int(flows.NAMED_TTL_S * US_PER_S)
Request = Generator[flows.Step, Any, Any]


class FrontEnd:
    def __init__(self, name: str, world: World, etcd: SimEtcd) -> None:
        self.name = name
        self.world = world
        self.etcd = etcd
        self.incarnation = 0
        self._parsed: dict[tuple[SchemaType, str, str], ParsedSchema] = {}
        self._by_id: dict[tuple[int, int], tuple[int, tuple[str, ParsedSchema]]] = {}
        """As the broker's: what a message named, with when it was read (NAMED_TTL_S)."""
        self._bindings: dict[str, TopicSchemaConfig | None] = {}
        """Kept for the whole incarnation: the run binds topics once, before it starts."""

    def crash(self) -> None:
        self.incarnation += 1
        self._parsed.clear()
        self._by_id.clear()
        self._bindings.clear()
        self.world.log(f"fault front-end {self.name} crashes")

    # -- requests ----------------------------------------------------------------------------

    def register(
        self, subject: str, kind: str, definition: bytes, answer: Callable[[Any], None]
    ) -> None:
        """`answer` gets a `Registration` or a `DanubeError`."""
        self._run(f"register {subject}", self._register(subject, kind, definition), answer)

    def set_mode(self, subject: str, mode: str, answer: Callable[[Any], None]) -> None:
        """`answer` gets the changed `Subject` or a `DanubeError`."""
        self._run(f"mode {subject}", self._set_mode(subject, mode), answer)

    def publish(self, topic: str, message: pb.StreamMessage, answer: Callable[[Any], None]) -> None:
        """`answer` gets the `Verdict` of an accepted message or the `DanubeError` that
        refused it."""
        self._run(f"publish {topic}", self._admit(topic, message), answer)

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

    def _admit(self, topic: str, message: pb.StreamMessage) -> Request:
        """What `SchemaGate.admit` does."""
        if topic not in self._bindings:
            found = yield flows.Read(paths.topic_schema_config(parse_topic(topic)))
            self._bindings[topic] = (
                None if found is None else TopicSchemaConfig.from_json(found.value)
            )
        config = self._bindings[topic]
        named = None
        if message.schema_id is not None and policy.inspects(config):
            named = yield from self._schema_of(message.schema_id, message.schema_version)
        verdict: Verdict = policy.admission(config, message.schema_id, named, message.payload)
        if not verdict.accept:
            raise DanubeError(ErrorCode.INVALID_ARGUMENT, verdict.detail)
        return verdict

    def _schema_of(self, schema_id: int, version: int | None) -> Request:
        """What `SchemaService.schema_of` does, on the simulated clock."""
        cached = None if version is None else self._by_id.get((schema_id, version))
        if cached is not None and self.world.now - cached[0] < NAMED_TTL_US:
            return cached[1]
        found = yield from flows.named(schema_id, version)
        if found is None:
            return None
        named = (found[0].name, self._read(found[1]))
        if version is not None:
            self._by_id[(schema_id, version)] = (self.world.now, named)
        return named

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
                        value = call.run()
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
                if not answered:
                    answered = True
                    step(result)

            self.world.at(REQUEST_TIMEOUT_US, lambda: finish(TimeoutError(f"no answer to {what}")))
            self.etcd.request(self.name, what, run, finish)

        step(None)
