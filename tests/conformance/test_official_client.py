"""The official Danube Python client (`danube-client` 0.5.0) against our broker process.

Every scenario script runs under the official client's own interpreter (see `harness.py`),
and the assertions here are about what that client observed, plus the broker side where it
matters. All topics are non-reliable: messages published while nobody is subscribed are lost
by design, so each scenario subscribes before it produces.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube.core.hashing import partition_for_key
from tests.conformance.harness import (
    ScenarioProcess,
    admin_create_topic,
    admin_delete_topic,
    run_scenario,
)
from tests.support.aio import unique_topic
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.slow, pytest.mark.conformance]

HEALTH_INTERVAL_S = 5.0
"""The official client's health-check period (`danube.health_check.HEALTH_CHECK_INTERVAL_SECS`)."""

BROKER_TROUBLE = re.compile(r"level=(ERROR|CRITICAL)|Traceback|event=messages_dropped")


@pytest.fixture(autouse=True)
def shared_broker_stays_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whatever the official client does to the shared broker must not make it log errors,
    tracebacks or dropped messages (all scenarios subscribe before producing)."""
    if "broker" not in request.fixturenames:
        yield
        return
    broker: BrokerProcess = request.getfixturevalue("broker")
    start = len(broker.log_lines)
    yield
    trouble = [line for line in broker.log_lines[start:] if BROKER_TROUBLE.search(line)]
    assert not trouble, "the broker logged trouble during this test:\n" + "\n".join(trouble)


def wait_messages(process: ScenarioProcess, count: int, timeout: float = 10.0) -> list[str]:
    """Payloads of the next `count` `message` events of a `consume.py` process."""
    return [process.wait_event("message", timeout)["payload"] for _ in range(count)]


def test_exclusive_delivers_all_in_order_byte_exact_and_acks(broker: BrokerProcess) -> None:
    topic = unique_topic("conf-excl")
    result = run_scenario("exclusive", broker.url, topic, 100, broker=broker)

    sent, received = result["sent"], result["received"]
    assert len(received) == 100
    assert [m["payload"] for m in received] == [m["payload"] for m in sent]
    assert [m["attributes"] for m in received] == [m["attributes"] for m in sent]
    assert {m["topic"] for m in received} == {topic}
    assert {m["producer_name"] for m in received} == {"conf-producer"}
    # Ack request ids are the delivered request ids (§16.4), so they must be distinct.
    assert len({m["request_id"] for m in received}) == 100
    assert all(result["ack_sent"]), "the client skipped acks: msg_id.topic_name did not match"
    assert result["ack_echo"]["answered"] == result["ack_echo"]["sent"]


def test_shared_two_consumers_split_evenly_exactly_once(broker: BrokerProcess) -> None:
    topic = unique_topic("conf-shared")
    result = run_scenario("shared", broker.url, topic, 60, broker=broker)

    first, second = result["received"]["worker-a"], result["received"]["worker-b"]
    assert sorted(first + second, key=int) == [str(i) for i in range(60)]
    assert len(first) == len(second) == 30, "strict round-robin splits 60 messages 30/30"
    assert first == sorted(first, key=int) and second == sorted(second, key=int)


def test_partitioned_producer_and_consumer_with_key_routing(broker: BrokerProcess) -> None:
    topic = unique_topic("conf-parts")
    keys = ["alpha", "beta", "gamma", "delta", "eu-1", "us-2", "order-17", "k"]
    expected_index = {key: partition_for_key(key, 3) for key in keys}
    assert set(expected_index.values()) == {0, 1, 2}, "the keys should cover every partition"
    partitions = [f"{topic}-part-{i}" for i in range(3)]

    result = run_scenario("partitioned", broker.url, topic, 3, 30, *keys, broker=broker)

    assert [p["topic"] for p in result["producers"]] == partitions
    assert [p["name"] for p in result["producers"]] == [f"conf-producer-{i}" for i in range(3)]
    assert len({p["id"] for p in result["producers"]}) == 3
    assert result["subscribed"] == partitions
    round_robin = result["round_robin"]
    assert sorted(m["payload"] for m in round_robin) == sorted(f"rr-{i}" for i in range(30))
    assert Counter(m["topic"] for m in round_robin) == {name: 10 for name in partitions}
    for message in round_robin:  # the client's round-robin starts at partition 0
        index = int(message["payload"].removeprefix("rr-")) % 3
        assert message["topic"] == partitions[index], message
    for name in partitions:  # order holds within each partition
        payloads = [int(m["payload"][3:]) for m in round_robin if m["topic"] == name]
        assert payloads == sorted(payloads)
    assert result["client_key_route"] == expected_index
    assert sorted(m["payload"] for m in result["keyed"]) == sorted(keys)
    for message in result["keyed"]:
        assert message["topic"] == partitions[expected_index[message["payload"]]], message
        assert message["routing_key"] == message["payload"]
    assert result["extra"] == []


def test_failover_standby_takes_over_after_active_is_killed(broker: BrokerProcess) -> None:
    topic = unique_topic("conf-failover")
    admin_create_topic(broker, topic)
    consume = (broker.url, topic, "conf-failover")
    with ScenarioProcess("consume", *consume, "active", "failover", broker=broker) as active:
        active.wait_event("subscribed")  # the first to subscribe is the active consumer
        with ScenarioProcess("consume", *consume, "standby", "failover", broker=broker) as standby:
            standby.wait_event("subscribed")
            run_scenario("produce", broker.url, topic, "conf-producer", "first", 10, broker=broker)
            assert wait_messages(active, 10) == [f"first-{i}" for i in range(10)]
            time.sleep(0.3)
            assert standby.drain("message") == [], "the standby must not receive while active"

            active.kill()
            time.sleep(0.5)  # the broker notices the dead connection and promotes the standby
            run_scenario("produce", broker.url, topic, "conf-producer", "second", 10, broker=broker)
            assert wait_messages(standby, 10) == [f"second-{i}" for i in range(10)]
            time.sleep(0.3)
            assert [e["payload"] for e in standby.drain("message")] == [
                f"second-{i}" for i in range(10)
            ], "nothing of the first batch (nor duplicates) may reach the standby"
            standby.send("stop")
            standby.result()


def test_health_check_ok_then_close_after_delete_and_consumer_resubscribes(
    broker: BrokerProcess,
) -> None:
    topic = unique_topic("conf-health")
    with ScenarioProcess("health", broker.url, topic, broker=broker) as process:
        ready = process.wait_event("ready")
        assert ready["before"] == {"producer": "OK", "consumer": "OK"}

        # The client resubscribes when its 5-second health check sees CLOSE, and gives up for
        # good if the topic is still missing then (§16.4). Delete 1 s after one of its checks,
        # so the scenario's immediate re-creation is well inside the window.
        since_first_check = time.time() - ready["subscribed_at"]
        time.sleep((1.0 - since_first_check) % HEALTH_INTERVAL_S)
        admin_delete_topic(broker, topic)
        process.send("deleted")
        after = process.wait_event("after_delete")
        assert (after["producer"], after["consumer"]) == ("CLOSE", "CLOSE")
        result = process.result(timeout=30)

    assert result["old_producer_send"].startswith("NOT_FOUND"), result["old_producer_send"]
    assert result["resubscribed"], f"the consumer did not resubscribe: {result}"
    assert result["new_consumer_id"] != result["consumer_id"]
    assert result["probe_received"], f"no message after resubscribing: {result}"
    assert result["batch_received"] == [f"after-{i}" for i in range(10)]
    assert result["health_new_consumer"] == "OK"


def test_create_producer_and_subscribe_are_idempotent_per_name(broker: BrokerProcess) -> None:
    topic = unique_topic("conf-idem")
    result = run_scenario("idempotent", broker.url, topic, broker=broker)

    producer_ids = result["producer_ids"]
    assert len(set(producer_ids.values())) == 1, producer_ids
    consumer_ids = result["consumer_ids"]
    assert len(set(consumer_ids.values())) == 1, consumer_ids
    assert result["after_takeover"] == [f"m-{i}" for i in range(5)]


def test_producer_and_consumer_survive_broker_restart(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    own = broker_factory(tmp_path / "restart-broker").start()
    topic = unique_topic("conf-restart")
    with ScenarioProcess("restart", own.url, topic, broker=own) as process:
        ready = process.wait_event("ready")
        assert own.stop(signal.SIGTERM) == 0, own.log_text()
        own.start()  # same ports, same data directory
        process.send("restarted")
        result = process.result(timeout=45)

    assert result["before_received"] == [f"before-{i}" for i in range(10)]
    assert result["reconnected"], f"the consumer never received again after the restart: {result}"
    assert result["producer_id_after"] == ready["producer_id"]
    assert result["consumer_id_after"] == ready["consumer_id"]
    assert result["batch_received"] == [f"after-{i}" for i in range(10)]
