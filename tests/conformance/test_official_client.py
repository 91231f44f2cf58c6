"""The official Danube Python client (`danube-client` 0.5.0) against our broker process.

Every scenario script runs under the official client's own interpreter (see `harness.py`),
and the assertions here are about what that client observed, plus the broker side where it
matters. On non-reliable topics messages published while nobody is subscribed are lost by
design, so those scenarios subscribe before they produce; the reliable ones (`reliable.py`,
`reliable_reconnect.py`) check at-least-once delivery, redelivery after a consumer closes or
is killed, and survival of a broker restart (graceful and SIGKILL).
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from danube.localcluster.broker_process import BrokerProcess
from danube.values.hashing import partition_for_key
from tests.conformance.harness import (
    ScenarioProcess,
    admin_create_topic,
    admin_delete_topic,
    run_scenario,
)
from tests.support.aio import unique_topic

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


# Reliable topics (issue 3 point 7d): the official producer asks for them with
# `with_dispatch_strategy(DispatchStrategy.RELIABLE)` (ProducerRequest.dispatch_strategy = 1)
# and acks with AckRequest{request_id, msg_id, subscription_name}; see scenarios/reliable.py.


def payloads_by_offset(received: list[dict[str, Any]]) -> dict[int, set[str]]:
    """Every payload seen at each topic offset (one each, or the WAL reused an offset)."""
    seen: dict[int, set[str]] = {}
    for message in received:
        seen.setdefault(message["offset"], set()).add(message["payload"])
    return seen


@pytest.mark.parametrize("sub_type", ["exclusive", "shared"])
def test_reliable_roundtrip_dense_offsets_byte_exact_and_acked(
    broker: BrokerProcess, sub_type: str
) -> None:
    topic = unique_topic("conf-reliable")
    result = run_scenario(
        "reliable", "roundtrip", broker.url, topic, 200, sub_type, timeout=60, broker=broker
    )

    received, sent = result["received"], result["sent"]
    assert len(received) == 200
    if sub_type == "exclusive":  # Exclusive delivers in offset order (invariant 3)
        assert [m["topic_offset"] for m in received] == list(range(200))
    in_offset_order = sorted(received, key=lambda m: m["topic_offset"])
    assert [m["topic_offset"] for m in in_offset_order] == list(range(200)), "offsets not dense"
    assert [m["payload"] for m in in_offset_order] == [m["payload"] for m in sent]
    assert [m["attributes"] for m in in_offset_order] == [m["attributes"] for m in sent]
    # The broker keeps the producer's request ids (the client acks with them) and echoes them.
    assert [m["request_id"] for m in in_offset_order] == result["send_replies"]
    assert {m["topic"] for m in received} == {topic}
    assert {m["producer_id"] for m in received} == {result["producer_id"]}
    assert {m["producer_name"] for m in received} == {"conf-reliable-producer"}
    assert all(result["ack_sent"]), "the client skipped acks: msg_id.topic_name did not match"
    assert result["ack_echo"]["answered"] == result["ack_echo"]["sent"]
    assert result["extra"] == [], "a message came twice although every one was acked in time"
    assert result["after_takeover"] == [], "acked messages came back after a takeover"
    mismatch = result["mismatch"]
    assert mismatch["non_reliable_on_reliable"].startswith("FAILED_PRECONDITION"), mismatch
    assert mismatch["reliable_on_non_reliable"].startswith("FAILED_PRECONDITION"), mismatch


def test_reliable_unacked_messages_come_back_after_consumer_closes(broker: BrokerProcess) -> None:
    topic = unique_topic("conf-rel-redeliver")
    result = run_scenario("reliable", "redeliver", broker.url, topic, 20, 4, broker=broker)

    assert result["first_offsets"] == list(range(20))
    unacked = [f"m-{i}" for i in range(0, 20, 4)]
    assert result["unacked"] == unacked
    # Exclusive redelivers in offset order, and only what was not acked (invariants 3 and 4).
    assert result["redelivered"] == [{"payload": p, "offset": int(p[2:])} for p in unacked]
    assert result["consumer_ids"][0] == result["consumer_ids"][1], "same name, same consumer"
    assert result["more"] == [{"payload": f"more-{i}", "offset": 20 + i} for i in range(5)]
    assert result["extra"] == []


@pytest.mark.parametrize(
    ("sub_type", "resumer"), [("exclusive", "conf-holder"), ("shared", "conf-resumer")]
)
def test_reliable_unacked_messages_come_back_after_consumer_process_is_killed(
    broker: BrokerProcess, sub_type: str, resumer: str
) -> None:
    """SIGKILL: the client cannot close anything. Exclusive: the application restarts with the
    same consumer name; Shared: another consumer of the subscription takes the messages."""
    topic = unique_topic("conf-rel-crash")
    subscription = (topic, "conf-crash", sub_type)
    with ScenarioProcess(
        "reliable", "hold", broker.url, *subscription, "conf-holder", 20, 3, broker=broker
    ) as holder:
        holding = holder.wait_event("holding", timeout=30)
        holder.kill()
    unacked = [f"m-{i}" for i in range(0, 20, 3)]
    assert holding["unacked"] == unacked
    assert holding["first_offsets"] == list(range(20))

    result = run_scenario(
        "reliable", "resume", broker.url, *subscription, resumer, len(unacked), 5, broker=broker
    )
    redelivered = result["redelivered"]
    if sub_type == "exclusive":
        assert [m["payload"] for m in redelivered] == unacked
        assert result["consumer_id"] == holding["consumer_ids"][0]
    else:
        assert sorted(m["payload"] for m in redelivered) == sorted(unacked)
        assert result["consumer_id"] != holding["consumer_ids"][0]
    assert all(m["offset"] == int(m["payload"][2:]) for m in redelivered), redelivered
    assert result["more"] == [{"payload": f"more-{i}", "offset": 20 + i} for i in range(5)]
    assert result["extra"] == [], "an acked message came back, or one came twice"


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_reliable_producer_and_consumer_survive_broker_restart(
    broker_factory: type[BrokerProcess], tmp_path: Path, stop_signal: signal.Signals
) -> None:
    own = broker_factory(tmp_path / "reliable-restart-broker").start()
    topic = unique_topic("conf-rel-restart")
    before, acked, after = 20, 15, 20
    with ScenarioProcess(
        "reliable_reconnect", own.url, topic, before, acked, after, broker=own
    ) as process:
        ready = process.wait_event("ready", timeout=30)
        first_life = list(own.log_lines)
        code = own.stop(stop_signal)
        assert code == (0 if stop_signal == signal.SIGTERM else -signal.SIGKILL), own.log_text()
        own.start()  # same ports, same data directory
        process.send("restarted")
        result = process.result(timeout=90)

    assert result["before"] == [{"payload": f"before-{i}", "offset": i} for i in range(before)]
    assert result["producer_id_after"] == ready["producer_id"]
    assert result["consumer_id_after"] == ready["consumer_id"]
    assert result["sent_after"] == [f"after-{i}" for i in range(after)]
    received = result["after_restart"]
    assert result["all_seen"], f"not everything unacked or sent after the restart came: {result}"
    # One offset names one message, across the restart too (invariant 2): offsets continue.
    expected_at = {i: f"before-{i}" for i in range(before)}
    expected_at |= {before + i: f"after-{i}" for i in range(after)}
    by_offset = payloads_by_offset(received)
    assert all(by_offset[o] == {expected_at.get(o)} for o in by_offset), by_offset
    first_seen = list(dict.fromkeys(m["offset"] for m in received))
    if stop_signal == signal.SIGTERM:
        # A graceful stop persists the cursor: exactly the unacked rest, then the new ones,
        # in offset order, nothing acked again (invariants 3 and 4).
        assert [m["offset"] for m in received] == list(range(acked, before + after)), received
    else:
        # After a crash the cursor may lag (at-least-once): redelivery restarts at or before
        # the first unacked offset and runs in offset order to the end.
        assert first_seen == list(range(first_seen[0], before + after)), received
        assert first_seen[0] <= acked
    trouble = [line for line in first_life + own.log_lines if BROKER_TROUBLE.search(line)]
    assert not trouble, "the broker logged trouble:\n" + "\n".join(trouble)
