"""`danube-cli consume`'s rendering of messages written with a schema: which registry
answers it keeps, and what a line says when the schema cannot be had."""

from __future__ import annotations

import asyncio
from typing import Any

from grpclib.const import Status

from danube.cli.client_commands import MessageRenderer
from danube.client import DanubeClientError, Message
from danube.proto import danube as pb
from danube.proto import danube_schema as schema_pb


class FlakyRegistry:
    """Fails its first answer with `status`, then knows one string schema."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self.asked = 0

    async def get(self, schema_id: int, version: int | None) -> schema_pb.GetSchemaResponse:
        self.asked += 1
        if self.asked == 1:
            raise DanubeClientError(f"schema {schema_id}: {self.status.name}", self.status)
        return schema_pb.GetSchemaResponse(schema_id, 1, "notes", "string", b"")


def message(version: int | None) -> Message:
    raw = pb.StreamMessage(payload=b"hello", schema_id=9, schema_version=version)
    return Message(b"hello", "/default/t", 0, "p", 0, {}, None, 9, version, raw)


def render_twice(registry: Any, version: int | None) -> list[str]:
    renderer = MessageRenderer(registry)

    async def both() -> list[str]:
        return [await renderer.render(message(version)), await renderer.render(message(version))]

    return asyncio.run(both())


def test_a_registry_that_could_not_answer_is_asked_again() -> None:
    """Found in review: one UNAVAILABLE marked every later message of the schema unknown."""
    registry = FlakyRegistry(Status.UNAVAILABLE)
    first, second = render_twice(registry, 1)
    assert "schema unknown: schema id 9 v1" in first and "UNAVAILABLE" in first
    assert second.endswith("schema=notes v1 (string)] hello")
    assert registry.asked == 2


def test_a_schema_the_registry_does_not_have_is_asked_for_once() -> None:
    registry = FlakyRegistry(Status.NOT_FOUND)
    first, second = render_twice(registry, None)
    assert "schema unknown: schema id 9 latest" in first and first == second
    assert registry.asked == 1
