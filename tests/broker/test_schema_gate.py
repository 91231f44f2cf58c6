"""The publish gate's payload checks (issue 20, item 3): a lone cheap payload is checked on
the event loop under a small budget, anything more in a worker, a batch in one trip; a
payload over a limit is RESOURCE_EXHAUSTED under enforce and a counted warning under warn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from danube.machines.requests import schema_gate
from danube.machines.requests.binding_cache import BindingCache
from danube.machines.schema import budget as budgets
from danube.machines.schema.formats import ParsedSchema, SchemaType, parse
from danube.machines.schema.policy import Problem, TopicSchemaConfig, ValidationPolicy
from danube.machines.wal import records
from danube.runtime.schema_gate import SchemaGate
from danube.runtime.schema_service import SchemaService
from danube.values.errors import DanubeError, ErrorCode

T = TypeVar("T")
TOPIC = "/default/orders"
ORDER = parse(
    SchemaType.JSON_SCHEMA,
    json.dumps(
        {"type": "object", "properties": {"qty": {"type": "integer"}}, "required": ["qty"]}
    ).encode(),
)
NUMBERS = parse(SchemaType.JSON_SCHEMA, b'{"type": "array", "items": {"type": "integer"}}')


def doubling(depth: int) -> ParsedSchema:
    definitions: dict[str, Any] = {"a0": {"type": "string"}}
    for n in range(1, depth + 1):
        ref = {"$ref": f"#/definitions/a{n - 1}"}
        definitions[f"a{n}"] = {"anyOf": [ref, dict(ref)]}
    document = {"definitions": definitions, "$ref": f"#/definitions/a{depth}"}
    return parse(SchemaType.JSON_SCHEMA, json.dumps(document).encode())


class Registry(SchemaService):
    """The service with the store left out: the gate's caches hold one binding and one
    schema on a clock that never moves (`danube.machines.requests.schema_gate` decides), and worker
    trips are counted."""

    def __init__(self, policy: ValidationPolicy, schema: ParsedSchema) -> None:
        super().__init__(store=None, offload=self._trip, placement=None)  # type: ignore[arg-type]
        self.config = TopicSchemaConfig("orders", policy, True)
        self._configs = BindingCache(lambda: 0.0)
        self._configs.read(TOPIC, self.config)
        self._by_id = schema_gate.NamedCache(lambda: 0.0)
        self._by_id.read((1, 1), ("orders", schema))
        self.trips = 0

    async def _trip(self, work: Callable[[], T]) -> T:
        self.trips += 1
        return budgets.run_with(budgets.Runtime(), work)  # type: ignore[return-value]


def message(payload: bytes) -> records.Record:
    return records.Record(payload=payload, schema_id=1, schema_version=1)


def admit(registry: Registry, payloads: list[bytes]) -> DanubeError | None:
    gate = SchemaGate(registry)
    try:
        if len(payloads) == 1:
            asyncio.run(gate.admit(TOPIC, message(payloads[0])))
        else:
            asyncio.run(gate.admit_batch(TOPIC, [message(p) for p in payloads]))
    except DanubeError as error:
        return error
    return None


def test_a_lone_cheap_payload_is_checked_on_the_loop() -> None:
    registry = Registry(ValidationPolicy.ENFORCE, ORDER)
    assert admit(registry, [b'{"qty": 3}']) is None
    refused = admit(registry, [b'{"qty": "three"}'])
    assert refused is not None and refused.code is ErrorCode.INVALID_ARGUMENT
    assert "$.qty" in refused.message
    assert registry.trips == 0


def test_a_lone_payload_needing_more_than_the_inline_budget_goes_to_a_worker() -> None:
    registry = Registry(ValidationPolicy.ENFORCE, NUMBERS)
    assert admit(registry, [json.dumps(list(range(200))).encode()]) is None
    assert registry.trips == 1


def test_a_batch_is_checked_in_one_trip_and_refused_whole_for_one_bad_payload() -> None:
    registry = Registry(ValidationPolicy.ENFORCE, ORDER)
    good = [json.dumps({"qty": n}).encode() for n in range(50)]
    assert admit(registry, good) is None
    refused = admit(registry, [*good, b'{"qty": 1.5}'])
    assert refused is not None and refused.code is ErrorCode.INVALID_ARGUMENT
    assert registry.trips == 2


def test_a_payload_over_a_limit_is_resource_exhausted_under_enforce() -> None:
    registry = Registry(ValidationPolicy.ENFORCE, doubling(18))
    refused = admit(registry, [b"1"])
    assert refused is not None and refused.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "(limit: validation steps)" in refused.message


def test_a_payload_over_a_limit_is_a_counted_warning_under_warn() -> None:
    registry = Registry(ValidationPolicy.WARN, doubling(18))
    gate = SchemaGate(registry)
    asyncio.run(gate.admit(TOPIC, message(b"1")))
    assert gate.warnings[(TOPIC, Problem.PAYLOAD_INVALID)] == 1


def test_a_batch_shares_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_gate, "BATCH_VALIDATION_STEPS", 20_000)
    registry = Registry(ValidationPolicy.ENFORCE, NUMBERS)
    payload = json.dumps(list(range(1000))).encode()  # about 8,000 steps each
    assert admit(registry, [payload, payload]) is None
    refused = admit(registry, [payload] * 3)
    assert refused is not None and refused.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "batch validation steps" in refused.message
