"""A broker's schema registry and publish check in the schema run: the decisions of
`danube.schema` (`registry.register`, `registry.as_the_subject_reads`, `records.commit`,
`policy.admission`) composed as `danube.broker.schema_service` and `schema_gate` compose
them, against the simulated etcd.

Each request runs as a flow: a generator that yields the store calls it needs and gets their
answers back, so a registration's read, decision and compare-and-put interleave with other
brokers' as they would over a network. A store call that gets no answer within the request
timeout ends the flow with UNAVAILABLE (the client retries); a crash ends every flow of the
incarnation without an answer and forgets the caches, as a restarted process would."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from danube.core.errors import DanubeError, ErrorCode, invalid
from danube.core.names import parse_topic
from danube.metadata.model import Compare, MetadataError, Op, TxnResult
from danube.node import paths
from danube.proto import danube as pb
from danube.schema import policy, records, registry
from danube.schema.errors import SchemaParseError
from danube.schema.formats import ParsedSchema, SchemaType, parse
from danube.schema.policy import TopicSchemaConfig, Verdict
from danube.schema.registry import Registration, SchemaVersion
from sim.etcd import Origin, SimEtcd
from sim.world import US_PER_S, World

REQUEST_TIMEOUT_US = 3 * US_PER_S
"""The broker's store request timeout (`danube.broker.watching.REQUEST_TIMEOUT_S`, which
the simulator does not import: it would bring in the trio driver)."""


@dataclass(frozen=True, slots=True)
class StoreCall:
    what: str
    run: Callable[[], Any]


Flow = Generator[StoreCall, Any, Any]


class FrontEnd:
    def __init__(self, name: str, world: World, etcd: SimEtcd) -> None:
        self.name = name
        self.world = world
        self.etcd = etcd
        self.incarnation = 0
        self._parsed: dict[tuple[SchemaType, str, str], ParsedSchema] = {}
        self._by_id: dict[tuple[int, int], tuple[str, ParsedSchema]] = {}
        self._bindings: dict[str, TopicSchemaConfig | None] = {}

    def crash(self) -> None:
        self.incarnation += 1
        self._parsed.clear()
        self._by_id.clear()
        self._bindings.clear()
        self.world.log(f"fault front-end {self.name} crashes")

    # -- requests ----------------------------------------------------------------------------

    def register(self, subject: str, definition: bytes, answer: Callable[[Any], None]) -> None:
        """`answer` gets a `Registration` or a `DanubeError`."""
        self._run(f"register {subject}", self._register(subject, definition), answer)

    def set_mode(self, subject: str, mode: str, answer: Callable[[Any], None]) -> None:
        self._run(f"mode {subject}", self._set_mode(subject, mode), answer)

    def publish(self, topic: str, message: pb.StreamMessage, answer: Callable[[Any], None]) -> None:
        """`answer` gets the `Verdict` of an accepted message or the `DanubeError` that
        refused it."""
        self._run(f"publish {topic}", self._admit(topic, message), answer)

    # -- flows (what SchemaService and SchemaGate do) -----------------------------------------

    def _register(self, name: str, definition: bytes) -> Flow:
        registry.check_subject_name(name)
        parsed = self._parse(definition)
        for _ in range(records.RACE_ATTEMPTS):
            seen = yield self._get(records.subject_key(name))
            subject = None if seen is None else records.subject_from_json(seen.value)
            candidate = registry.as_the_subject_reads(subject, parsed)
            counter = None
            if subject is None:
                counter = yield self._get(records.NEXT_ID)
            outcome: Registration = registry.register(
                subject, name, candidate, self._read,
                new_id=1 if counter is None else int(counter.value),
                now_ms=self.world.now_ms, created_by=self.name, description="", tags=(),
            )  # fmt: skip
            if outcome.is_new:
                compares, ops = records.commit(
                    outcome.subject,
                    None if seen is None else seen.mod_revision,
                    None if counter is None else counter.mod_revision,
                )
                result: TxnResult = yield self._txn(compares, ops, "register")
                if not result.succeeded:
                    continue
            return outcome
        raise DanubeError(ErrorCode.UNAVAILABLE, f"subject {name!r} kept changing; retry")

    def _set_mode(self, name: str, mode_text: str) -> Flow:
        mode = registry.parse_mode(mode_text)
        for _ in range(records.RACE_ATTEMPTS):
            seen = yield self._get(records.subject_key(name))
            if seen is None:
                raise DanubeError(ErrorCode.NOT_FOUND, f"subject {name!r} is not registered")
            changed = registry.set_mode(records.subject_from_json(seen.value), mode)
            compares, ops = records.commit(changed, seen.mod_revision, None)
            result: TxnResult = yield self._txn(compares, ops, "mode")
            if result.succeeded:
                return changed
        raise DanubeError(ErrorCode.UNAVAILABLE, f"subject {name!r} kept changing; retry")

    def _admit(self, topic: str, message: pb.StreamMessage) -> Flow:
        if topic not in self._bindings:
            found = yield self._get(paths.topic_schema_config(parse_topic(topic)))
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

    def _schema_of(self, schema_id: int, version: int | None) -> Flow:
        if version is not None and (schema_id, version) in self._by_id:
            return self._by_id[(schema_id, version)]
        index = yield self._get(records.id_key(schema_id))
        if index is None:
            return None
        found = yield self._get(records.subject_key(str(index.value["subject"])))
        if found is None:
            return None
        subject = records.subject_from_json(found.value)
        live = {v.version: v for v in subject.versions}
        newest = subject.versions[-1] if subject.versions else None
        chosen = live.get(version) if version is not None else newest
        if chosen is None:
            return None
        named = (subject.name, self._read(chosen))
        if version is not None:
            self._by_id[(schema_id, version)] = named
        return named

    # -- helpers -----------------------------------------------------------------------------

    def _parse(self, definition: bytes) -> ParsedSchema:
        try:
            return parse(SchemaType.AVRO, definition)
        except SchemaParseError as error:
            raise invalid(f"invalid avro schema: {error}") from None

    def _read(self, version: SchemaVersion) -> ParsedSchema:
        key = (version.schema_type, version.fingerprint, version.message)
        if key not in self._parsed:
            self._parsed[key] = parse(version.schema_type, version.definition)
        return self._parsed[key]

    def _get(self, key: str) -> StoreCall:
        return StoreCall(f"get {key}", lambda: self.etcd.get(key))

    def _txn(self, compares: Sequence[Compare], ops: Sequence[Op], kind: str) -> StoreCall:
        origin = Origin(self.name, kind)
        return StoreCall(f"txn {kind}", lambda: self.etcd.txn(compares, ops, origin))

    def _run(self, what: str, flow: Flow, answer: Callable[[Any], None]) -> None:
        """Drives `flow` over the store until it returns or raises; a crash of this
        incarnation leaves it unanswered."""
        incarnation = self.incarnation

        def step(value: Any) -> None:
            if incarnation != self.incarnation:
                return
            try:
                thrown = isinstance(value, BaseException)
                call = flow.throw(value) if thrown else flow.send(value)
            except StopIteration as done:
                answer(done.value)
                return
            except DanubeError as error:
                answer(error)
                return
            except (TimeoutError, MetadataError) as error:
                self.world.log(f"front-end {self.name} {what}: store failed: {error!r}")
                answer(DanubeError(ErrorCode.UNAVAILABLE, f"metadata store: {error}"))
                return
            ask(call)

        def ask(call: StoreCall) -> None:
            answered = False

            def finish(result: Any) -> None:
                nonlocal answered
                if answered:
                    return
                answered = True
                step(result)

            self.world.at(
                REQUEST_TIMEOUT_US, lambda: finish(TimeoutError(f"no answer to {call.what}"))
            )
            self.etcd.request(self.name, call.what, call.run, finish)

        step(None)
