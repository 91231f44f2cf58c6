"""Our client's producers with a schema against a real broker: the version a reference
chooses (latest, pinned, minimum) is what every message carries to consumers, and a
reference the registry cannot satisfy fails before the topic is touched (issue 8, point 4;
Danube's own producer tests, reference 8.5)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from contextlib import closing
from typing import TypeVar

import pytest
from grpclib.client import Channel

from danube.client import DanubeClient, DanubeClientError, Producer, SchemaRef
from danube.client.schemas import SchemaRegistry
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.schema.avro import encode_json_datum, parse_avro
from danube.machines.schema.compatibility import CompatibilityMode
from danube.proto import danube_schema as schema_pb
from tests.support.aio import receive_n, run, unique_topic

pytestmark = pytest.mark.slow

T = TypeVar("T")


def order(*extra: str) -> bytes:
    fields = [{"name": "id", "type": "long"}]
    fields += [{"name": name, "type": "string", "default": ""} for name in extra]
    return json.dumps({"type": "record", "name": "Order", "fields": fields}).encode()


async def on_admin_port(broker: BrokerProcess, call: Callable[[SchemaRegistry], Awaitable[T]]) -> T:
    """Changing a subject's rules or a topic's binding is an operator call: admin port only
    (the client port refuses it, spec/protocol.md)."""
    async with DanubeClient(f"http://{broker.admin_addr}") as admin:
        return await call(admin.schemas)


def subject_name() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


async def three_versions(client: DanubeClient, subject: str) -> int:
    """Registers versions 1–3 of `subject`; returns its schema id."""
    for version in range(1, 4):
        answer = await client.schemas.register(
            subject, "avro", order(*(f"f{i}" for i in range(1, version)))
        )
    return answer.schema_id


def test_each_reference_stamps_the_version_it_chose(broker: BrokerProcess) -> None:
    subject, topic = subject_name(), unique_topic()

    async def scenario() -> tuple[int, list[tuple[int | None, int | None]], list[int]]:
        async with DanubeClient(broker.url) as client:
            schema_id = await three_versions(client, subject)
            refs = (
                SchemaRef(subject),
                SchemaRef(subject, pinned=1),
                SchemaRef(subject, pinned=3),
                SchemaRef(subject, minimum=3),
            )
            producers = [
                await client.producer(topic, f"p{i}", schema=ref).create()
                for i, ref in enumerate(refs)
            ]
            consumer = await client.consumer(topic, "c", "s").subscribe()
            chosen = []
            for producer in producers:
                assert producer.schema is not None
                chosen.append(producer.schema.version)
                await producer.send(b"\x02")
            received = await receive_n(consumer, 4)
        return schema_id, [(m.schema_id, m.schema_version) for m in received], chosen

    schema_id, stamps, chosen = run(scenario)
    assert chosen == [3, 1, 3, 3]
    assert stamps == [(schema_id, 3), (schema_id, 1), (schema_id, 3), (schema_id, 3)]


def test_a_partitioned_producer_stamps_every_partition(broker: BrokerProcess) -> None:
    subject, topic = subject_name(), unique_topic()

    async def scenario() -> tuple[int, set[tuple[int | None, int | None]]]:
        async with DanubeClient(broker.url) as client:
            answer = await client.schemas.register(subject, "avro", order())
            producer = await client.producer(
                topic, "p", partitions=3, schema=SchemaRef(subject)
            ).create()
            consumer = await client.consumer(topic, "c", "s").subscribe()
            for _ in range(6):
                await producer.send(b"\x02")
            received = await receive_n(consumer, 6)
        assert {m.topic for m in received} == {f"{topic}-part-{i}" for i in range(3)}
        return answer.schema_id, {(m.schema_id, m.schema_version) for m in received}

    schema_id, stamps = run(scenario)
    assert stamps == {(schema_id, 1)}


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        (lambda s: SchemaRef(s, pinned=4), "has no version 4 (latest is 3)"),
        (lambda s: SchemaRef(s, minimum=4), "is at version 3, below the minimum 4"),
        (lambda s: SchemaRef(s, pinned=2), "has no version 2 (deleted)"),
        (lambda s: SchemaRef(s + "-unknown"), "NOT_FOUND"),
    ],
    ids=["pinned-above-latest", "minimum-above-latest", "pinned-deleted", "unknown-subject"],
)
def test_a_reference_the_registry_cannot_satisfy_fails_before_the_topic_exists(
    broker: BrokerProcess, ref: object, words: str
) -> None:
    subject, topic = subject_name(), unique_topic()

    async def scenario() -> tuple[str, list[str]]:
        async with DanubeClient(broker.url) as client:
            await three_versions(client, subject)
            await on_admin_port(broker, lambda r: r.delete_version(subject, 2))
            with pytest.raises(DanubeClientError) as raised:
                await client.producer(topic, "p", schema=ref(subject)).create()  # type: ignore[operator]
            return str(raised.value), await client.partitions(topic)

    message, partitions = run(scenario)
    assert words in message
    assert partitions == []


def test_a_producer_of_another_subject_is_refused_by_a_bound_topic(broker: BrokerProcess) -> None:
    first, second, topic = subject_name(), subject_name(), unique_topic()

    async def scenario() -> DanubeClientError:
        async with DanubeClient(broker.url) as client:
            await client.schemas.register(first, "avro", order())
            await client.schemas.register(second, "avro", order())
            await client.producer(topic, "p1", schema=SchemaRef(first)).create()
            with pytest.raises(DanubeClientError) as raised:
                await client.producer(topic, "p2", schema=SchemaRef(second)).create()
            return raised.value

    error = run(scenario)
    assert "FAILED_PRECONDITION" in str(error) and first in str(error)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"pinned": 1, "minimum": 1}, "not both"),
        ({"pinned": 0}, "start at 1"),
        ({"subject": ""}, "needs a subject"),
    ],
)
def test_a_malformed_reference_is_refused_at_once(kwargs: dict[str, object], words: str) -> None:
    arguments: dict[str, object] = {"subject": "s", **kwargs}
    with pytest.raises(DanubeClientError, match=words):
        SchemaRef(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [mode.value for mode in CompatibilityMode])
def test_a_producer_switches_versions_under_each_mode(broker: BrokerProcess, mode: str) -> None:
    """v2 adds an optional field (compatible under every mode), v3 changes a field's type
    (refused unless the mode is none). On a topic that enforces with payloads checked, the
    producer writes v1, v2, then v1 again; a v1 payload stamped v2 is refused."""
    subject, topic = subject_name(), unique_topic()
    v1 = order()
    v2 = json.dumps(
        {
            "type": "record",
            "name": "Order",
            "fields": [
                {"name": "id", "type": "long"},
                {"name": "note", "type": ["null", "string"], "default": None},
            ],
        }
    ).encode()
    v3 = json.dumps(
        {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}
    ).encode()

    def datum(definition: bytes, value: dict[str, object]) -> bytes:
        return encode_json_datum(parse_avro(definition), value)

    async def scenario() -> tuple[list[int | None], str | None, DanubeClientError]:
        async with DanubeClient(broker.url) as client:
            await client.schemas.register(subject, "avro", v1)
            await on_admin_port(broker, lambda r: r.set_mode(subject, mode))
            await client.schemas.register(subject, "avro", v2)
            try:
                await client.schemas.register(subject, "avro", v3)
                third = None
            except DanubeClientError as error:
                third = str(error)

            def pinned(name: str, version: int) -> Producer:
                return client.producer(topic, name, schema=SchemaRef(subject, pinned=version))

            first = await pinned("p1", 1).create()
            with closing(Channel(*broker.admin_addr.rsplit(":", 1))) as channel:
                await schema_pb.SchemaRegistryStub(channel).configure_topic_schema(
                    schema_pb.ConfigureTopicSchemaRequest(topic, subject, "enforce", True)
                )
            consumer = await client.consumer(topic, "c", "s").subscribe()
            second = await pinned("p2", 2).create()
            again = await pinned("p3", 1).create()
            await first.send(datum(v1, {"id": 1}))
            await second.send(datum(v2, {"id": 2, "note": "x"}))
            with pytest.raises(DanubeClientError) as refused:
                await second.send(datum(v1, {"id": 3}))
            await again.send(datum(v1, {"id": 4}))
            received = await receive_n(consumer, 3)
        return [m.schema_version for m in received], third, refused.value

    versions, third, refused = run(scenario)
    assert versions == [1, 2, 1]
    if mode == "none":
        assert third is None
    else:
        assert third is not None and "FAILED_PRECONDITION" in third and mode in third
    assert "INVALID_ARGUMENT" in str(refused) and "enforce" in str(refused)


def test_a_deleted_version_is_refused_at_once_on_an_enforcing_topic(
    broker: BrokerProcess,
) -> None:
    """Found in review: the broker kept the schemas messages named for ever, so a version
    deleted after a message had named it went on being accepted."""
    subject, topic = subject_name(), unique_topic()

    async def scenario() -> DanubeClientError:
        async with DanubeClient(broker.url) as client:
            await three_versions(client, subject)
            producer = await client.producer(
                topic, "p", schema=SchemaRef(subject, pinned=1)
            ).create()
            with closing(Channel(*broker.admin_addr.rsplit(":", 1))) as channel:
                await schema_pb.SchemaRegistryStub(channel).configure_topic_schema(
                    schema_pb.ConfigureTopicSchemaRequest(topic, subject, "enforce", False)
                )
            await producer.send(b"\x02")
            await on_admin_port(broker, lambda r: r.delete_version(subject, 1))
            with pytest.raises(DanubeClientError) as refused:
                await producer.send(b"\x02")
            return refused.value

    error = run(scenario)
    assert "INVALID_ARGUMENT" in str(error) and "registry has no schema" in str(error)
