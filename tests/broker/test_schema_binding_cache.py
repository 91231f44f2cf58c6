"""The broker's cache of topic schema bindings when the store misbehaves (found in review):
an unanswering store must not make every publish wait for it, and a damaged binding must not
be one exception object re-raised (and its traceback grown) on every publish."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from danube.machines.schema.policy import TopicSchemaConfig, ValidationPolicy
from danube.metadata.model import KeyValue
from danube.runtime import schema_service
from danube.runtime.schema_service import CONFIG_TTL_S, SchemaService
from danube.values.errors import DanubeError, ErrorCode

TOPIC = "/default/orders"
BOUND = TopicSchemaConfig("orders", ValidationPolicy.ENFORCE, True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def service(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> tuple[SchemaService, Clock]:
    """A service whose store reads are `answers`, in order (an exception is raised)."""
    clock = Clock()
    monkeypatch.setattr(schema_service.time, "monotonic", clock.monotonic)

    async def store_call(_call: Any, key: str) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return None if answer is None else KeyValue(key, answer, 1, 1, 1, None)

    monkeypatch.setattr(schema_service, "store_call_from_grpc", store_call)
    store = SimpleNamespace(get=None)
    return SchemaService(store, offload=None, placement=None), clock  # type: ignore[arg-type]


def test_an_unanswering_store_is_asked_once_per_ttl_not_on_every_publish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = DanubeError(ErrorCode.UNAVAILABLE, "store down")
    answers: list[Any] = [BOUND.to_json(), down, down]
    gate, clock = service(monkeypatch, answers)

    async def publishes() -> list[TopicSchemaConfig | None]:
        seen = [await gate.topic_config(TOPIC)]
        clock.now += CONFIG_TTL_S * 2
        seen += [await gate.topic_config(TOPIC) for _ in range(5)]
        return seen

    assert asyncio.run(publishes()) == [BOUND] * 6
    assert answers == [down]  # one failed read for five publishes, the last not yet asked


def test_a_damaged_binding_is_refused_with_a_fresh_error_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate, _ = service(monkeypatch, [{"subject": "orders"}])

    async def twice() -> list[DanubeError]:
        errors = []
        for _ in range(2):
            with pytest.raises(DanubeError) as raised:
                await gate.topic_config(TOPIC)
            errors.append(raised.value)
        return errors

    first, second = asyncio.run(twice())
    assert first.code is second.code is ErrorCode.INTERNAL
    assert first is not second and first.message == second.message
