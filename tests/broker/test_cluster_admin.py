"""The cluster's admin API on a real cluster (three broker processes, etcd, moto's S3),
driven over gRPC as `danube-admin` drives it (issue 10): brokers and their leader, balance,
topics per broker, unloading a topic (its messages stay readable), draining a broker and
activating it again, a rebalance dry run, deleting a reliable topic with its objects and WAL.
Leader-only calls are sent to a follower's admin port: it forwards them to the leader."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

import danube.proto_compat  # noqa: F401  (this test decodes ClusterBalanceResponse)
from danube.client import DanubeClient, SubType
from danube.client.client import DispatchStrategy
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from danube.localcluster.s3_process import CREDENTIALS
from danube.proto import danube_admin as pb
from danube.runtime.object_store import ObjectStore
from tests.support import replicated

pytestmark = pytest.mark.slow

RELIABLE = pb.DispatchStrategy.Reliable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("cluster-admin")
    with LocalCluster(root, ClusterSettings(brokers=3)) as running:
        yield running


def broker_id(broker: BrokerProcess) -> str:
    match = re.search(r"event=broker_ready broker_id=(\S+)", broker.log_text())
    assert match is not None
    return match.group(1)


def call(broker: BrokerProcess, method: str, request: Any) -> Any:
    """One admin call on `broker`'s admin port."""

    async def run() -> Any:
        channel = Channel(*broker.admin_addr.rsplit(":", 1))
        try:
            for stub in (pb.BrokerAdminStub, pb.TopicAdminStub):
                if hasattr(stub, method):
                    return await getattr(stub(channel, timeout=120), method)(request)
            raise AssertionError(f"no admin method {method}")
        finally:
            channel.close()

    return asyncio.run(run())


def refused(broker: BrokerProcess, method: str, request: Any) -> GRPCError:
    with pytest.raises(GRPCError) as caught:
        call(broker, method, request)
    return caught.value


def wait(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def roles(cluster: LocalCluster) -> tuple[BrokerProcess, list[BrokerProcess]]:
    leader = call(cluster.brokers[0], "get_leader_broker", pb.Empty()).leader
    by_id = {broker_id(b): b for b in cluster.brokers}
    return by_id[leader], [b for i, b in by_id.items() if i != leader]


def topics_of(broker: BrokerProcess, target: str) -> list[str]:
    answer = call(broker, "list_broker_topics", pb.BrokerRequest(broker_id=target))
    return [t.name for t in answer.topics]


def where(cluster: LocalCluster, topic: str) -> str | None:
    asker = cluster.brokers[0]
    for broker in cluster.brokers:
        if topic in topics_of(asker, broker_id(broker)):
            return broker_id(broker)
    return None


def create(cluster: LocalCluster, *topics: str) -> None:
    for topic in topics:
        call(cluster.brokers[0], "create_topic", pb.NewTopicRequest(topic, None, RELIABLE))
    for topic in topics:
        wait(lambda t=topic: where(cluster, t), f"{topic} to be assigned")  # type: ignore[misc]


def status(cluster: LocalCluster, target: str) -> str:
    brokers = call(cluster.brokers[0], "list_brokers", pb.Empty()).brokers
    return next(b.broker_status for b in brokers if b.broker_id == target)


async def produce(urls: str, topic: str, count: int) -> None:
    async with DanubeClient(urls) as client:
        producer = await client.producer(
            topic, "admin-test", dispatch=DispatchStrategy.RELIABLE
        ).create()
        for i in range(count):
            await producer.send(f"m-{i}".encode())


async def subscribe(urls: str, topic: str) -> None:
    async with DanubeClient(urls) as client:
        consumer = await client.consumer(topic, "c", "sub", sub_type=SubType.EXCLUSIVE).subscribe()
        await consumer.close()


async def consume(urls: str, topic: str, count: int) -> list[str]:
    async with DanubeClient(urls) as client:
        consumer = await client.consumer(topic, "c", "sub", sub_type=SubType.EXCLUSIVE).subscribe()
        received = []
        async with asyncio.timeout(60):
            async for message in consumer:
                received.append(message.payload.decode())
                await consumer.ack(message)
                if len(received) == count:
                    break
        await consumer.close()
        return received


def objects(cluster: LocalCluster, topic: str) -> list[str]:
    os.environ.update(CREDENTIALS)
    store = ObjectStore(f"s3://{cluster.s3.bucket}/cluster", endpoint=cluster.s3.endpoint)
    namespace, local = topic.strip("/").split("/")
    listed = store.list(f"storage/topics/{namespace}/{local}/segments/")
    return [key for key, _ in listed if key.endswith(".wal")]  # not s3fs's directory entry


# -- tests ----------------------------------------------------------------------------------------


def test_every_broker_lists_the_same_three_brokers_and_one_leader(cluster: LocalCluster) -> None:
    answers = [call(b, "list_brokers", pb.Empty()).brokers for b in cluster.brokers]
    first = sorted((b.broker_id, b.broker_role, b.admin_addr, b.broker_status) for b in answers[0])
    assert len(first) == 3
    for answer in answers[1:]:
        assert (
            sorted((b.broker_id, b.broker_role, b.admin_addr, b.broker_status) for b in answer)
            == first
        )
    leaders = [b for b in answers[0] if b.broker_role == "Cluster_Leader"]
    assert len(leaders) == 1
    leader, _ = roles(cluster)
    assert leaders[0].broker_id == broker_id(leader)
    assert {b.broker_status for b in answers[0]} == {"active"}
    assert {b.admin_addr for b in answers[0]} == {f"http://{b.admin_addr}" for b in cluster.brokers}
    assert {b.broker_addr for b in answers[0]} == {b.url for b in cluster.brokers}


def test_balance_counts_the_topics_per_broker_on_leader_and_follower(
    cluster: LocalCluster,
) -> None:
    create(cluster, *(f"/default/bal-{i}" for i in range(6)))
    leader, followers = roles(cluster)
    balance = call(leader, "get_cluster_balance", pb.ClusterBalanceRequest())
    assert balance.broker_count == 3
    assert balance.assignment_strategy == "Fair"
    per_broker = {
        str(b.broker_id): len(topics_of(followers[0], broker_id(p)))
        for p in cluster.brokers
        for b in balance.brokers
        if str(b.broker_id) == broker_id(p)
    }
    assert {str(b.broker_id): b.topic_count for b in balance.brokers} == per_broker
    assert sum(per_broker.values()) >= 6
    loads = [b.load for b in balance.brokers]
    assert (balance.max_load, balance.min_load) == (max(loads), min(loads))
    assert balance.mean_load == pytest.approx(sum(loads) / len(loads))
    assert call(followers[0], "get_cluster_balance", pb.ClusterBalanceRequest()) == balance
    topics = call(followers[1], "list_broker_topics", pb.BrokerRequest(broker_id(leader))).topics
    assert len(topics) == per_broker[broker_id(leader)]
    assert all(t.delivery == "Reliable" for t in topics)


def test_an_unloaded_topic_moves_and_keeps_its_messages(cluster: LocalCluster) -> None:
    topic = "/default/moving"
    urls = ",".join(cluster.service_urls)
    create(cluster, topic)
    asyncio.run(subscribe(urls, topic))
    asyncio.run(produce(urls, topic, 20))
    before = where(cluster, topic)
    _, followers = roles(cluster)
    assert call(followers[0], "unload_topic", pb.TopicRequest(topic)).success
    after = wait(lambda: (w := where(cluster, topic)) != before and w, "the topic to move")
    assert after != before
    assert asyncio.run(consume(urls, topic, 20)) == [f"m-{i}" for i in range(20)]


def test_a_dead_letter_topic_on_another_broker_receives_the_poison(
    cluster: LocalCluster,
) -> None:
    """Issue 24: the subscription's broker forwards the dead letter as an internal producer
    (lookup, then the owner); the original is passed once the owner stored it, and a
    consumer of the dead-letter topic receives it with its `x-original-*` attributes."""
    urls = ",".join(cluster.service_urls)
    dead = "/default/poison-dlq"
    create(cluster, dead)
    for i in range(8):  # an origin topic another broker owns
        origin = f"/default/poison-{i}"
        create(cluster, origin)
        if where(cluster, origin) != where(cluster, dead):
            break
    else:
        pytest.skip("every topic landed on the dead-letter topic's broker")
    policy = pb.SubscriptionFailurePolicy(
        max_redelivery_count=0, ack_timeout_ms=30_000, base_redelivery_delay_ms=100,
        max_redelivery_delay_ms=1_000, dead_letter_topic=dead,
        poison_policy=pb.SubscriptionPoisonPolicy.DeadLetter,
    )  # fmt: skip
    request = pb.SetSubscriptionFailurePolicyRequest(origin, "sub", policy)
    call(cluster.brokers[0], "set_subscription_failure_policy", request)

    async def scenario() -> tuple[list[str], dict[str, str]]:
        async with DanubeClient(urls) as client:
            consumer = await client.consumer(
                origin, "c", "sub", sub_type=SubType.SHARED
            ).subscribe()
            await produce(urls, origin, 2)
            seen = []
            async with asyncio.timeout(60):
                async for message in consumer:
                    seen.append(message.payload.decode())
                    if message.payload == b"m-0":
                        await consumer.nack(message, reason="bad input")
                    else:
                        await consumer.ack(message)
                    if len(seen) == 2:
                        break
            await consumer.close()
            letters = await client.consumer(
                dead, "c", "audit", sub_type=SubType.SHARED, start="earliest"
            ).subscribe()
            async with asyncio.timeout(60):
                async for letter in letters:
                    await letters.ack(letter)
                    await letters.close()
                    return seen, {"payload": letter.payload.decode(), **letter.attributes}
        raise AssertionError("no dead letter")

    seen, letter = asyncio.run(scenario())
    assert sorted(seen) == ["m-0", "m-1"], "m-0 delivered once (no redelivery), then dead"
    assert letter["payload"] == "m-0"
    assert letter["x-original-topic"] == origin
    assert letter["x-original-subscription"] == "sub"
    assert letter["x-failure-reason"] == "bad input"


def test_draining_a_broker_moves_its_topics_away_until_it_is_activated(
    cluster: LocalCluster,
) -> None:
    _, followers = roles(cluster)
    drained = broker_id(followers[1])
    create(cluster, *(f"/default/drain-{i}" for i in range(6)))
    held = topics_of(followers[0], drained)
    assert held, "the broker to drain should hold topics"
    request = pb.UnloadBrokerRequest(drained, max_parallel=2, dry_run=True)
    dry = call(followers[0], "unload_broker", request)
    assert (dry.started, dry.total) == (False, len(held))
    assert topics_of(followers[0], drained) == held
    request = pb.UnloadBrokerRequest(drained, max_parallel=2, timeout_seconds=90)
    answer = call(followers[0], "unload_broker", request)
    assert (answer.started, answer.total, answer.succeeded) == (True, len(held), len(held))
    assert (answer.failed, answer.pending, answer.failed_topics) == (0, 0, [])
    assert topics_of(followers[0], drained) == []
    wait(lambda: status(cluster, drained) == "drained", "the broker to be drained")
    create(cluster, *(f"/default/after-drain-{i}" for i in range(3)))
    assert topics_of(followers[0], drained) == []
    activate = pb.ActivateBrokerRequest(drained, "")
    assert call(followers[0], "activate_broker", activate).success
    assert status(cluster, drained) == "active"
    create(cluster, "/default/after-activate")
    assert where(cluster, "/default/after-activate") == drained


def test_a_rebalance_dry_run_proposes_a_move_to_a_lighter_broker_and_makes_none(
    cluster: LocalCluster,
) -> None:
    _, followers = roles(cluster)
    empty = broker_id(followers[1])
    loads = {
        str(b.broker_id): b.topic_count
        for b in call(followers[0], "get_cluster_balance", pb.ClusterBalanceRequest()).brokers
    }
    assert loads[empty] == min(loads.values())
    answer = call(followers[0], "trigger_rebalance", pb.RebalanceRequest(dry_run=True))
    assert answer.success and answer.moves_executed == 0
    (move,) = answer.proposed_moves
    source, target = str(move.from_broker), str(move.to_broker)
    assert source != empty and loads[target] < loads[source]
    if target != empty:
        # a replicated topic moves to its in-sync follower when that one is lighter than
        # the source (issue 27: a hand-over, no upload), else to the emptiest broker
        holder = {broker_id(b): b for b in cluster.brokers}[source]
        assert target in replicated.describe(holder, move.topic_name).in_sync, (target, loads)
    assert move.topic_name in topics_of(followers[0], str(move.from_broker))
    time.sleep(1)
    assert move.topic_name in topics_of(followers[0], str(move.from_broker))


def test_deleting_a_reliable_topic_removes_its_objects_and_wal(cluster: LocalCluster) -> None:
    topic = "/default/doomed"
    urls = ",".join(cluster.service_urls)
    create(cluster, topic)
    asyncio.run(produce(urls, topic, 50))
    _, followers = roles(cluster)
    loads = {broker_id(b): b.log_text().count(f"event=topic_loaded topic={topic} ") for b in
             cluster.brokers}  # fmt: skip
    call(followers[0], "unload_topic", pb.TopicRequest(topic))  # seals and uploads the WAL
    wait(lambda: objects(cluster, topic), "the topic's objects")
    owner = wait(lambda: where(cluster, topic), "the topic to be assigned again")
    serving = {broker_id(b): b for b in cluster.brokers}[owner]

    def served() -> bool:  # a topic not loaded yet is released without an unload of any kind
        return serving.log_text().count(f"event=topic_loaded topic={topic} ") > loads[owner]

    wait(served, "the new owner to serve the topic")
    assert call(followers[0], "delete_topic", pb.TopicRequest(topic)).success
    # the objects go after the metadata, beyond the call (its deadline cannot cut them short)
    wait(lambda: objects(cluster, topic) == [], "the topic's objects to be deleted", timeout=20)
    assert where(cluster, topic) is None
    for broker in cluster.brokers:
        assert not (broker.data_dir / "wal" / "default" / "doomed").exists(), broker_id(broker)
    log = serving.log_text()
    assert f"event=topic_deleted_here topic={topic}" in log
    last_load = log.rindex(f"event=topic_loaded topic={topic} ")
    assert f"event=topic_unloaded topic={topic} " not in log[last_load:]  # dropped, not sealed
    asyncio.run(produce(urls, topic, 1))  # created again, empty

    async def earliest() -> str:
        async with DanubeClient(urls) as client:
            consumer = await client.consumer(topic, "c", "fresh", start="earliest").subscribe()
            async with asyncio.timeout(30):
                message = await consumer.receive()
            await consumer.close()
            return message.payload.decode()

    assert asyncio.run(earliest()) == "m-0"


def test_bad_requests_say_what_is_wrong(cluster: LocalCluster) -> None:
    _, followers = roles(cluster)
    asker = followers[0]
    error = refused(asker, "delete_topic", pb.TopicRequest("/default/bal-0-part-1"))
    assert error.status is Status.INVALID_ARGUMENT and "/default/bal-0" in str(error.message)
    assert refused(asker, "delete_topic", pb.TopicRequest("/default/nope")).status is (
        Status.NOT_FOUND
    )
    assert refused(asker, "unload_topic", pb.TopicRequest("/default/nope")).status is (
        Status.NOT_FOUND
    )
    assert refused(asker, "unload_broker", pb.UnloadBrokerRequest("")).status is (
        Status.INVALID_ARGUMENT
    )
    assert refused(asker, "unload_broker", pb.UnloadBrokerRequest("12345")).status is (
        Status.NOT_FOUND
    )
