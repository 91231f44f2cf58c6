"""`danube_schema.SchemaRegistry` on the broker and admin ports: subjects in the metadata
store, decisions in `danube.schema.registry`.

Every change is one transaction that compares the revisions it read (the subject's key and,
for a new subject, the id counter), so brokers of a cluster sharing one etcd cannot
register two versions under one number or give two subjects one id; a lost race is read
again and decided again (spec/schema-registry.md)."""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import grpclib.const
import trio
import trio_asyncio

from danube.broker.grpc_util import unary
from danube.broker.watching import failure_text
from danube.core.errors import DanubeError, ErrorCode, invalid, not_found
from danube.metadata import MetadataStore
from danube.metadata.model import Compare, KeyValue, MetadataError, Op, Put
from danube.proto import danube_schema as pb
from danube.protoc import compile_proto
from danube.schema import records, registry
from danube.schema.errors import SchemaParseError
from danube.schema.formats import ParsedSchema, SchemaType, parse, schema_type
from danube.schema.registry import Registration, SchemaVersion, Subject

T = TypeVar("T")
STORE_TIMEOUT_S = 5.0
RACE_ATTEMPTS = 8
"""Changes lost to another broker's change before the client is told to retry."""
MAX_DEFINITION_BYTES = 256 * 1024
MAX_SUBJECT_BYTES = 1024 * 1024
"""A subject is one metadata key, rewritten whole on every change: etcd refuses requests
above 1.5 MiB by default, so a subject stops growing well before that."""
PARSED_CACHE = 256
"""Stored versions kept parsed (every check reads the latest, transitive ones all)."""

Offload = Callable[[Callable[[], T]], Awaitable[T]]
"""Runs CPU-bound work (protoc, parsing, comparing) away from the event loop, with a bound
on how much runs at once (`danube.broker.server` passes trio threads with a limiter)."""

log = logging.getLogger("danube.broker")


class SchemaService:
    def __init__(
        self,
        store: MetadataStore,
        offload: Offload[Any],
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._store = store
        self._offload = offload
        self._clock_ms = clock_ms
        self._parsed: OrderedDict[tuple[SchemaType, str, str], ParsedSchema] = OrderedDict()

    # -- store access ---------------------------------------------------------------------

    async def _call(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        """A store request from a gRPC handler (asyncio), run in trio with a deadline."""

        async def bounded() -> T:
            with trio.fail_after(STORE_TIMEOUT_S):
                return await call(*args)

        try:
            return await trio_asyncio.trio_as_aio(bounded)()
        except (MetadataError, trio.TooSlowError) as error:
            raise DanubeError(
                ErrorCode.UNAVAILABLE, f"the metadata store did not answer ({failure_text(error)})"
            ) from None

    async def _subject(self, name: str) -> tuple[Subject | None, KeyValue | None]:
        registry.check_subject_name(name)
        found = await self._call(self._store.get, records.subject_key(name))
        if found is None:
            return None, None
        return _decoded(found.key, lambda: records.subject_from_json(found.value)), found

    async def _existing(self, name: str) -> tuple[Subject, KeyValue]:
        subject, seen = await self._subject(name)
        if subject is None or seen is None:
            raise not_found(f"schema subject {name!r} is not registered")
        return subject, seen

    async def _update(self, name: str, change: Callable[[Subject], Subject]) -> Subject:
        """Applies `change` under a compare on the revision read, again after a lost race."""
        for _ in range(RACE_ATTEMPTS):
            subject, seen = await self._existing(name)
            changed = change(subject)
            if await self._commit(changed, seen, None):
                return changed
        raise DanubeError(ErrorCode.UNAVAILABLE, f"subject {name!r} kept changing; retry")

    async def _commit(
        self, subject: Subject, seen: KeyValue | None, counter: KeyValue | None
    ) -> bool:
        key = records.subject_key(subject.name)
        value = records.subject_to_json(subject)
        size = len(json.dumps(value))
        if size > MAX_SUBJECT_BYTES:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"subject {subject.name!r} would hold {size} bytes of versions, above the "
                f"{MAX_SUBJECT_BYTES} a subject may: delete old versions first",
            )
        ops: list[Op] = [Put(key, value)]
        if seen is not None:
            compares = [Compare(key, "mod_revision", "==", seen.mod_revision)]
        else:
            compares = [Compare(key, "version", "==", 0)]
            if counter is None:
                compares.append(Compare(records.NEXT_ID, "version", "==", 0))
            else:
                compares.append(
                    Compare(records.NEXT_ID, "mod_revision", "==", counter.mod_revision)
                )
            ops.append(Put(records.NEXT_ID, subject.schema_id + 1))
            ops.append(Put(records.id_key(subject.schema_id), {"subject": subject.name}))
        result = await self._call(self._store.txn, compares, ops)
        return result.succeeded

    # -- parsing ----------------------------------------------------------------------------

    async def _parse(self, type_text: str, definition: bytes) -> ParsedSchema:
        if len(definition) > MAX_DEFINITION_BYTES:
            raise invalid(
                f"a schema definition may be {MAX_DEFINITION_BYTES} bytes, this one is "
                f"{len(definition)}"
            )

        def work() -> ParsedSchema:
            kind = schema_type(type_text)
            compiled = compile_proto(definition) if kind is SchemaType.PROTOBUF else b""
            return parse(kind, definition, compiled=compiled)

        try:
            parsed: ParsedSchema = await self._offload(work)
        except SchemaParseError as error:
            raise invalid(f"invalid {type_text} schema: {error}") from None
        return parsed

    async def _in_subject(self, candidate: ParsedSchema, subject: Subject | None) -> ParsedSchema:
        """A Protobuf candidate is read as the message type the subject's latest version
        carries, if it defines it: adding a message above the main one must not change
        what the subject's payloads are."""
        if (
            subject is None
            or not subject.versions
            or candidate.schema_type is not SchemaType.PROTOBUF
            or subject.latest.schema_type is not SchemaType.PROTOBUF
            or subject.latest.message == candidate.message
        ):
            return candidate
        message = subject.latest.message

        def work() -> ParsedSchema:
            return parse(
                SchemaType.PROTOBUF, candidate.definition, compiled=candidate.compiled,
                message=message,
            )  # fmt: skip

        try:
            reread: ParsedSchema = await self._offload(work)
        except SchemaParseError:
            return candidate  # the message is gone: the check reports the root's new name
        return reread

    def _read(self, version: SchemaVersion) -> ParsedSchema:
        """A stored version parsed again, from a bounded cache."""
        key = (version.schema_type, version.fingerprint, version.message)
        parsed = self._parsed.get(key)
        if parsed is not None:
            self._parsed.move_to_end(key)
            return parsed
        parsed = _decoded(
            f"version {version.version}",
            lambda: parse(
                version.schema_type, version.definition, compiled=version.compiled,
                message=version.message,
            ),
        )  # fmt: skip
        self._parsed[key] = parsed
        if len(self._parsed) > PARSED_CACHE:
            self._parsed.popitem(last=False)
        return parsed

    # -- RPCs -------------------------------------------------------------------------------

    async def register_schema(self, request: pb.RegisterSchemaRequest) -> pb.RegisterSchemaResponse:
        registry.check_subject_name(request.subject)
        parsed = await self._parse(request.schema_type, request.schema_definition)
        for _ in range(RACE_ATTEMPTS):
            subject, seen = await self._subject(request.subject)
            candidate = await self._in_subject(parsed, subject)
            counter = None
            if subject is None:
                counter = await self._call(self._store.get, records.NEXT_ID)
            new_id = 1 if counter is None else _decoded(counter.key, partial(int, counter.value))
            decide = partial(
                registry.register,
                subject,
                request.subject,
                candidate,
                self._read,
                new_id=new_id,
                now_ms=self._clock_ms(),
                created_by=request.created_by,
                description=request.description,
                tags=request.tags,
            )
            outcome: Registration = await self._offload(decide)
            if outcome.is_new and not await self._commit(outcome.subject, seen, counter):
                continue
            return pb.RegisterSchemaResponse(
                schema_id=outcome.subject.schema_id,
                version=outcome.version.version,
                is_new_version=outcome.is_new,
                fingerprint=outcome.version.fingerprint,
            )
        raise DanubeError(
            ErrorCode.UNAVAILABLE,
            f"subject {request.subject!r} kept changing under concurrent registrations; retry",
        )

    async def get_schema(self, request: pb.GetSchemaRequest) -> pb.GetSchemaResponse:
        index = await self._call(self._store.get, records.id_key(request.schema_id))
        if index is None:
            raise not_found(f"no schema has id {request.schema_id}")
        name = _decoded(index.key, lambda: str(index.value["subject"]))
        subject, _ = await self._existing(name)
        version = subject.latest if request.version is None else subject.version(request.version)
        return _schema_response(subject, version)

    async def get_latest_schema(self, request: pb.GetLatestSchemaRequest) -> pb.GetSchemaResponse:
        subject, _ = await self._existing(request.subject)
        return _schema_response(subject, subject.latest)

    async def list_versions(self, request: pb.ListVersionsRequest) -> pb.ListVersionsResponse:
        subject, _ = await self._existing(request.subject)
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
        subject, _ = await self._existing(request.subject)
        mode = (
            subject.mode
            if not request.compatibility_mode
            else registry.parse_mode(request.compatibility_mode)
        )
        parsed = await self._parse(request.schema_type, request.new_schema_definition)
        candidate = await self._in_subject(parsed, subject)
        problems: list[str] = await self._offload(
            lambda: registry.check(subject, candidate, self._read, mode)
        )
        return pb.CheckCompatibilityResponse(is_compatible=not problems, errors=problems)

    async def delete_schema_version(
        self, request: pb.DeleteSchemaVersionRequest
    ) -> pb.DeleteSchemaVersionResponse:
        await self._update(
            request.subject, lambda subject: registry.delete_version(subject, request.version)
        )
        return pb.DeleteSchemaVersionResponse(
            success=True, message=f"deleted version {request.version} of {request.subject!r}"
        )

    async def set_compatibility_mode(
        self, request: pb.SetCompatibilityModeRequest
    ) -> pb.SetCompatibilityModeResponse:
        mode = registry.parse_mode(request.compatibility_mode)
        await self._update(request.subject, lambda subject: registry.set_mode(subject, mode))
        return pb.SetCompatibilityModeResponse(
            success=True, message=f"compatibility mode of {request.subject!r} is {mode.value}"
        )

    async def list_subjects(self, _: pb.ListSubjectsRequest) -> pb.ListSubjectsResponse:
        """A damaged subject is left out (and logged) rather than failing the whole list."""
        summaries: list[pb.SubjectSummary] = []
        for kv in await self._call(self._store.scan, records.SUBJECTS):
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
        ]  # fmt: skip
        return {
            f"/danube_schema.SchemaRegistry/{name}": unary(call, request, response)
            for name, call, request, response in routes
        }


def _decoded(where: str, decode: Callable[[], T]) -> T:
    """A stored value this broker cannot read is named (INTERNAL, one log line), never a
    traceback: a damaged key, or a version the parsers no longer accept."""
    try:
        return decode()
    except (records.RecordError, SchemaParseError, KeyError, TypeError, ValueError) as error:
        log.warning("event=schema_record_damaged where=%s error=%s", where, error)
        raise DanubeError(
            ErrorCode.INTERNAL, f"the registry's stored {where} cannot be read: {error}"
        ) from None


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
