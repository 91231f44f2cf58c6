"""`danube-admin` as an operator runs it against the shared standalone broker: namespaces,
topics, subscriptions, policies and schemas, tables and JSON, and an exit status and one
readable line for every failure (issue 10, points 2 and 5)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from danube.client import DanubeClient, DanubeClientError, DispatchStrategy
from danube.client.connection import RetryPolicy
from danube.localcluster.broker_process import BrokerProcess
from tests.support.aio import run as aio_run

pytestmark = pytest.mark.slow
ADMIN = Path(sys.executable).parent / "danube-admin"


def admin(broker: BrokerProcess | None, *args: str) -> subprocess.CompletedProcess[str]:
    endpoint = ["--endpoint", f"http://{broker.admin_addr}"] if broker is not None else []
    return subprocess.run(
        [str(ADMIN), *endpoint, *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip


def ok(broker: BrokerProcess, *args: str) -> str:
    done = admin(broker, *args)
    assert done.returncode == 0, f"{args}: exit {done.returncode}: {done.stderr}"
    return done.stdout


def as_json(broker: BrokerProcess, *args: str) -> dict[str, object]:
    found = json.loads(ok(broker, *args, "--output", "json"))
    assert isinstance(found, dict)
    return found


def refused(broker: BrokerProcess | None, *args: str, code: int = 1) -> str:
    """The one-line error of a command that must fail with exit status `code`."""
    done = admin(broker, *args)
    assert done.returncode == code, f"{args}: exit {done.returncode}: {done.stdout}{done.stderr}"
    assert "Traceback" not in done.stderr
    if code != 2:
        assert done.stderr.startswith("danube-admin: error: ") and done.stderr.count("\n") == 1
    return done.stderr


def row(table: str, first: str) -> list[str]:
    """The cells of the table row that starts with `first`."""
    (found,) = [line.split() for line in table.splitlines() if line.split()[:1] == [first]]
    return found


def namespace() -> str:
    return f"adm-{uuid.uuid4().hex[:8]}"


def test_namespace_lifecycle(broker: BrokerProcess) -> None:
    ns = namespace()
    assert ok(broker, "namespaces", "create", ns).strip() == f"Created namespace {ns}"
    assert ns in as_json(broker, "brokers", "namespaces")["namespaces"]  # type: ignore[operator]
    assert ns in ok(broker, "brokers", "namespaces").split()

    policies = as_json(broker, "namespaces", "policies", ns)
    assert policies["max_producers_per_topic"] == 0
    assert row(ok(broker, "namespaces", "policies", ns), "max_producers_per_topic") == [
        "max_producers_per_topic",
        "unlimited",
    ]

    changed = as_json(broker, "namespaces", "set-policies", ns, "--max-consumers-per-topic", "3")
    assert changed["max_consumers_per_topic"] == 3
    again = as_json(broker, "namespaces", "policies", ns)
    assert again["max_consumers_per_topic"] == 3
    assert again["max_producers_per_topic"] == 0

    assert "no topics" in ok(broker, "namespaces", "topics", ns)
    assert "ALREADY_EXISTS" in refused(broker, "namespaces", "create", ns)
    assert ok(broker, "namespaces", "delete", ns).strip() == f"Deleted namespace {ns}"
    assert ns not in as_json(broker, "brokers", "namespaces")["namespaces"]  # type: ignore[operator]
    gone = refused(broker, "namespaces", "policies", ns)
    assert f"policies of namespace {ns}: NOT_FOUND" in gone


def test_topic_lifecycle_plain_and_partitioned(broker: BrokerProcess) -> None:
    ns = namespace()
    ok(broker, "namespaces", "create", ns)
    created = ok(broker, "topics", "create", "plain", "--namespace", ns,
                 "--dispatch-strategy", "reliable")  # fmt: skip
    assert created.strip() == f"Created topic /{ns}/plain (reliable)"
    ok(broker, "topics", "create", f"/{ns}/parts", "--partitions", "2")

    listed = as_json(broker, "topics", "list", "--namespace", ns)["topics"]
    assert {t["name"]: t["delivery"] for t in listed} == {  # type: ignore[attr-defined, union-attr]
        f"/{ns}/plain": "Reliable",
        f"/{ns}/parts-part-0": "NonReliable",
        f"/{ns}/parts-part-1": "NonReliable",
    }
    table = ok(broker, "topics", "list", "-n", ns).splitlines()
    assert table[0].split() == ["TOPIC", "BROKER_ID", "DELIVERY"]
    assert len(table) == 4

    described = as_json(broker, "topics", "describe", f"/{ns}/plain")
    assert (described["name"], described["delivery"]) == (f"/{ns}/plain", "Reliable")
    assert described["subscriptions"] == []
    assert "delivery:" in ok(broker, "topics", "describe", "plain", "-n", ns)
    assert "no subscriptions" in ok(broker, "topics", "subscriptions", f"/{ns}/plain")

    refused(broker, "topics", "delete", f"/{ns}/parts-part-0")
    assert ok(broker, "topics", "delete", f"/{ns}/parts").strip() == f"Deleted topic /{ns}/parts"
    ok(broker, "topics", "delete", f"/{ns}/plain")
    assert as_json(broker, "topics", "list", "-n", ns)["topics"] == []
    assert "no topics on namespace" in ok(broker, "topics", "list", "-n", ns)
    ok(broker, "namespaces", "delete", ns)


def test_subscriptions_and_unsubscribe(broker: BrokerProcess) -> None:
    ns = namespace()
    ok(broker, "namespaces", "create", ns)
    topic = f"/{ns}/subs"
    ok(broker, "topics", "create", topic, "--dispatch-strategy", "reliable")

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            consumer = await client.consumer(topic, "c1", "sub-a").subscribe()
            listed = await asyncio.to_thread(as_json, broker, "topics", "subscriptions", topic)
            assert listed["subscriptions"] == ["sub-a"]
            attached = await asyncio.to_thread(
                refused, broker, "topics", "unsubscribe", topic, "-s", "sub-a"
            )
            assert "sub-a" in attached
            await consumer.close()
            done = await asyncio.to_thread(
                ok, broker, "topics", "unsubscribe", topic, "-s", "sub-a"
            )
            assert done.strip() == f"Removed subscription sub-a from {topic}"

    aio_run(scenario)
    assert as_json(broker, "topics", "subscriptions", topic)["subscriptions"] == []


def test_failure_policy_and_dispatch_config_round_trip(broker: BrokerProcess) -> None:
    ns = namespace()
    ok(broker, "namespaces", "create", ns)
    topic = f"/{ns}/policy"
    ok(broker, "topics", "create", topic, "--dispatch-strategy", "reliable")
    ok(broker, "topics", "set-failure-policy", topic, "-s", "s1",
       "--max-redelivery-count", "0", "--ack-timeout-ms", "5000",
       "--base-redelivery-delay-ms", "100", "--max-redelivery-delay-ms", "2000",
       "--backoff-strategy", "fixed", "--poison-policy", "block")  # fmt: skip
    found = as_json(broker, "topics", "get-failure-policy", topic, "-s", "s1")
    assert found["failure_policy"] == {
        "max_redelivery_count": 0,
        "ack_timeout_ms": 5000,
        "base_redelivery_delay_ms": 100,
        "max_redelivery_delay_ms": 2000,
        "backoff_strategy": "fixed",
        "dead_letter_topic": None,
        "poison_policy": "block",
    }
    assert "poison_policy:" in ok(broker, "topics", "get-failure-policy", topic, "-s", "s1")

    ok(broker, "topics", "set-dispatch-config", topic, "-s", "s1", "--max-unacked-messages", "7")
    config = as_json(broker, "topics", "get-dispatch-config", topic, "-s", "s1")
    assert config == {"dispatch_config": {"max_unacked_messages": 7}}
    refused(broker, "topics", "set-dispatch-config", topic, "-s", "s1",
            "--max-unacked-messages", "10001")  # fmt: skip


def test_a_cleared_failure_policy_gives_the_namespace_default_back(broker: BrokerProcess) -> None:
    """`topics clear-failure-policy` (ours, PolicyAdmin/ClearSubscriptionFailurePolicy): the
    subscription's own policy is gone and it follows the namespace's default again."""
    ns = namespace()
    ok(broker, "namespaces", "create", ns)
    ok(broker, "namespaces", "set-policies", ns, "--failure-policy",
       '{"max_redelivery_count": 1, "poison_policy": "drop"}')  # fmt: skip
    topic = f"/{ns}/cleared"
    ok(broker, "topics", "create", topic, "--dispatch-strategy", "reliable")
    ok(broker, "topics", "set-failure-policy", topic, "-s", "s1",
       "--max-redelivery-count", "3", "--ack-timeout-ms", "5000",
       "--base-redelivery-delay-ms", "100", "--max-redelivery-delay-ms", "2000",
       "--poison-policy", "block")  # fmt: skip
    assert as_json(broker, "topics", "get-failure-policy", topic, "-s", "s1")["failure_policy"]
    cleared = ok(broker, "topics", "clear-failure-policy", topic, "-s", "s1")
    assert cleared.strip() == (
        f"Cleared the failure policy of s1 on {topic}: it follows the namespace's default"
    )
    found = as_json(broker, "topics", "get-failure-policy", topic, "-s", "s1")
    assert found["failure_policy"] is None
    shown = ok(broker, "topics", "get-failure-policy", topic, "-s", "s1")
    assert "no failure policy stored" in shown
    again = as_json(broker, "topics", "clear-failure-policy", topic, "-s", "s1")
    assert again == {"cleared": False}
    missing = refused(broker, "topics", "clear-failure-policy", f"/{ns}/none", "-s", "s1")
    assert "NOT_FOUND" in missing


def test_topic_policies_limit_producers(broker: BrokerProcess) -> None:
    ns = namespace()
    ok(broker, "namespaces", "create", ns)
    topic = f"/{ns}/limited"
    ok(broker, "topics", "create", topic)
    set_out = as_json(broker, "topics", "set-policies", topic, "--max-producers-per-topic", "1")
    assert set_out["overridden"] == ["max_producers_per_topic"]
    assert set_out["policies"]["max_producers_per_topic"] == 1  # type: ignore[index]
    table = ok(broker, "topics", "get-policies", topic)
    assert row(table, "max_producers_per_topic") == ["max_producers_per_topic", "1", "topic"]
    assert row(table, "max_consumers_per_topic")[2] == "namespace"

    async def scenario() -> str:
        # The refusal is RESOURCE_EXHAUSTED, which clients retry: once is enough here.
        retry = RetryPolicy(max_retries=1, min_elapsed_s=0)
        async with DanubeClient(broker.url, retry=retry) as client:
            await client.producer(topic, "p1", batching=None).create()
            try:
                await client.producer(topic, "p2", batching=None).create()
            except DanubeClientError as error:
                return str(error)
            raise AssertionError("a second producer was accepted over the limit")

    message = aio_run(scenario)
    assert "RESOURCE_EXHAUSTED" in message and "max_producers_per_topic" in message, message

    cleared = as_json(broker, "topics", "clear-policies", topic)
    assert cleared["overridden"] == []
    assert cleared["policies"]["max_producers_per_topic"] == 0  # type: ignore[index]


def test_schemas_register_get_versions(broker: BrokerProcess, tmp_path: Path) -> None:
    subject = f"adm-{uuid.uuid4().hex[:8]}"
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}}))
    first = ok(broker, "schemas", "register", subject, "--schema-type", "json_schema",
               "--file", str(v1))  # fmt: skip
    assert f"{subject}: registered as version 1" in first
    second = as_json(broker, "schemas", "register", subject, "--schema-type", "json_schema",
                     "--schema", '{"type": "object"}')  # fmt: skip
    assert (second["version"], second["is_new_version"]) == (2, True)

    latest = as_json(broker, "schemas", "get", "--subject", subject)
    assert (latest["subject"], latest["version"]) == (subject, 2)
    first_version = as_json(broker, "schemas", "get", "--id", str(latest["schema_id"]),
                            "--version", "1")  # fmt: skip
    assert json.loads(first_version["schema_definition"]) == json.loads(v1.read_text())  # type: ignore[arg-type]
    shown = ok(broker, "schemas", "get", "--subject", subject)
    assert f"subject {subject} version 2" in shown

    versions = as_json(broker, "schemas", "versions", subject)["versions"]
    assert [v["version"] for v in versions] == [1, 2]  # type: ignore[attr-defined, union-attr]
    assert (
        as_json(broker, "schemas", "get-compatibility", subject)["compatibility_mode"] == "backward"
    )
    assert subject in ok(broker, "schemas", "list-subjects")
    assert "--confirm" in refused(broker, "schemas", "delete", subject, "--version", "1", code=2)
    ok(broker, "schemas", "delete", subject, "--version", "1", "--confirm")
    versions = as_json(broker, "schemas", "versions", subject)["versions"]
    assert [v["version"] for v in versions] == [2]  # type: ignore[attr-defined, union-attr]


def test_brokers_list_and_leader_of_a_standalone_broker(broker: BrokerProcess) -> None:
    brokers = as_json(broker, "brokers", "list")["brokers"]
    assert len(brokers) == 1  # type: ignore[arg-type]
    (only,) = brokers  # type: ignore[misc]
    assert only["broker_addr"] == broker.url and only["broker_status"] == "active"
    assert ok(broker, "brokers", "leader-broker").strip() == only["broker_id"]


def test_a_replication_factor_needs_cluster_mode(broker: BrokerProcess) -> None:
    for args in (("namespaces", "replication-factor", "default", "--set", "2"),
                 ("topics", "replication-factor", "/default/x")):  # fmt: skip
        assert "needs cluster mode" in refused(broker, *args)
    usage = refused(None, "topics", "replication-factor", "/default/x", "--set", "0", code=2)
    assert "expected 1 or more" in usage


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_bad_input_gets_a_clear_error_and_its_own_exit_status(broker: BrokerProcess) -> None:
    unknown = namespace()
    error = refused(broker, "namespaces", "topics", unknown)
    assert unknown in error and "NOT_FOUND" in error

    port = _closed_port()
    down = refused(None, "--endpoint", f"http://127.0.0.1:{port}", "brokers", "list", code=3)
    assert f"127.0.0.1:{port}" in down and "DANUBE_ADMIN_ENDPOINT" in down

    usage = refused(broker, "topics", "create", "t", "--partitions", "many", code=2)
    assert "usage: danube-admin topics create" in usage and "--partitions" in usage

    raft = refused(broker, "cluster", "status")
    assert "UNIMPLEMENTED" in raft and "etcd" in raft


def test_completion_prints_a_bash_script() -> None:
    done = admin(None, "completion", "bash")
    assert done.returncode == 0
    assert "complete" in done.stdout and "set-failure-policy" in done.stdout
    assert "~/.local/share" in admin(None, "completion", "--help").stdout


def test_an_operator_lists_skips_and_releases_blocked_messages(broker: BrokerProcess) -> None:
    """Block with max_redelivery_count 0: a nacked message is blocked at once; `topics
    blocked` lists it, `release` sends it again (blocked again on its next nack), `skip`
    drops it and the subscription moves past it (ours: Danube has no such commands)."""
    ns = namespace()
    ok(broker, "namespaces", "create", ns)
    topic = f"/{ns}/poisoned"
    ok(broker, "topics", "create", topic, "--dispatch-strategy", "reliable")
    ok(broker, "topics", "set-failure-policy", topic, "-s", "s1",
       "--max-redelivery-count", "0", "--ack-timeout-ms", "30000",
       "--base-redelivery-delay-ms", "0", "--max-redelivery-delay-ms", "0",
       "--poison-policy", "block")  # fmt: skip

    def blocked() -> list[int]:
        found = as_json(broker, "topics", "blocked", topic, "-s", "s1")["offsets"]
        assert isinstance(found, list)
        return found

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            producer = client.producer(topic, "p", dispatch=DispatchStrategy.RELIABLE)
            await producer.create()
            consumer = await client.consumer(topic, "c", "s1").subscribe()
            fine: list[bytes] = []

            async def poison() -> None:
                """The next delivery of the poison (any other message is acknowledged)."""
                while True:
                    message = await asyncio.wait_for(consumer.receive(), 10)
                    if message.payload == b"poison":
                        await consumer.nack(message)
                        return
                    fine.append(message.payload)
                    await consumer.ack(message)

            await producer.send(b"poison")
            await poison()
            assert await asyncio.to_thread(blocked) == [0]
            await producer.send(b"fine")
            released = await asyncio.to_thread(
                ok, broker, "topics", "release", topic, "-s", "s1", "--offset", "0"
            )
            assert released.strip() == f"Released offset 0 of s1 on {topic}"
            await poison()  # released: delivered again, and blocked again by its nack
            assert await asyncio.to_thread(blocked) == [0]
            skipped = await asyncio.to_thread(
                as_json, broker, "topics", "skip", topic, "-s", "s1", "--offset", "0"
            )
            assert skipped == {"resolved": True}
            while not fine:
                message = await asyncio.wait_for(consumer.receive(), 10)
                fine.append(message.payload)
                await consumer.ack(message)
            assert fine == [b"fine"]
            assert await asyncio.to_thread(blocked) == []
            none = await asyncio.to_thread(
                ok, broker, "topics", "skip", topic, "-s", "s1", "--offset", "0"
            )
            assert "is not blocked" in none
            await consumer.close()

    aio_run(scenario)
