"""The schema registry from the client side: every `danube_schema.SchemaRegistry` RPC, on
whichever service broker answers (any broker serves the registry, spec/schema-registry.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from grpclib import GRPCError

from danube.client.connection import BrokerChannel, Connections
from danube.client.errors import DanubeClientError
from danube.proto import danube_schema as pb

T = TypeVar("T")


class SchemaRegistry:
    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def _call(self, what: str, call: Callable[[pb.SchemaRegistryStub], Awaitable[T]]) -> T:
        def on(channel: BrokerChannel) -> Awaitable[T]:
            return call(pb.SchemaRegistryStub(channel))

        try:
            return await self._connections.on_any_broker(what, on)
        except GRPCError as error:
            raise DanubeClientError.from_grpc(what, error) from None

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
        request = pb.SetCompatibilityModeRequest(subject, mode)
        return await self._call(f"mode of {subject}", lambda s: s.set_compatibility_mode(request))

    async def delete_version(self, subject: str, version: int) -> pb.DeleteSchemaVersionResponse:
        request = pb.DeleteSchemaVersionRequest(subject, version)
        return await self._call(
            f"delete {subject} v{version}", lambda s: s.delete_schema_version(request)
        )

    async def subjects(self) -> list[pb.SubjectSummary]:
        answer = await self._call("subjects", lambda s: s.list_subjects(pb.ListSubjectsRequest()))
        return list(answer.subjects)
