"""The official client's SchemaRegistryClient (danube-client 0.5.0) against our broker:
every RPC it offers, end to end, the answers it sees (issue 8, point 1); the calls that
change a subject's rules or a topic's binding on the admin port (issue 20). The scenario runs
under the official client's interpreter (harness.py)."""

from __future__ import annotations

import pytest

from danube.localcluster.broker_process import BrokerProcess
from tests.conformance.harness import run_scenario
from tests.support.aio import unique_topic

pytestmark = [pytest.mark.slow, pytest.mark.conformance]


def test_the_official_schema_client_works_end_to_end(broker: BrokerProcess) -> None:
    prefix = unique_topic("schemas").rpartition("/")[2]
    admin_url = f"http://{broker.admin_addr}"
    result = run_scenario("schema_registry", broker.url, prefix, admin_url, broker=broker)

    registered = result["registered"]
    schema_id = result["v1_id"]
    assert result["v1_again_id"] == result["v2_id"] == schema_id  # one id per subject
    assert result["versions_after_repeat"] == [1]  # identical: no new version
    assert result["versions_after_v2"] == [1, 2]

    breaking = result["check_breaking"]
    assert not breaking["compatible"]
    assert any("/fields/id" in e for e in breaking["errors"])  # long read as int
    assert any("due" in e for e in breaking["errors"])  # new field without a default
    assert result["check_breaking_under_none"] == {"compatible": True, "errors": []}
    refused = result["register_breaking"]
    assert refused["code"] == "FAILED_PRECONDITION" and "under backward" in refused["details"]

    latest = result["latest"]
    assert latest["version"] == 2 and latest["schema_type"] == "avro"
    assert latest["definition"] == registered["v2"]  # as registered, no envelope
    assert latest["fingerprint"].startswith("sha256:")
    assert result["by_id_v1"]["definition"] == registered["v1"]
    assert result["by_id_v1"]["subject"].endswith("-orders")
    assert result["by_id_latest"]["version"] == 2

    # changing a subject's rules or a topic's binding: the admin port only (issue 20)
    for step in (
        "set_none_on_client_port", "delete_on_client_port", "configure_on_client_port",
        "update_on_client_port",
    ):  # fmt: skip
        refused = result[step]
        assert refused is not None and refused["code"] == "PERMISSION_DENIED", (step, refused)
        assert "admin port" in refused["details"]
    assert result["set_none"][0] is True
    assert result["versions_after_v3"] == [1, 2, 3]
    assert result["delete_v3"][0] is True
    assert result["versions_after_delete"] == [1, 2]

    assert len({schema_id, result["json_id"], result["proto_id"]}) == 3
    assert result["json_latest"]["schema_type"] == "json_schema"
    assert result["json_latest"]["definition"] == registered["json"]
    assert result["configure"][0] is True
    assert result["topic_config"] == {
        "subject": result["json_latest"]["subject"], "policy": "enforce", "payloads": True,
        "schema_id": result["json_id"],
    }  # fmt: skip
    refused = result["send_without_schema"]
    assert refused["code"] == "INVALID_ARGUMENT" and "names no schema id" in refused["details"]
    assert result["update"][0] is True and result["send_under_warn"] is None

    # a producer with a schema subject: its messages carry the resolved id and version to
    # consumers, the unbound topic took the subject (warn), another subject is refused
    assert result["typed_message"] == {"schema_id": schema_id, "schema_version": 2}
    assert result["typed_config"] == "warn"
    other = result["other_subject"]
    assert other is not None and other["code"] == "FAILED_PRECONDITION"
    assert "is bound to schema subject" in other["details"]
    assert result["proto_latest"]["schema_type"] == "protobuf"
    assert result["proto_latest"]["definition"] == registered["proto"]

    bad = result["bad_proto"]
    assert bad["code"] == "INVALID_ARGUMENT" and "schema.proto:1:" in bad["details"]
    assert result["unknown_subject"]["code"] == "NOT_FOUND"
    assert result["unknown_version"]["code"] == "NOT_FOUND"
    assert "live versions: 1, 2" in result["unknown_version"]["details"]
