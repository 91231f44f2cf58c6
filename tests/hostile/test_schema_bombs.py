"""Schema bombs (issue 20 (2), (3), (11); deliver 1, 8): a JSON Schema compatibility check
that doubles with every level, a catastrophically backtracking `pattern` bound with enforce,
validation that doubles with depth, a huge array, an Avro record that can never end and a
20,000-symbol enum. Each must end in a clean status within a bounded time, while HealthCheck
on another connection stays fast and other registrations still go through.

Every scenario runs twice (issue 25, deliver 7): against a plaintext broker of its own and
against the suite's shared secured broker, over TLS as the super admin (past the guard: the
most work a caller can cause). What an unauthenticated caller can cause there is
`test_unauthenticated_work.py`.

HOSTILE_SCHEMA_S (default 30) bounds each call; HOSTILE_ANYOF_DEPTH (default 14) the depth of
the validated anyOf payload schema; HOSTILE_ARRAY_ITEMS (default 100000) the array payload.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Iterator

import pytest
from grpclib import GRPCError
from grpclib.client import Channel

from danube.proto import danube as api
from danube.proto import danube_schema as pb
from tests.hostile.harness import WatchedBroker
from tests.hostile.ledger import LEDGER, env_float, env_int
from tests.hostile.secured import access_of, plain_or_secured

pytestmark = pytest.mark.slow

CALL_S = env_float("HOSTILE_SCHEMA_S", 30.0)
ANYOF_DEPTH = env_int("HOSTILE_ANYOF_DEPTH", 14)
ARRAY_ITEMS = env_int("HOSTILE_ARRAY_ITEMS", 100_000)
CLEAN_REFUSALS = {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"}


@pytest.fixture(scope="module", params=["plain", "secured"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WatchedBroker]:
    yield from plain_or_secured(request, tmp_path_factory, "hostile-schema", "schemas")


def _anyof_doubling(depth: int, leaf: dict[str, object]) -> bytes:
    """aN = anyOf [aN-1, aN-1] over `leaf`: 2^depth paths through `depth` definitions."""
    definitions: dict[str, object] = {"a0": leaf}
    for level in range(1, depth + 1):
        ref = {"$ref": f"#/definitions/a{level - 1}"}
        definitions[f"a{level}"] = {"anyOf": [ref, ref]}
    return json.dumps({"definitions": definitions, "$ref": f"#/definitions/a{depth}"}).encode()


async def _outcome(call: Awaitable[object], timeout: float = CALL_S) -> str:
    try:
        await asyncio.wait_for(call, timeout)
        return "OK"
    except GRPCError as error:
        return error.status.name
    except TimeoutError:
        return "TIMEOUT"


def _channel(broker: WatchedBroker, address: str) -> Channel:
    """A channel to one of `broker`'s ports: over TLS with the token when it is secured."""
    return access_of(broker).channel(address)


def test_a_doubling_compatibility_check_is_refused_and_others_go_on(broker: WatchedBroker) -> None:
    """Issue 20 (2): v1/v2 with 31 anyOf-doubling levels under BACKWARD once ran for minutes
    and blocked every other RegisterSchema."""
    started = broker.mark()
    v1 = _anyof_doubling(31, {"type": "string"})
    v2 = _anyof_doubling(31, {"type": "integer"})

    async def scenario() -> tuple[str, str, float]:
        channel = _channel(broker, broker.addr)
        try:
            registry = pb.SchemaRegistryStub(channel)
            await registry.register_schema(pb.RegisterSchemaRequest("bomb", "json_schema", v1))
            admin = _channel(
                broker, broker.admin_addr
            )  # a subject's rules change on the admin port
            try:
                await pb.SchemaRegistryStub(admin).set_compatibility_mode(
                    pb.SetCompatibilityModeRequest("bomb", "BACKWARD")
                )
            finally:
                admin.close()
            bomb = asyncio.ensure_future(
                _outcome(
                    registry.register_schema(pb.RegisterSchemaRequest("bomb", "json_schema", v2))
                )
            )
            await asyncio.sleep(0.5)
            other_started = time.monotonic()
            other = await _outcome(
                registry.register_schema(
                    pb.RegisterSchemaRequest("innocent", "json_schema", b'{"type": "object"}')
                ),
                timeout=10.0,
            )
            return await bomb, other, time.monotonic() - other_started
        finally:
            channel.close()

    bomb, other, other_took = asyncio.run(scenario())
    LEDGER.record("schema", "BACKWARD check of 31 anyOf levels", bomb, b"")
    LEDGER.record("schema", "RegisterSchema during the check", other, b"")
    broker.measure(started, "anyOf-doubling BACKWARD check")
    assert bomb in CLEAN_REFUSALS, f"the doubling compatibility check ended {bomb}"
    assert other == "OK" and other_took < 5.0, f"another registration: {other} ({other_took}s)"
    broker.assert_healthy_since(started, "anyOf-doubling BACKWARD check")


def _bound_topic_scenario(
    broker: WatchedBroker, name: str, schema: bytes, payload: bytes
) -> tuple[str, float]:
    """Registers `schema` from the client port, binds it with enforce to a new topic on the
    admin port (where bindings change), and publishes `payload` from the client port; returns
    the publish's outcome and how long it took."""
    topic = f"/default/hostile-{name}"

    async def scenario() -> tuple[str, float]:
        channel = _channel(broker, broker.addr)
        try:
            registry = pb.SchemaRegistryStub(channel)
            producers = api.ProducerServiceStub(channel)
            registered = await registry.register_schema(
                pb.RegisterSchemaRequest(name, "json_schema", schema)
            )
            created = await producers.create_producer(
                api.ProducerRequest(request_id=1, producer_name="p", topic_name=topic)
            )
            admin = _channel(broker, broker.admin_addr)  # a binding changes on the admin port
            try:
                await pb.SchemaRegistryStub(admin).configure_topic_schema(
                    pb.ConfigureTopicSchemaRequest(topic, name, "enforce", True)
                )
            finally:
                admin.close()
            message = api.StreamMessage(
                request_id=2,
                msg_id=api.MsgId(producer_id=created.producer_id, topic_name=topic),
                payload=payload,
                producer_name="p",
                schema_id=registered.schema_id,
                schema_version=registered.version,
            )
            began = time.monotonic()
            outcome = await _outcome(producers.send_message(message))
            return outcome, time.monotonic() - began
        finally:
            channel.close()

    return asyncio.run(scenario())


def test_a_backtracking_pattern_does_not_stall_the_broker(broker: WatchedBroker) -> None:
    """Issue 20 (3): `^(a+)+$` against 24 a's and a '!' took 1.4 s on the event loop."""
    started = broker.mark()
    schema = json.dumps({"type": "string", "pattern": "^(a+)+$"}).encode()
    outcome, took = _bound_topic_scenario(
        broker, "redos", schema, json.dumps("a" * 24 + "!").encode()
    )
    LEDGER.record("schema", "ReDoS pattern payload", outcome, b"")
    broker.measure(started, f"ReDoS payload ({took:.1f} s)")
    assert outcome in CLEAN_REFUSALS, f"ReDoS payload: {outcome}"
    broker.assert_healthy_since(started, f"ReDoS payload ({took:.1f} s)")


def test_a_doubling_validation_does_not_stall_the_broker(broker: WatchedBroker) -> None:
    """Issue 20 (3): an anyOf-doubling schema bound with enforce; a payload failing every path
    once took 42 s at depth 18."""
    started = broker.mark()
    schema = _anyof_doubling(ANYOF_DEPTH, {"type": "string", "maxLength": 1})
    outcome, took = _bound_topic_scenario(broker, "anyof", schema, b'"too long"')
    LEDGER.record("schema", f"anyOf depth {ANYOF_DEPTH} payload", outcome, b"")
    broker.measure(started, f"anyOf depth {ANYOF_DEPTH} payload ({took:.1f} s)")
    assert outcome in CLEAN_REFUSALS, f"anyOf payload: {outcome}"
    broker.assert_healthy_since(started, f"anyOf depth {ANYOF_DEPTH} payload ({took:.1f} s)")


def test_a_huge_array_payload_does_not_stall_the_broker(broker: WatchedBroker) -> None:
    """Issue 20 (3): an array of 1M ints took 22 s to validate on the event loop."""
    started = broker.mark()
    schema = json.dumps({"type": "array", "items": {"type": "integer"}}).encode()
    payload = json.dumps(list(range(ARRAY_ITEMS))).encode()
    outcome, took = _bound_topic_scenario(broker, "array", schema, payload)
    LEDGER.record("schema", f"array of {ARRAY_ITEMS} ints", outcome, b"")
    broker.measure(started, f"array of {ARRAY_ITEMS} ints ({took:.1f} s)")
    assert outcome == "OK" or outcome in CLEAN_REFUSALS, f"array payload: {outcome}"
    broker.assert_healthy_since(started, f"array of {ARRAY_ITEMS} ints ({took:.1f} s)")


def _register(broker: WatchedBroker, subject: str, kind: str, definition: bytes) -> str:
    async def scenario() -> str:
        channel = _channel(broker, broker.addr)
        try:
            registry = pb.SchemaRegistryStub(channel)
            return await _outcome(
                registry.register_schema(pb.RegisterSchemaRequest(subject, kind, definition))
            )
        finally:
            channel.close()

    return asyncio.run(scenario())


def test_an_avro_record_that_never_ends_is_refused(broker: WatchedBroker) -> None:
    """Issue 20 (11): a record whose only field is itself has no finite value."""
    started = broker.mark()
    schema = json.dumps(
        {"type": "record", "name": "Inf", "fields": [{"name": "me", "type": "Inf"}]}
    ).encode()
    outcome = _register(broker, "never-ends", "avro", schema)
    LEDGER.record("schema", "Avro record that never ends", outcome, b"")
    broker.measure(started, "Avro record that never ends")
    assert outcome == "INVALID_ARGUMENT", f"an endless Avro record: {outcome}"
    broker.assert_healthy_since(started, "Avro record that never ends")


def test_a_huge_avro_enum_does_not_stall_the_broker(broker: WatchedBroker) -> None:
    """Issue 20 (11): a 20,000-symbol enum cost 8.9 s of CPU."""
    started = broker.mark()
    schema = json.dumps(
        {"type": "enum", "name": "E", "symbols": [f"S{i}" for i in range(20_000)]}
    ).encode()
    outcome = _register(broker, "big-enum", "avro", schema)
    LEDGER.record("schema", "Avro enum of 20k symbols", outcome, b"")
    broker.measure(started, "Avro enum of 20k symbols")
    assert outcome == "OK" or outcome in CLEAN_REFUSALS, f"a 20k-symbol enum: {outcome}"
    broker.assert_healthy_since(started, "Avro enum of 20k symbols")


def test_the_broker_came_through(broker: WatchedBroker) -> None:
    problems = broker.checkpoint() if broker.security else broker.finish()
    assert not problems, "; ".join(problems)
