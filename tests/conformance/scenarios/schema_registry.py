"""The official client's `SchemaRegistryClient` end to end against our broker (issue 8).

Usage: schema_registry.py BROKER_URL SUBJECT_PREFIX ADMIN_URL

Registers Avro versions under one subject (an identical re-registration, a compatible
second version, an incompatible one refused and then accepted under mode none, which is
then deleted), a JSON Schema and a Protobuf subject, and reads everything back the ways the
client can. Changing a subject's mode, deleting a version and binding a topic are operator
calls served on the admin port only: the client's SchemaRegistryClient makes them through a
client built on ADMIN_URL, after seeing the client port refuse them. Result: what the client
got at each step; error codes by name.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from danube.schema import CompatibilityMode, SchemaType
from official_harness import build_client, main, receive_n, report

from danube import SubType

ID = {"name": "id", "type": "long"}
V1 = json.dumps({"type": "record", "name": "Order", "fields": [ID]}).encode()
V2 = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [ID, {"name": "note", "type": "string", "default": ""}],
    }
).encode()
V3_BREAKING = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "id", "type": "int"}, {"name": "due", "type": "long"}],
    }
).encode()
JSON_SCHEMA = json.dumps(
    {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
).encode()
PROTO = b'syntax = "proto3";\npackage shop;\nmessage Item { string sku = 1; int32 qty = 2; }\n'


async def error_of(call: Any) -> dict[str, str] | None:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return {"code": error.code().name, "details": error.details() or ""}
    return None


def info(schema: Any) -> dict[str, Any]:
    return {
        "schema_id": schema.schema_id,
        "subject": schema.subject,
        "version": schema.version,
        "schema_type": schema.schema_type,
        "definition": schema.schema_definition.decode(),
        "fingerprint": schema.fingerprint,
    }


async def scenario(argv: list[str]) -> None:
    url, prefix, admin_url = argv[0], argv[1], argv[2]
    orders, items, shop = f"{prefix}-orders", f"{prefix}-items", f"{prefix}-shop"
    report["registered"] = {
        "v1": V1.decode(), "v2": V2.decode(), "json": JSON_SCHEMA.decode(), "proto": PROTO.decode()
    }  # fmt: skip
    client = await build_client(url)
    registry = client.schema()
    operator = (await build_client(admin_url)).schema()

    async def register(subject: str, kind: SchemaType, data: bytes) -> int:
        builder = registry.register_schema(subject).with_type(kind).with_schema_data(data)
        return await builder.with_description("conformance").with_tags(["test"]).execute()

    report["v1_id"] = await register(orders, SchemaType.AVRO, V1)
    report["v1_again_id"] = await register(orders, SchemaType.AVRO, V1)
    report["versions_after_repeat"] = await registry.list_versions(orders)
    report["v2_id"] = await register(orders, SchemaType.AVRO, V2)
    report["versions_after_v2"] = await registry.list_versions(orders)
    compatible, errors = await registry.check_compatibility(orders, V3_BREAKING, SchemaType.AVRO)
    report["check_breaking"] = {"compatible": compatible, "errors": errors}
    compatible, errors = await registry.check_compatibility(
        orders, V3_BREAKING, SchemaType.AVRO, CompatibilityMode.NONE
    )
    report["check_breaking_under_none"] = {"compatible": compatible, "errors": errors}
    report["register_breaking"] = await error_of(register(orders, SchemaType.AVRO, V3_BREAKING))
    report["latest"] = info(await registry.get_latest_schema(orders))
    report["by_id_v1"] = info(await registry.get_schema_version(report["v1_id"], 1))
    report["by_id_latest"] = info(await registry.get_schema_by_id(report["v1_id"]))
    report["set_none_on_client_port"] = await error_of(
        registry.set_compatibility_mode(orders, CompatibilityMode.NONE)
    )
    report["set_none"] = list(await operator.set_compatibility_mode(orders, CompatibilityMode.NONE))
    await register(orders, SchemaType.AVRO, V3_BREAKING)
    report["versions_after_v3"] = await registry.list_versions(orders)
    report["delete_on_client_port"] = await error_of(registry.delete_schema_version(orders, 3))
    report["delete_v3"] = list(await operator.delete_schema_version(orders, 3))
    report["versions_after_delete"] = await registry.list_versions(orders)
    report["json_id"] = await register(items, SchemaType.JSON_SCHEMA, JSON_SCHEMA)
    report["json_latest"] = info(await registry.get_latest_schema(items))
    topic = f"/default/{prefix}-bound"
    producer = client.new_producer().with_topic(topic).with_name("conf-schema").build()
    await producer.create()
    report["configure_on_client_port"] = await error_of(
        registry.configure_topic_schema(topic, items, "none", False)
    )
    report["configure"] = list(await operator.configure_topic_schema(topic, items, "enforce", True))
    config = await registry.get_topic_schema_config(topic)
    report["topic_config"] = {
        "subject": config.schema_subject, "policy": config.validation_policy,
        "payloads": config.enable_payload_validation, "schema_id": config.schema_id,
    }  # fmt: skip
    report["send_without_schema"] = await error_of(producer.send(b'{"sku": "a"}', None))
    report["update_on_client_port"] = await error_of(
        registry.update_topic_validation_policy(topic, "none", False)
    )
    report["update"] = list(await operator.update_topic_validation_policy(topic, "warn", True))
    report["send_under_warn"] = await error_of(producer.send(b'{"sku": 1}', None))

    typed_topic = f"/default/{prefix}-typed"
    typed = (
        client.new_producer().with_topic(typed_topic).with_name("conf-typed")
        .with_schema_subject(orders).build()
    )  # fmt: skip
    await typed.create()
    consumer = (
        client.new_consumer().with_topic(typed_topic).with_consumer_name("conf-typed-c")
        .with_subscription("conf-typed-s").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    await typed.send(b"\x02\x00", None)  # id 1, note "" (version 2)
    (received,) = await receive_n(queue, 1, 5.0, "a message with a schema")
    report["typed_message"] = {
        "schema_id": received.schema_id if received.HasField("schema_id") else None,
        "schema_version": (
            received.schema_version if received.HasField("schema_version") else None
        ),
    }
    report["typed_config"] = (await registry.get_topic_schema_config(typed_topic)).validation_policy
    other = (
        client.new_producer().with_topic(typed_topic).with_name("conf-other")
        .with_schema_subject(items).build()
    )  # fmt: skip
    report["other_subject"] = await error_of(other.create())
    await consumer.close()
    report["proto_id"] = await register(shop, SchemaType.PROTOBUF, PROTO)
    report["proto_latest"] = info(await registry.get_latest_schema(shop))
    bad = register(f"{prefix}-bad", SchemaType.PROTOBUF, b"message {")
    report["bad_proto"] = await error_of(bad)
    report["unknown_subject"] = await error_of(registry.get_latest_schema(f"{prefix}-nobody"))
    report["unknown_version"] = await error_of(registry.get_schema_version(report["v1_id"], 9))


if __name__ == "__main__":
    main(scenario, timeout=40.0)
