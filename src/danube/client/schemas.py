"""The schema registry from the client side: every `danube_schema.SchemaRegistry` RPC, on
whichever service broker answers (any broker serves the registry, spec/schema-registry.md).
Changing a subject's rules (`set_mode`, `delete_version`) needs a client made with a broker's
admin URL: the client port refuses those calls (spec/protocol.md, Ports)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from grpclib import GRPCError
from grpclib.const import Status

from danube.client.connection import BrokerChannel, Connections
from danube.client.errors import RETRYABLE, DanubeClientError
from danube.proto import danube as api_pb
from danube.proto import danube_schema as pb

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SchemaRef:
    """Which version of a subject a producer writes: the latest one (the default), exactly
    `pinned`, or the latest one provided it is at least `minimum`, as Danube's clients offer.
    The choice is made once, when the producer is created."""

    subject: str
    pinned: int | None = None
    minimum: int | None = None

    def __post_init__(self) -> None:
        if not self.subject:
            raise DanubeClientError("a schema reference needs a subject")
        if self.pinned is not None and self.minimum is not None:
            raise DanubeClientError("pin a schema version or give a minimum one, not both")
        for bound in (self.pinned, self.minimum):
            if bound is not None and bound < 1:
                raise DanubeClientError(f"schema versions start at 1, not {bound}")

    def wire(self) -> api_pb.SchemaReference:
        if self.pinned is not None:
            return api_pb.SchemaReference(self.subject, pinned_version=self.pinned)
        if self.minimum is not None:
            return api_pb.SchemaReference(self.subject, min_version=self.minimum)
        return api_pb.SchemaReference(self.subject, use_latest=True)


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """The schema a producer's messages are stamped with (`schema_id`, `schema_version`), and
    its definition, so an application can check or encode what it sends."""

    subject: str
    schema_id: int
    version: int
    schema_type: str
    definition: bytes

    @classmethod
    def of(cls, answer: pb.GetSchemaResponse) -> WriterSchema:
        return cls(
            answer.subject,
            answer.schema_id,
            answer.version,
            answer.schema_type,
            answer.schema_definition,
        )


class SchemaRegistry:
    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def _call(
        self,
        what: str,
        call: Callable[[pb.SchemaRegistryStub], Awaitable[T]],
        *,
        idempotent: bool = True,
    ) -> T:
        """A retryable answer (a store that did not answer the broker, a subject that kept
        changing under concurrent registrations) is asked again with the client's backoff,
        when asking twice cannot do anything twice: registering an identical schema returns
        the version that has it; a deletion is not repeated."""

        def on(channel: BrokerChannel) -> Awaitable[T]:
            return call(pb.SchemaRegistryStub(channel))

        retry = self._connections.retry
        for attempt in range(retry.max_retries + 1):
            try:
                return await self._connections.on_any_broker(what, on)
            except GRPCError as error:
                final = not idempotent or attempt == retry.max_retries
                if final or error.status not in RETRYABLE:
                    raise DanubeClientError.from_grpc(what, error) from None
            await asyncio.sleep(retry.delay(attempt))
        raise AssertionError("unreachable")

    async def register(
        self,
        subject: str,
        schema_type: str,
        definition: bytes,
        *,
        description: str = "",
        created_by: str = "danube-py",
        tags: Sequence[str] = (),
    ) -> pb.RegisterSchemaResponse:
        request = pb.RegisterSchemaRequest(
            subject, schema_type, definition, description, created_by, list(tags)
        )
        return await self._call(f"register {subject}", lambda s: s.register_schema(request))

    async def get(self, schema_id: int, version: int | None = None) -> pb.GetSchemaResponse:
        request = pb.GetSchemaRequest(schema_id, version)
        return await self._call(f"schema {schema_id}", lambda s: s.get_schema(request))

    async def latest(self, subject: str) -> pb.GetSchemaResponse:
        request = pb.GetLatestSchemaRequest(subject)
        return await self._call(f"latest of {subject}", lambda s: s.get_latest_schema(request))

    async def versions(self, subject: str) -> list[pb.SchemaVersionInfo]:
        request = pb.ListVersionsRequest(subject)
        answer = await self._call(f"versions of {subject}", lambda s: s.list_versions(request))
        return list(answer.versions)

    async def check(
        self, subject: str, schema_type: str, definition: bytes, mode: str | None = None
    ) -> pb.CheckCompatibilityResponse:
        request = pb.CheckCompatibilityRequest(subject, definition, schema_type, mode)
        return await self._call(f"check {subject}", lambda s: s.check_compatibility(request))

    async def set_mode(self, subject: str, mode: str) -> pb.SetCompatibilityModeResponse:
        """An operator call: brokers serve it on their admin port only (PERMISSION_DENIED on
        the client port), so the client must be made with the admin URL
        (`DanubeClient("http://127.0.0.1:50051")`); spec/protocol.md, Ports."""
        request = pb.SetCompatibilityModeRequest(subject, mode)
        return await self._call(f"mode of {subject}", lambda s: s.set_compatibility_mode(request))

    async def delete_version(self, subject: str, version: int) -> pb.DeleteSchemaVersionResponse:
        """An operator call, on the admin port only, as `set_mode`."""
        request = pb.DeleteSchemaVersionRequest(subject, version)
        return await self._call(
            f"delete {subject} v{version}",
            lambda s: s.delete_schema_version(request),
            idempotent=False,
        )

    async def resolve(self, ref: SchemaRef) -> WriterSchema:
        """The version `ref` chooses; a subject or version the registry does not have, or a
        latest version below the minimum, raises `DanubeClientError` naming it."""
        latest = WriterSchema.of(await self.latest(ref.subject))
        if ref.minimum is not None and latest.version < ref.minimum:
            raise DanubeClientError(
                f"subject {ref.subject} is at version {latest.version}, below the minimum "
                f"{ref.minimum} asked for"
            )
        if ref.pinned is None or ref.pinned == latest.version:
            return latest
        if ref.pinned > latest.version:
            raise DanubeClientError(
                f"subject {ref.subject} has no version {ref.pinned} (latest is {latest.version})"
            )
        try:
            return WriterSchema.of(await self.get(latest.schema_id, ref.pinned))
        except DanubeClientError as error:
            if error.status is Status.NOT_FOUND:
                raise DanubeClientError(
                    f"subject {ref.subject} has no version {ref.pinned} (deleted)"
                ) from None
            raise

    async def subjects(self) -> list[pb.SubjectSummary]:
        answer = await self._call("subjects", lambda s: s.list_subjects(pb.ListSubjectsRequest()))
        return list(answer.subjects)
