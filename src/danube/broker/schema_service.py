"""`danube_schema.SchemaRegistry` on the broker and admin ports: subjects in the metadata
store, decisions in `danube.schema.registry`.

Every change is one transaction that compares the revisions it read (the subject's key and,
for a new subject, the id counter), so brokers of a cluster sharing one etcd cannot
register two versions under one number or give two subjects one id; a lost race is read
again and decided again (spec/schema-registry.md)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
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
from danube.schema import records, registry
from danube.schema.errors import SchemaParseError
from danube.schema.formats import ParsedSchema, SchemaType, parse, schema_type
from danube.schema.registry import SchemaVersion, Subject

T = TypeVar("T")
STORE_TIMEOUT_S = 5.0
RACE_ATTEMPTS = 8
"""Registrations lost to another broker's change before the client is told to retry."""

Compiler = Callable[[bytes], Awaitable[bytes]]
"""Turns a `.proto` text into a FileDescriptorSet (`danube.broker.protoc`)."""


class SchemaService:
    def __init__(
        self,
        store: MetadataStore,
        compile_proto: Compiler,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._store = store
        self._compile = compile_proto
        self._clock_ms = clock_ms
        self._parsed: dict[tuple[SchemaType, str], ParsedSchema] = {}

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
        return records.subject_from_json(found.value), found

    async def _existing(self, name: str) -> Subject:
        subject, _ = await self._subject(name)
        if subject is None:
            raise not_found(f"schema subject {name!r} is not registered")
        return subject

    async def _replace(self, subject: Subject, seen: KeyValue) -> bool:
        result = await self._call(
            self._store.txn,
            [Compare(seen.key, "mod_revision", "==", seen.mod_revision)],
            [Put(seen.key, records.subject_to_json(subject))],
        )
        return result.succeeded

    # -- parsing ----------------------------------------------------------------------------

    async def _parse(self, type_text: str, definition: bytes) -> ParsedSchema:
        try:
            kind = schema_type(type_text)
            compiled = await self._compile(definition) if kind is SchemaType.PROTOBUF else b""
            parsed = parse(kind, definition, compiled=compiled)
        except SchemaParseError as error:
            raise invalid(f"invalid {type_text} schema: {error}") from None
        self._parsed[(parsed.schema_type, parsed.fingerprint)] = parsed
        return parsed

    def _read(self, version: SchemaVersion) -> ParsedSchema:
        """A stored version parsed again (cached: every check reads the latest one)."""
        key = (version.schema_type, version.fingerprint)
        parsed = self._parsed.get(key)
        if parsed is None:
            parsed = parse(
                version.schema_type,
                version.definition,
                compiled=version.compiled,
                message=version.message,
            )
            self._parsed[key] = parsed
        return parsed

    # -- RPCs -------------------------------------------------------------------------------

    async def register_schema(self, request: pb.RegisterSchemaRequest) -> pb.RegisterSchemaResponse:
        candidate = await self._parse(request.schema_type, request.schema_definition)
        for _ in range(RACE_ATTEMPTS):
            subject, seen = await self._subject(request.subject)
            counter = None if subject is not None else await self._call(
                self._store.get, records.NEXT_ID
            )  # fmt: skip
            new_id = 1 if counter is None else int(counter.value)  # type: ignore[arg-type]
            outcome = registry.register(
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

    async def _commit(
        self, subject: Subject, seen: KeyValue | None, counter: KeyValue | None
    ) -> bool:
        key = records.subject_key(subject.name)
        compares: list[Compare] = []
        ops: list[Op] = [Put(key, records.subject_to_json(subject))]
        if seen is not None:
            compares.append(Compare(key, "mod_revision", "==", seen.mod_revision))
        else:
            compares.append(Compare(key, "version", "==", 0))
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

    async def get_schema(self, request: pb.GetSchemaRequest) -> pb.GetSchemaResponse:
        index = await self._call(self._store.get, records.id_key(request.schema_id))
        if index is None:
            raise not_found(f"no schema has id {request.schema_id}")
        subject = await self._existing(str(index.value["subject"]))  # type: ignore[index]
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
        candidate = await self._parse(request.schema_type, request.new_schema_definition)
        problems = registry.check(subject, candidate, self._read, mode)
        return pb.CheckCompatibilityResponse(is_compatible=not problems, errors=problems)

    async def delete_schema_version(
        self, request: pb.DeleteSchemaVersionRequest
    ) -> pb.DeleteSchemaVersionResponse:
        for _ in range(RACE_ATTEMPTS):
            subject, seen = await self._subject(request.subject)
            if subject is None or seen is None:
                raise not_found(f"schema subject {request.subject!r} is not registered")
            if await self._replace(registry.delete_version(subject, request.version), seen):
                return pb.DeleteSchemaVersionResponse(
                    success=True,
                    message=f"deleted version {request.version} of {request.subject!r}",
                )
        raise DanubeError(
            ErrorCode.UNAVAILABLE, f"subject {request.subject!r} kept changing; retry"
        )

    async def set_compatibility_mode(
        self, request: pb.SetCompatibilityModeRequest
    ) -> pb.SetCompatibilityModeResponse:
        mode = registry.parse_mode(request.compatibility_mode)
        for _ in range(RACE_ATTEMPTS):
            subject, seen = await self._subject(request.subject)
            if subject is None or seen is None:
                raise not_found(f"schema subject {request.subject!r} is not registered")
            if await self._replace(registry.set_mode(subject, mode), seen):
                return pb.SetCompatibilityModeResponse(
                    success=True,
                    message=f"compatibility mode of {request.subject!r} is {mode.value}",
                )
        raise DanubeError(
            ErrorCode.UNAVAILABLE, f"subject {request.subject!r} kept changing; retry"
        )

    async def list_subjects(self, _: pb.ListSubjectsRequest) -> pb.ListSubjectsResponse:
        found = await self._call(self._store.scan, records.SUBJECTS)
        summaries = []
        for kv in found:
            subject = records.subject_from_json(kv.value)
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
