"""`danube_schema.SchemaRegistry` on the broker and admin ports: subjects in the metadata
store, decisions in `danube.machines.schema.registry`.

Every change to a subject is one transaction that compares the revisions it read (the
subject's key and, for a new subject, the id counter), so brokers of a cluster sharing one
etcd cannot register two versions under one number or give two subjects one id; a lost race
is read again and decided again (`danube.machines.schema.flows`, spec/schema-registry.md). Topic
bindings are written under a compare too, except an operator's ConfigureTopicSchema, which
replaces whatever is there."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import grpclib.const
import trio

from danube.machines.node import paths
from danube.machines.requests import schema_gate as gate
from danube.machines.requests.binding_cache import BindingCache
from danube.machines.schema import budget as budgets
from danube.machines.schema import flows, records, registry
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.flows import NAMED_TTL_S
from danube.machines.schema.formats import ParsedSchema, SchemaType, parse, schema_type
from danube.machines.schema.limits import (
    SCHEMA_WORK_CPU_SECONDS,
)
from danube.machines.schema.policy import (
    TopicSchemaConfig,
    ValidationPolicy,
    parse_policy,
    updated_binding,
)
from danube.machines.schema.registry import SchemaVersion, Subject
from danube.metadata import MetadataStore
from danube.metadata.model import Compare, Get, Put
from danube.proto import danube_schema as pb
from danube.protoc import compile_proto
from danube.runtime.broker import now_ms
from danube.runtime.grpc_util import unary
from danube.runtime.placement import Placement
from danube.runtime.watching import store_call_from_grpc
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.values.names import TopicName, parse_topic

T = TypeVar("T")
MAX_DEFINITION_BYTES = 256 * 1024
"""A subject is one metadata key, rewritten whole on every change (`records.MAX_SUBJECT_BYTES`
bounds it): one definition may take a quarter of it."""
PARSED_CACHE = 256
"""Stored versions kept parsed (every check reads the latest, transitive ones all)."""
CONFIG_CACHE = 65_536
"""Topics whose binding is kept: CreateProducer reads the binding before the core has
looked at the topic, so the names a client sends must not grow the broker's memory without
bound."""
CONFIG_TTL_S = 1.0
"""How long a topic's binding is trusted before it is read again: a change made through
another broker of a cluster takes effect within this time (through this one, at once)."""

Offload = Callable[[Callable[[], T]], Awaitable[T]]
"""Runs CPU-bound work (protoc, parsing, comparing) away from the event loop, with a bound
on how much runs at once (`danube.runtime.server` passes trio threads with a limiter)."""

log = logging.getLogger("danube.runtime")


async def in_worker_thread(work: Callable[[], T], limiter: trio.CapacityLimiter) -> T:
    """Runs `work` in a trio worker thread with the schema runtime in force: budgets made
    inside see the thread's CPU clock, and the cancel flag set when the caller stops
    waiting (a graceful stop, a client gone). The thread is abandoned at once then and ends
    at its work's next step, so nothing waits on a check that no one wants."""
    cancel = threading.Event()
    runtime = budgets.Runtime(time.thread_time, cancel, SCHEMA_WORK_CPU_SECONDS)
    try:
        result: T = await trio.to_thread.run_sync(
            partial(budgets.run_with, runtime, work),  # type: ignore[arg-type]
            limiter=limiter,
            abandon_on_cancel=True,
        )
    finally:
        cancel.set()
    return result


def over_budget(error: budgets.LimitExceeded) -> DanubeError:
    """What the client sees of work refused by a limit: RESOURCE_EXHAUSTED naming it."""
    return DanubeError(ErrorCode.RESOURCE_EXHAUSTED, str(error))


class SchemaService:
    def __init__(
        self,
        store: MetadataStore,
        offload: Offload[Any],
        placement: Placement,
        on_parse: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`on_parse` is told the schema type of every definition a caller sends to the
        parser (`danube_schema_parse_total`: the evidence that an unauthenticated caller
        never gets this far)."""
        self._store = store
        self._on_parse = on_parse
        self._offload = offload
        self._placement = placement
        self._parsed: OrderedDict[tuple[SchemaType, str, str], ParsedSchema] = OrderedDict()
        self._parsed_lock = threading.Lock()
        """`_read` runs in worker threads (checks, payload lookups), two at once."""
        self._configs: BindingCache[TopicSchemaConfig | str | None] = BindingCache(
            time.monotonic, CONFIG_TTL_S, CONFIG_CACHE
        )
        """Bindings by topic (`danube.machines.requests.binding_cache`); a damaged one as its error
        text."""
        self._by_id = gate.NamedCache(time.monotonic, NAMED_TTL_S, PARSED_CACHE)
        """Schemas messages named by (id, version), with when they were read (NAMED_TTL_S)."""

    async def _work(self, work: Callable[[], T]) -> T:
        """`work` in a worker thread; a limit it reaches becomes RESOURCE_EXHAUSTED."""
        try:
            result: T = await self._offload(work)
        except budgets.LimitExceeded as error:
            raise over_budget(error) from None
        except budgets.WorkCancelled as error:
            raise DanubeError(ErrorCode.UNAVAILABLE, str(error)) from None
        return result

    # -- store access ---------------------------------------------------------------------

    async def _drive(self, flow: flows.Flow[T]) -> T:
        """Runs a registry flow over the store, its CPU-bound steps in worker threads; a
        failed store call or work over a limit is thrown into the flow (the gate's binding
        flow serves the binding it had; the others let it pass)."""
        answer: Any = None
        failed: DanubeError | None = None
        try:
            while True:
                step = flow.send(answer) if failed is None else flow.throw(failed)
                answer, failed = None, None
                try:
                    if isinstance(step, flows.Read):
                        answer = await store_call_from_grpc(self._store.get, step.key)
                    elif isinstance(step, flows.Write):
                        result = await store_call_from_grpc(
                            self._store.txn, step.compares, step.ops
                        )
                        answer = result.succeeded
                    else:
                        answer = await self._work(step.run)
                except records.DamagedRecord:
                    raise
                except DanubeError as error:  # thrown in: a flow may keep what it had
                    failed = error
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except records.DamagedRecord as error:
            log.warning("event=schema_record_damaged error=%s", error.message)
            raise

    async def _subject(self, name: str) -> Subject | None:
        found, _ = await self._drive(flows.subject(name))
        return found

    async def _existing(self, name: str) -> Subject:
        found, _ = await self._drive(flows.existing(name))
        return found

    # -- parsing ----------------------------------------------------------------------------

    async def _parse(self, type_text: str, definition: bytes) -> ParsedSchema:
        if len(definition) > MAX_DEFINITION_BYTES:
            raise invalid(
                f"a schema definition may be {MAX_DEFINITION_BYTES} bytes, this one is "
                f"{len(definition)}"
            )

        try:
            kind = schema_type(type_text)
        except SchemaParseError as error:
            raise invalid(f"invalid {type_text} schema: {error}") from None

        def work() -> ParsedSchema:
            compiled = compile_proto(definition) if kind is SchemaType.PROTOBUF else b""
            return parse(kind, definition, compiled=compiled)

        self._on_parse(kind.value)  # on the loop: counted once, before the work starts
        try:
            parsed: ParsedSchema = await self._work(work)
        except SchemaParseError as error:
            raise invalid(f"invalid {type_text} schema: {error}") from None
        return parsed

    def _read(self, version: SchemaVersion) -> ParsedSchema:
        """A stored version parsed again, from a bounded cache."""
        key = (version.schema_type, version.fingerprint, version.message)
        with self._parsed_lock:
            parsed = self._parsed.get(key)
            if parsed is not None:
                self._parsed.move_to_end(key)
                return parsed
        parsed = records.decoded(
            f"version {version.version}", partial(registry.parse_version, version)
        )
        with self._parsed_lock:
            self._parsed[key] = parsed
            if len(self._parsed) > PARSED_CACHE:
                self._parsed.popitem(last=False)
        return parsed

    # -- RPCs -------------------------------------------------------------------------------

    async def register_schema(self, request: pb.RegisterSchemaRequest) -> pb.RegisterSchemaResponse:
        registry.check_subject_name(request.subject)
        parsed = await self._parse(request.schema_type, request.schema_definition)
        outcome = await self._drive(
            flows.register(
                request.subject, parsed, self._read, now_ms=now_ms(),
                created_by=request.created_by, description=request.description,
                tags=request.tags,
            )
        )  # fmt: skip
        return pb.RegisterSchemaResponse(
            schema_id=outcome.subject.schema_id,
            version=outcome.version.version,
            is_new_version=outcome.is_new,
            fingerprint=outcome.version.fingerprint,
        )

    async def get_schema(self, request: pb.GetSchemaRequest) -> pb.GetSchemaResponse:
        index = await store_call_from_grpc(self._store.get, records.id_key(request.schema_id))
        if index is None:
            raise not_found(f"no schema has id {request.schema_id}")
        name = _decoded(index.key, lambda: str(index.value["subject"]))
        subject = await self._existing(name)
        version = subject.latest if request.version is None else subject.version(request.version)
        return _schema_response(subject, version)

    async def get_latest_schema(self, request: pb.GetLatestSchemaRequest) -> pb.GetSchemaResponse:
        subject = await self._existing(request.subject)
        return _schema_response(subject, subject.latest)

    async def list_versions(self, request: pb.ListVersionsRequest) -> pb.ListVersionsResponse:
        subject = await self._existing(request.subject)
        return pb.ListVersionsResponse(
            versions=[
                pb.SchemaVersionInfo(
                    version=v.version,
                    created_at=v.created_ms // 1000,
                    created_by=v.created_by,
                    description=v.description,
                    fingerprint=v.fingerprint,
                    schema_id=subject.schema_id,
                )
                for v in subject.versions
            ]
        )

    async def check_compatibility(
        self, request: pb.CheckCompatibilityRequest
    ) -> pb.CheckCompatibilityResponse:
        subject = await self._existing(request.subject)
        mode = (
            subject.mode
            if not request.compatibility_mode
            else registry.parse_mode(request.compatibility_mode)
        )
        parsed = await self._parse(request.schema_type, request.new_schema_definition)
        candidate = await self._work(partial(registry.as_the_subject_reads, subject, parsed))
        problems: list[str] = await self._work(
            lambda: registry.check(subject, candidate, self._read, mode)
        )
        return pb.CheckCompatibilityResponse(is_compatible=not problems, errors=problems)

    async def delete_schema_version(
        self, request: pb.DeleteSchemaVersionRequest
    ) -> pb.DeleteSchemaVersionResponse:
        left = await self._drive(
            flows.update(request.subject, partial(registry.delete_version, number=request.version))
        )
        self._by_id.pop((left.schema_id, request.version), None)
        return pb.DeleteSchemaVersionResponse(
            success=True, message=f"deleted version {request.version} of {quoted(request.subject)}"
        )

    async def set_compatibility_mode(
        self, request: pb.SetCompatibilityModeRequest
    ) -> pb.SetCompatibilityModeResponse:
        mode = registry.parse_mode(request.compatibility_mode)
        await self._drive(flows.update(request.subject, partial(registry.set_mode, mode=mode)))
        return pb.SetCompatibilityModeResponse(
            success=True, message=f"compatibility mode of {quoted(request.subject)} is {mode.value}"
        )

    async def list_subjects(self, _: pb.ListSubjectsRequest) -> pb.ListSubjectsResponse:
        """A damaged subject is left out (and logged) rather than failing the whole list."""
        summaries: list[pb.SubjectSummary] = []
        for kv in await store_call_from_grpc(self._store.scan, records.SUBJECTS):
            try:
                subject = records.subject_from_json(kv.value)
            except records.RecordError as error:
                log.warning("event=schema_record_damaged key=%s error=%s", kv.key, error)
                continue
            latest = subject.versions[-1] if subject.versions else None
            summaries.append(
                pb.SubjectSummary(
                    subject=subject.name,
                    schema_type=latest.schema_type.value if latest else "",
                    latest_version=latest.version if latest else 0,
                    compatibility_mode=subject.mode.value,
                    schema_id=subject.schema_id,
                    tags=list(latest.tags) if latest else [],
                )
            )
        return pb.ListSubjectsResponse(subjects=summaries)

    # -- topic bindings -------------------------------------------------------------------

    async def _topics(self, topic: str) -> list[TopicName]:
        """The topic, or every partition of a partitioned one (as TopicPartitions answers);
        NOT_FOUND when neither exists."""
        names = await self._placement.partitions(topic)
        if not names:
            raise not_found(f"topic {topic} does not exist")
        return [parse_topic(name) for name in names]

    async def subject_exists(self, name: str) -> bool:
        return await self._subject(name) is not None

    async def bind_topic(self, topic: str, config: TopicSchemaConfig) -> None:
        """An operator's binding (ConfigureTopicSchema): replaces whatever was there."""
        for name in await self._topics(topic):
            await store_call_from_grpc(
                self._store.put, paths.topic_schema_config(name), config.to_json()
            )
            self._configs.forget(name.full)

    async def bind_if_unbound(self, topic: str, config: TopicSchemaConfig) -> TopicSchemaConfig:
        """A producer's default binding, written only where none exists (an operator's, made
        meanwhile through another broker, is never replaced); the binding in force after."""
        key = paths.topic_schema_config(parse_topic(topic))
        result = await store_call_from_grpc(
            self._store.txn,
            [Compare(key, "version", "==", 0)],
            [Put(key, config.to_json())],
            [Get(key)],
        )
        self._configs.forget(topic)
        if result.succeeded:
            return config
        found = result.responses[0]
        assert found is not None  # the compare failed in the revision this read
        return _decoded(found.key, partial(TopicSchemaConfig.from_json, found.value))

    async def _change_binding(
        self, topic: str, change: Callable[[TopicSchemaConfig | None], TopicSchemaConfig]
    ) -> None:
        """Each partition's binding changed under a compare on the revision read, so a
        change made meanwhile through another broker is read again, not written over."""
        for name in await self._topics(topic):
            key = paths.topic_schema_config(name)
            for _ in range(records.RACE_ATTEMPTS):
                found = await store_call_from_grpc(self._store.get, key)
                current = (
                    None
                    if found is None
                    else _decoded(key, partial(TopicSchemaConfig.from_json, found.value))
                )
                seen = Compare(
                    key, "mod_revision", "==", 0 if found is None else found.mod_revision
                )
                put = Put(key, change(current).to_json())
                result = await store_call_from_grpc(self._store.txn, [seen], [put])
                if result.succeeded:
                    break
            else:
                raise DanubeError(ErrorCode.UNAVAILABLE, f"{topic}'s binding kept changing; retry")
            self._configs.forget(name.full)

    async def topic_schema(self, topic: str) -> tuple[TopicSchemaConfig, Subject | None] | None:
        """The binding in force, read afresh, with its subject (None when the subject is
        gone): what DescribeTopic shows (Danube shows the subject given at creation only)."""
        self._configs.forget(topic)
        config = await self.topic_config(topic)
        if config is None:
            return None
        return config, await self._subject(config.subject)

    async def topic_config(self, topic: str) -> TopicSchemaConfig | None:
        """The topic's binding (`danube.machines.requests.schema_gate.binding`: trusted for
        CONFIG_TTL_S, the last one read kept while the store does not answer)."""
        return await self._drive(gate.binding(self._configs, topic))  # type: ignore[no-any-return]

    async def schema_of(
        self, schema_id: int, version: int | None
    ) -> tuple[str, ParsedSchema] | None:
        """The subject and parsed schema a message's (schema id, version) names (the latest
        version without one), None when the registry has no such schema. Kept for
        NAMED_TTL_S; a deletion through this broker forgets it at once."""
        return await self._drive(gate.schema_of(self._by_id, self._read, schema_id, version))  # type: ignore[no-any-return]

    async def admit(
        self, topic: str, messages: Sequence[Any], report: gate.Report
    ) -> gate.Admission:
        """The gate's decision for `messages` of `topic`
        (`danube.machines.requests.schema_gate`)."""
        return await self._drive(  # type: ignore[no-any-return]
            gate.admit(self._configs, self._by_id, self._read, topic, messages, report)
        )

    async def configure_topic_schema(
        self, request: pb.ConfigureTopicSchemaRequest
    ) -> pb.ConfigureTopicSchemaResponse:
        policy = parse_policy(request.validation_policy)
        await self._existing(request.schema_subject)
        config = TopicSchemaConfig(
            request.schema_subject, policy, request.enable_payload_validation
        )
        await self.bind_topic(request.topic_name, config)
        return pb.ConfigureTopicSchemaResponse(
            success=True,
            message=f"{request.topic_name} is bound to {quoted(request.schema_subject)} "
            f"(policy {policy.value})",
        )

    async def update_topic_validation_policy(
        self, request: pb.UpdateTopicValidationPolicyRequest
    ) -> pb.UpdateTopicValidationPolicyResponse:
        policy = parse_policy(request.validation_policy)
        await self._change_binding(
            request.topic_name,
            partial(
                updated_binding,
                topic=request.topic_name,
                policy=policy,
                payload_validation=request.enable_payload_validation,
            ),
        )
        return pb.UpdateTopicValidationPolicyResponse(
            success=True, message=f"policy of {request.topic_name} is {policy.value}"
        )

    async def get_topic_schema_config(
        self, request: pb.GetTopicSchemaConfigRequest
    ) -> pb.GetTopicSchemaConfigResponse:
        first = (await self._topics(request.topic_name))[0]
        self._configs.forget(first.full)
        config = await self.topic_config(first.full)
        if config is None:
            return pb.GetTopicSchemaConfigResponse(validation_policy=ValidationPolicy.NONE.value)
        subject = await self._subject(config.subject)
        return pb.GetTopicSchemaConfigResponse(
            schema_subject=config.subject,
            validation_policy=config.policy.value,
            enable_payload_validation=config.payload_validation,
            schema_id=subject.schema_id if subject else 0,
        )

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        routes: Sequence[tuple[str, Callable[[Any], Awaitable[Any]], type, type]] = [
            ("RegisterSchema", self.register_schema, pb.RegisterSchemaRequest,
             pb.RegisterSchemaResponse),
            ("GetSchema", self.get_schema, pb.GetSchemaRequest, pb.GetSchemaResponse),
            ("GetLatestSchema", self.get_latest_schema, pb.GetLatestSchemaRequest,
             pb.GetSchemaResponse),
            ("ListVersions", self.list_versions, pb.ListVersionsRequest,
             pb.ListVersionsResponse),
            ("CheckCompatibility", self.check_compatibility, pb.CheckCompatibilityRequest,
             pb.CheckCompatibilityResponse),
            ("DeleteSchemaVersion", self.delete_schema_version, pb.DeleteSchemaVersionRequest,
             pb.DeleteSchemaVersionResponse),
            ("SetCompatibilityMode", self.set_compatibility_mode,
             pb.SetCompatibilityModeRequest, pb.SetCompatibilityModeResponse),
            ("ListSubjects", self.list_subjects, pb.ListSubjectsRequest,
             pb.ListSubjectsResponse),
            ("ConfigureTopicSchema", self.configure_topic_schema,
             pb.ConfigureTopicSchemaRequest, pb.ConfigureTopicSchemaResponse),
            ("UpdateTopicValidationPolicy", self.update_topic_validation_policy,
             pb.UpdateTopicValidationPolicyRequest, pb.UpdateTopicValidationPolicyResponse),
            ("GetTopicSchemaConfig", self.get_topic_schema_config,
             pb.GetTopicSchemaConfigRequest, pb.GetTopicSchemaConfigResponse),
        ]  # fmt: skip
        return {
            f"/danube_schema.SchemaRegistry/{name}": unary(call, request, response)
            for name, call, request, response in routes
        }


def _decoded(where: str, decode: Callable[[], T]) -> T:
    """`records.decoded`, with the one log line a damaged record gets."""
    try:
        return records.decoded(where, decode)
    except records.DamagedRecord as error:
        log.warning("event=schema_record_damaged error=%s", error.message)
        raise


def _schema_response(subject: Subject, version: SchemaVersion) -> pb.GetSchemaResponse:
    return pb.GetSchemaResponse(
        schema_id=subject.schema_id,
        version=version.version,
        subject=subject.name,
        schema_type=version.schema_type.value,
        schema_definition=version.definition,
        description=version.description,
        created_at=version.created_ms // 1000,
        created_by=version.created_by,
        tags=list(version.tags),
        fingerprint=version.fingerprint,
        compatibility_mode=subject.mode.value,
    )
