"""The schema registry in a real broker process: subjects survive a restart, concurrent
registrations of different schemas get distinct version numbers, and the admin port answers
too (issue 8, point 1). The official client's view: tests/conformance."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import closing
from pathlib import Path

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as api
from danube.proto import danube_schema as pb
from tests.support.aio import run, unique_topic

pytestmark = pytest.mark.slow


def avro(*names: str) -> bytes:
    fields = [{"name": n, "type": "string", "default": ""} for n in names]
    return json.dumps({"type": "record", "name": "R", "fields": fields}).encode()


def channel(address: str) -> closing[Channel]:
    host, _, port = address.rpartition(":")
    return closing(Channel(host, int(port)))


def test_subjects_survive_a_restart_and_answer_on_both_ports(
    tmp_path: Path, broker_factory: type[BrokerProcess]
) -> None:
    data = tmp_path / "data"
    broker = broker_factory(data).start()

    async def register() -> pb.RegisterSchemaResponse:
        with channel(broker.broker_addr) as ch:
            stub = pb.SchemaRegistryStub(ch)
            request = pb.RegisterSchemaRequest("orders", "avro", avro("a"), created_by="t")
            return await stub.register_schema(request)

    first = run(register)
    broker.stop()
    broker = broker_factory(data).start()

    async def read_back() -> tuple[pb.GetSchemaResponse, pb.GetSchemaResponse]:
        with channel(broker.broker_addr) as client_ch, channel(broker.admin_addr) as admin_ch:
            on_client = pb.SchemaRegistryStub(client_ch)
            on_admin = pb.SchemaRegistryStub(admin_ch)
            latest = await on_client.get_latest_schema(pb.GetLatestSchemaRequest("orders"))
            by_id = await on_admin.get_schema(pb.GetSchemaRequest(first.schema_id))
            return latest, by_id

    latest, by_id = run(read_back)
    assert (latest.schema_id, latest.version, latest.schema_definition) == (
        first.schema_id, 1, avro("a"),
    )  # fmt: skip
    assert by_id.subject == "orders" and by_id.fingerprint == first.fingerprint


def test_concurrent_registrations_get_distinct_versions(broker: BrokerProcess) -> None:
    subject = f"race-{uuid.uuid4().hex[:8]}"

    async def scenario() -> list[pb.RegisterSchemaResponse]:
        with channel(broker.broker_addr) as ch:
            stub = pb.SchemaRegistryStub(ch)
            await stub.register_schema(pb.RegisterSchemaRequest(subject, "avro", avro()))
            requests = [
                stub.register_schema(pb.RegisterSchemaRequest(subject, "avro", avro(f"f{i}")))
                for i in range(6)
            ]
            return await asyncio.gather(*requests)

    answers = run(scenario)
    # each adds one defaulted field to version 1, so each is backward compatible with any
    # sibling that landed first (it reads the sibling's data, filling in its own default)
    assert sorted(a.version for a in answers) == list(range(2, 8))
    assert len({a.schema_id for a in answers}) == 1


def test_bad_requests_say_what_is_wrong(broker: BrokerProcess) -> None:
    async def scenario() -> list[GRPCError]:
        errors = []
        with channel(broker.broker_addr) as ch, channel(broker.admin_addr) as admin_ch:
            stub = pb.SchemaRegistryStub(ch)
            for call in (
                stub.register_schema(pb.RegisterSchemaRequest("s1", "yaml", b"x")),
                stub.register_schema(pb.RegisterSchemaRequest("s1", "avro", b"{not json")),
                stub.register_schema(pb.RegisterSchemaRequest("a/b", "string", b"x")),
                pb.SchemaRegistryStub(admin_ch).set_compatibility_mode(
                    pb.SetCompatibilityModeRequest("nobody", "full")
                ),
                stub.get_schema(pb.GetSchemaRequest(10**9)),
            ):
                with pytest.raises(GRPCError) as caught:
                    await call
                errors.append(caught.value)
        return errors

    unknown_type, bad_json, bad_name, no_subject, no_id = run(scenario)
    assert unknown_type.status is Status.INVALID_ARGUMENT and "unknown schema type" in str(
        unknown_type.message
    )
    assert bad_json.status is Status.INVALID_ARGUMENT and "not valid JSON" in str(bad_json.message)
    assert bad_name.status is Status.INVALID_ARGUMENT
    assert no_subject.status is Status.NOT_FOUND
    assert no_id.status is Status.NOT_FOUND


def test_aliases_modes_and_the_protobuf_message_a_subject_carries(broker: BrokerProcess) -> None:
    subject = f"shop-{uuid.uuid4().hex[:8]}"
    item = b'syntax = "proto3";\nmessage Item { string sku = 1; }\n'
    helper_first = b'syntax = "proto3";\nmessage Helper { int64 n = 1; }\n' + item[19:]

    async def scenario() -> tuple[pb.CheckCompatibilityResponse, GRPCError, pb.GetSchemaResponse]:
        with channel(broker.broker_addr) as ch:
            stub = pb.SchemaRegistryStub(ch)
            await stub.register_schema(pb.RegisterSchemaRequest(subject, "PROTO", item))
            # a message added above Item: the subject's payloads are still Items
            await stub.register_schema(pb.RegisterSchemaRequest(subject, "protobuf", helper_first))
            check = await stub.check_compatibility(
                pb.CheckCompatibilityRequest(subject, item, "proto", "FULL_TRANSITIVE")
            )
            with pytest.raises(GRPCError) as bad_mode:
                await stub.check_compatibility(
                    pb.CheckCompatibilityRequest(subject, item, "proto", "sideways")
                )
            latest = await stub.get_latest_schema(pb.GetLatestSchemaRequest(subject))
            return check, bad_mode.value, latest

    check, bad_mode, latest = run(scenario)
    assert check.is_compatible, check.errors
    assert bad_mode.status is Status.INVALID_ARGUMENT and "full_transitive" in str(bad_mode.message)
    assert latest.version == 2 and latest.schema_type == "protobuf"


ORDER = json.dumps(
    {"type": "object", "properties": {"qty": {"type": "integer"}}, "required": ["qty"]}
).encode()


def test_a_bound_topic_checks_every_publish_by_its_policy(broker: BrokerProcess) -> None:
    """enforce refuses what does not fit (naming the field), warn lets it through and logs
    it, none does not look; the binding is reported back. A partitioned-looking name that
    is no topic is not found (no prefix match, unlike Danube)."""
    topic = unique_topic("bound")
    subject = f"orders-{topic.rpartition('-')[2]}"

    async def scenario() -> dict[str, object]:
        found: dict[str, object] = {}
        with channel(broker.broker_addr) as ch, channel(broker.admin_addr) as admin_ch:
            registry = pb.SchemaRegistryStub(ch)
            operator = pb.SchemaRegistryStub(admin_ch)
            producers = api.ProducerServiceStub(ch)
            registered = await registry.register_schema(
                pb.RegisterSchemaRequest(subject, "json_schema", ORDER)
            )
            created = await producers.create_producer(
                api.ProducerRequest(request_id=1, producer_name="p", topic_name=topic)
            )

            async def send(payload: bytes, schema_id: int | None) -> str | None:
                message = api.StreamMessage(
                    request_id=1,
                    msg_id=api.MsgId(producer_id=created.producer_id, topic_name=topic),
                    payload=payload,
                    producer_name="p",
                    schema_id=schema_id,
                    schema_version=None if schema_id is None else 1,
                )
                try:
                    await producers.send_message(message)
                except GRPCError as error:
                    assert error.status is Status.INVALID_ARGUMENT
                    return str(error.message)
                return None

            found["unbound"] = await send(b"not json", None)
            await operator.configure_topic_schema(
                pb.ConfigureTopicSchemaRequest(topic, subject, "enforce", True)
            )
            found["config"] = await registry.get_topic_schema_config(
                pb.GetTopicSchemaConfigRequest(topic)
            )
            found["valid"] = await send(b'{"qty": 3}', registered.schema_id)
            found["invalid"] = await send(b'{"qty": "three"}', registered.schema_id)
            found["no_id"] = await send(b'{"qty": 3}', None)
            found["unknown_id"] = await send(b'{"qty": 3}', 10**9)
            await operator.update_topic_validation_policy(
                pb.UpdateTopicValidationPolicyRequest(topic, "warn", True)
            )
            found["warned"] = await send(b'{"qty": "three"}', registered.schema_id)
            await operator.update_topic_validation_policy(
                pb.UpdateTopicValidationPolicyRequest(topic, "none", True)
            )
            found["unchecked"] = await send(b"not json", None)
            with pytest.raises(GRPCError) as no_such_topic:
                await operator.configure_topic_schema(
                    pb.ConfigureTopicSchemaRequest(topic + "-part-0x", subject, "warn", False)
                )
            found["no_such_topic"] = no_such_topic.value.status
            with pytest.raises(GRPCError) as unknown_subject:
                await operator.configure_topic_schema(
                    pb.ConfigureTopicSchemaRequest(topic, "nobody-here", "enforce", False)
                )
            found["unknown_subject"] = unknown_subject.value.status
        return found

    found = run(scenario)
    assert found["unbound"] is None and found["valid"] is None and found["warned"] is None
    assert found["unchecked"] is None and found["no_such_topic"] is Status.NOT_FOUND
    config = found["config"]
    assert isinstance(config, pb.GetTopicSchemaConfigResponse)
    assert (config.schema_subject, config.validation_policy) == (subject, "enforce")
    assert config.enable_payload_validation and config.schema_id > 0
    assert "$.qty" in str(found["invalid"]) and "integer" in str(found["invalid"])
    assert "names no schema id" in str(found["no_id"])
    assert "has no schema" in str(found["unknown_id"])
    assert found["unknown_subject"] is Status.NOT_FOUND
    broker.wait_for_log(f"event=schema_validation_warning topic={topic} reason=payload_invalid")


def test_changing_a_binding_or_a_subjects_rules_is_refused_on_the_client_port(
    broker: BrokerProcess,
) -> None:
    """Issue 20: any client could set an enforcing topic's policy to none, or delete the
    versions its producers name, from the client port. There those calls now answer
    PERMISSION_DENIED naming the admin port, and change nothing; on the admin port they
    work; what a producer does (register, read, check) still works on the client port."""
    topic = unique_topic("guarded")
    subject = f"guarded-{topic.rpartition('-')[2]}"

    async def scenario() -> dict[str, object]:
        found: dict[str, object] = {}
        with channel(broker.broker_addr) as ch, channel(broker.admin_addr) as admin_ch:
            client_port = pb.SchemaRegistryStub(ch)
            admin_port = pb.SchemaRegistryStub(admin_ch)
            await client_port.register_schema(
                pb.RegisterSchemaRequest(subject, "json_schema", ORDER)
            )
            await api.ProducerServiceStub(ch).create_producer(
                api.ProducerRequest(request_id=1, producer_name="p", topic_name=topic)
            )
            await admin_port.configure_topic_schema(
                pb.ConfigureTopicSchemaRequest(topic, subject, "enforce", True)
            )
            refused = {
                "ConfigureTopicSchema": client_port.configure_topic_schema(
                    pb.ConfigureTopicSchemaRequest(topic, subject, "none", False)
                ),
                "UpdateTopicValidationPolicy": client_port.update_topic_validation_policy(
                    pb.UpdateTopicValidationPolicyRequest(topic, "none", False)
                ),
                "DeleteSchemaVersion": client_port.delete_schema_version(
                    pb.DeleteSchemaVersionRequest(subject, 1)
                ),
                "SetCompatibilityMode": client_port.set_compatibility_mode(
                    pb.SetCompatibilityModeRequest(subject, "none")
                ),
            }
            for method, call in refused.items():
                with pytest.raises(GRPCError) as caught:
                    await call
                found[method] = (caught.value.status, str(caught.value.message))
            config = await client_port.get_topic_schema_config(
                pb.GetTopicSchemaConfigRequest(topic)
            )
            found["config"] = (config.validation_policy, config.enable_payload_validation)
            versions = await client_port.list_versions(pb.ListVersionsRequest(subject))
            found["versions"] = [v.version for v in versions.versions]
            checked = await client_port.check_compatibility(
                pb.CheckCompatibilityRequest(subject, ORDER, "json_schema")
            )
            found["check"] = checked.is_compatible
            await admin_port.update_topic_validation_policy(
                pb.UpdateTopicValidationPolicyRequest(topic, "warn", False)
            )
            config = await client_port.get_topic_schema_config(
                pb.GetTopicSchemaConfigRequest(topic)
            )
            found["config_after_admin"] = config.validation_policy
            await admin_port.set_compatibility_mode(pb.SetCompatibilityModeRequest(subject, "full"))
            deleted = await admin_port.delete_schema_version(
                pb.DeleteSchemaVersionRequest(subject, 1)
            )
            found["deleted"] = deleted.success
        return found

    found = run(scenario)
    for method in (
        "ConfigureTopicSchema", "UpdateTopicValidationPolicy", "DeleteSchemaVersion",
        "SetCompatibilityMode",
    ):  # fmt: skip
        status, message = found[method]  # type: ignore[misc]
        assert status is Status.PERMISSION_DENIED, (method, status, message)
        assert method in message and "admin port" in message
    assert found["config"] == ("enforce", True), "the refused calls changed nothing"
    assert found["versions"] == [1] and found["check"] is True
    assert found["config_after_admin"] == "warn" and found["deleted"] is True
    assert not [line for line in broker.log_lines if "Traceback" in line]
