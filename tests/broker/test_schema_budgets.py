"""Schema bombs against a real broker (issue 20, items 2, 3 and 11): each is refused with a
clean status naming the limit, every other request keeps being answered meanwhile, and a
graceful stop during checks finishes. Bounds are generous (seconds, against the minutes of
the bugs) so a loaded machine cannot make them flake; speeds are measured in bench/."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as api
from danube.proto import danube_schema as pb
from tests.schema.test_budgets import doubling
from tests.support.aio import run, unique_topic

pytestmark = pytest.mark.slow

PROMPT_S = 3.0
"""The slowest answer another client may get while a bomb is checked (the bugs: minutes)."""


def channel(address: str) -> closing[Channel]:
    host, _, port = address.rpartition(":")
    return closing(Channel(host, int(port)))


def small_schema(name: str) -> bytes:
    return json.dumps({"type": "object", "title": name}).encode()


async def refusal(call: Awaitable[object]) -> GRPCError:
    with pytest.raises(GRPCError) as refused:
        await call
    return refused.value


async def slowest_answer_while(
    ch: Channel, busy: Callable[[], Awaitable[object]]
) -> tuple[object, float]:
    """Runs `busy` while HealthCheck and RegisterSchema (another subject) are asked in turn:
    what `busy` returned and the slowest of those answers, in seconds."""
    health = api.HealthCheckStub(ch)
    registry = pb.SchemaRegistryStub(ch)
    task = asyncio.ensure_future(busy())
    slowest = 0.0
    asked = 0
    while not task.done() or asked < 4:
        started = time.monotonic()
        if asked % 2:
            subject = f"bystander-{uuid.uuid4().hex[:8]}"
            await registry.register_schema(
                pb.RegisterSchemaRequest(subject, "json_schema", small_schema(subject))
            )
        else:
            await health.health_check(
                api.HealthCheckRequest(request_id=1, client=0, id=1)  # type: ignore[arg-type]
            )
        slowest = max(slowest, time.monotonic() - started)
        asked += 1
        await asyncio.sleep(0.05)
    return await task, slowest


def test_a_comparison_bomb_is_refused_while_others_are_answered(
    tmp_path: Path, broker_factory: type[BrokerProcess]
) -> None:
    """31 levels of doubling anyOf, string leaf then integer leaf, BACKWARD: the check ran
    for over 5 minutes (+1 GB) and every other RegisterSchema hit its deadline."""
    broker = broker_factory(tmp_path / "data").start()

    async def scenario() -> tuple[object, float]:
        with channel(broker.broker_addr) as ch:
            registry = pb.SchemaRegistryStub(ch)
            await registry.register_schema(
                pb.RegisterSchemaRequest("bomb", "json_schema", doubling("string", 31))
            )
            second = pb.RegisterSchemaRequest("bomb", "json_schema", doubling("integer", 31))
            refused, slowest = await slowest_answer_while(
                ch, lambda: refusal(registry.register_schema(second, timeout=60))
            )
            check = pb.CheckCompatibilityRequest("bomb", doubling("integer", 31), "json_schema")
            checked = await refusal(registry.check_compatibility(check, timeout=60))
            return (refused, checked), slowest

    (refused, checked), slowest = run(scenario, timeout=120)
    for answer in (refused, checked):
        assert isinstance(answer, GRPCError)
        assert answer.status is Status.RESOURCE_EXHAUSTED
        assert "(limit: compatibility steps)" in str(answer.message)
    assert slowest < PROMPT_S
    assert "Traceback" not in broker.log_text()


def test_a_graceful_stop_during_checks_finishes(
    tmp_path: Path, broker_factory: type[BrokerProcess]
) -> None:
    """The bomb's checks in flight when SIGTERM comes do not keep the broker alive (it
    hung before, and needed SIGKILL)."""
    broker = broker_factory(tmp_path / "data").start()

    async def scenario() -> None:
        with channel(broker.broker_addr) as ch:
            registry = pb.SchemaRegistryStub(ch)
            await registry.register_schema(
                pb.RegisterSchemaRequest("bomb", "json_schema", doubling("string", 31))
            )
            second = pb.RegisterSchemaRequest("bomb", "json_schema", doubling("integer", 31))
            checks = [
                asyncio.ensure_future(registry.register_schema(second, timeout=60))
                for _ in range(6)
            ]
            await asyncio.sleep(0.3)
            await asyncio.to_thread(broker.stop, timeout=30)
            await asyncio.gather(*checks, return_exceptions=True)

    run(scenario, timeout=60)
    assert broker.process is not None and broker.process.poll() is not None


ENFORCED_BOMBS = [
    pytest.param(
        {"type": "string", "pattern": "^(a|aa)+$"},
        json.dumps("a" * 40 + "!").encode(),
        "pattern seconds",
        id="catastrophic-pattern",
    ),
    pytest.param(
        json.loads(doubling("string", 18)),
        b"1",
        "validation steps|schema CPU seconds",
        id="doubling-anyOf-18",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "integer"}},
        json.dumps([1] * 1_000_000).encode(),
        "validated payload bytes",
        id="array-of-1M-ints",
    ),
]


@pytest.mark.parametrize(("schema", "payload", "limit"), ENFORCED_BOMBS)
def test_a_payload_bomb_on_an_enforcing_topic_is_refused_while_others_are_answered(
    broker: BrokerProcess, schema: dict[str, Any], payload: bytes, limit: str
) -> None:
    """Payload validation ran on the event loop: the pattern took 1.4 s at 24 a's (doubling
    per character), the anyOf schema 42 s, the array 22 s, stalling every topic."""
    topic = unique_topic("enforced")
    subject = f"bomb-{topic.rpartition('-')[2]}"

    async def scenario() -> tuple[object, float]:
        with channel(broker.broker_addr) as ch:
            registry = pb.SchemaRegistryStub(ch)
            producers = api.ProducerServiceStub(ch)
            registered = await registry.register_schema(
                pb.RegisterSchemaRequest(subject, "json_schema", json.dumps(schema).encode())
            )
            created = await producers.create_producer(
                api.ProducerRequest(request_id=1, producer_name="p", topic_name=topic)
            )
            with channel(broker.admin_addr) as admin:  # a binding changes on the admin port
                await pb.SchemaRegistryStub(admin).configure_topic_schema(
                    pb.ConfigureTopicSchemaRequest(topic, subject, "enforce", True)
                )
            message = api.StreamMessage(
                request_id=1,
                msg_id=api.MsgId(producer_id=created.producer_id, topic_name=topic),
                payload=payload,
                producer_name="p",
                schema_id=registered.schema_id,
                schema_version=1,
            )
            return await slowest_answer_while(
                ch, lambda: refusal(producers.send_message(message, timeout=60))
            )

    refused, slowest = run(scenario, timeout=90)
    assert isinstance(refused, GRPCError)
    assert refused.status is Status.RESOURCE_EXHAUSTED
    assert re.search(limit, str(refused.message))
    assert slowest < PROMPT_S


@pytest.mark.parametrize(
    ("definition", "status", "words"),
    [
        pytest.param(
            {"type": "record", "name": "Inf", "fields": [{"name": "me", "type": "Inf"}]},
            Status.INVALID_ARGUMENT,
            "can never end",
            id="endless-record",
        ),
        pytest.param(
            {"type": "enum", "name": "E", "symbols": [f"s{i}" for i in range(20_000)]},
            Status.RESOURCE_EXHAUSTED,
            "enum symbols",
            id="20k-symbol-enum",
        ),
    ],
)
def test_avro_schemas_no_value_or_too_much_work_are_refused_at_registration(
    broker: BrokerProcess, definition: dict[str, Any], status: Status, words: str
) -> None:
    subject = f"avro-{uuid.uuid4().hex[:8]}"

    async def scenario() -> GRPCError:
        with channel(broker.broker_addr) as ch:
            registry = pb.SchemaRegistryStub(ch)
            request = pb.RegisterSchemaRequest(subject, "avro", json.dumps(definition).encode())
            return await refusal(registry.register_schema(request, timeout=30))

    refused = run(scenario)
    assert refused.status is status
    assert words in str(refused.message)
