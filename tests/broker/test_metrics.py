"""The metrics endpoint of a real broker process, scraped over HTTP while our client produces
and consumes on a reliable and a non-reliable topic: every counter moves by what the
scenario did, the backlog gauge rises and falls, and the health endpoints answer."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest

from danube.client import DanubeClient, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from danube.values.config import DispatchStrategy
from tests.support.aio import receive_n, run, unique_topic
from tests.support.metrics import Samples, http_get, scrape

pytestmark = pytest.mark.slow

RELIABLE_PAYLOADS = [b"a" * 10, b"b" * 200, b"c" * 3000, b"d", b"e" * 50]
PLAIN_PAYLOADS = [b"w" * 7, b"x" * 70, b"y" * 700, b"z" * 7000]


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def _eventually(url: str, check: str, name: str, expected: float, **labels: str) -> Samples:
    """Scrapes until the sample has the value (a streaming call is counted when its stream
    ends, a moment after the client closed it)."""
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(url)
        if samples.value(name, **labels) == expected or time.monotonic() > deadline:
            assert samples.value(name, **labels) == expected, (check, samples.matching(name))
            return samples
        time.sleep(0.1)


def test_counters_and_gauges_follow_a_produce_and_consume_session(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path / "data").start()
    url = broker.metrics_url
    reliable, plain = unique_topic("metrics-rel"), unique_topic("metrics-plain")
    before = scrape(url)
    during: dict[str, Samples] = {}

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(
                reliable, "p-rel", dispatch=DispatchStrategy.RELIABLE, batching=None
            ).create()
            consumer = await client.consumer(
                reliable, "c-rel", "s-rel", sub_type=SubType.EXCLUSIVE
            ).subscribe()
            for payload in RELIABLE_PAYLOADS:
                await producer.send(payload)
            got = await receive_n(consumer, len(RELIABLE_PAYLOADS), ack=False)
            during["unacked"] = await asyncio.to_thread(scrape, url)
            await consumer.nack(got[0], delay_ms=0)
            again = await receive_n(consumer, len(RELIABLE_PAYLOADS), timeout=15, ack=False)
            assert [m.offset for m in again] == [m.offset for m in got]
            for message in again:
                await consumer.ack(message)

            plain_producer = await client.producer(plain, "p-plain").create()
            plain_consumer = await client.consumer(
                plain, "c-plain", "s-plain", sub_type=SubType.SHARED
            ).subscribe()
            for payload in PLAIN_PAYLOADS:
                await plain_producer.send(payload)
            await receive_n(plain_consumer, len(PLAIN_PAYLOADS))
            during["open"] = await asyncio.to_thread(scrape, url)

    run(scenario)
    unacked, open_ = during["unacked"], during["open"]
    assert unacked.value("danube_subscription_lag_messages", topic=reliable) == 5
    lag = open_.matching("danube_subscription_lag_messages", topic=reliable)
    assert [sample.value for sample in lag] == [0], "the backlog is there, and empty"
    assert open_.value("danube_topic_active_producers", topic=reliable) == 1
    assert open_.value("danube_topic_active_consumers", topic=plain) == 1
    assert open_.value("danube_topic_active_subscriptions", topic=reliable) == 1
    assert open_.value("danube_subscription_active_consumers", subscription="s-plain") == 1
    assert open_.value("danube_broker_topics_owned") == 2

    after = _eventually(
        url,
        "the batched publish stream is counted once it ends (our client cancels it)",
        "danube_broker_rpc_total",
        1,
        method="PublishBatches",
    )
    assert after.value("danube_topic_messages_in_total", topic=reliable) == 5
    assert after.value("danube_topic_bytes_in_total", topic=reliable) == sum(
        map(len, RELIABLE_PAYLOADS)
    )
    assert after.value("danube_topic_messages_in_total", topic=plain) == 4
    assert after.value("danube_topic_bytes_in_total", topic=plain) == sum(map(len, PLAIN_PAYLOADS))
    # five first deliveries and the redelivery of all five (Exclusive restarts at the cursor)
    assert after.value("danube_consumer_messages_out_total", topic=reliable) == 10
    assert after.value("danube_consumer_messages_out_total", topic=plain) == 4
    assert after.value("danube_consumer_bytes_out_total", topic=plain) > sum(
        map(len, PLAIN_PAYLOADS)
    )
    assert after.value("danube_subscription_nack_total", topic=reliable, subscription="s-rel") == 1
    assert (
        after.value("danube_subscription_redelivery_total", topic=reliable, subscription="s-rel")
        == 5
    )
    for topic, count in ((reliable, 5), (plain, 4)):
        assert after.value("danube_producer_send_total", topic=topic, result="ok") == count
        assert after.value("danube_topic_message_size_bytes_count", topic=topic) == count
    assert after.value("danube_producer_send_latency_ms_count", topic=reliable) == 5
    assert after.value("danube_producer_send_latency_ms_count", topic=plain) >= 1
    rpc = "danube_broker_rpc_total"
    assert _delta(before, after, rpc, method="SendMessage", result="OK") == 5
    assert _delta(before, after, rpc, method="Nack", result="OK") == 1
    acks = sum(_delta(before, after, rpc, method=m, result="OK") for m in ("Ack", "AckBatch"))
    assert acks == 9, [s for s in after.matching(rpc) if "Ack" in s.labels["method"]]
    assert _delta(before, after, rpc, method="CreateProducer", result="OK") == 2
    assert _delta(before, after, "danube_wal_append_total") == 5
    assert _delta(before, after, "danube_wal_append_bytes_total") > sum(map(len, RELIABLE_PAYLOADS))
    assert _delta(before, after, "danube_wal_flush_total") >= 5  # one per sequential send
    assert _delta(before, after, "danube_wal_flush_latency_ms_count") >= 5
    assert _delta(before, after, "danube_wal_group_commit_records_count") >= 4
    assert after.value("danube_nonreliable_dropped_total") == 0
    assert after.value("danube_leader_election_state") == 1
    broker_id = after.matching("danube_broker_info")[0].labels["broker"]
    ours = [s for s in after.samples if s.name.startswith("danube_")]
    assert broker_id and all(s.labels["broker"] == broker_id for s in ours)
    # the process's own series (process_*, python_*) are the exporter's standard ones
    assert any(s.name == "process_resident_memory_bytes" for s in after.samples)


def test_health_readiness_and_unknown_paths(broker: BrokerProcess) -> None:
    base = broker.metrics_url
    assert http_get(f"{base}/healthz")[::2] == (200, "ok\n")
    assert http_get(f"{base}/readyz")[::2] == (200, "ready\n")
    status, content_type, _ = http_get(f"{base}/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=")
    assert http_get(f"{base}/metrics/extra")[0] == 404
    assert http_get(f"{base}/")[0] == 404


def test_the_endpoint_can_be_turned_off(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path / "data", metrics_port=None).start()
    assert broker.metrics_addr == ""
    assert "metrics_addr=off" in broker.wait_for_log("event=broker_ready")


def test_a_three_broker_cluster_reports_one_leader_and_the_topics_each_owns(
    tmp_path: Path,
) -> None:
    """Each broker of a real cluster serves its own endpoint: one leader among them, every
    one ready, and the topics of a partitioned producer counted where they were placed."""
    topic = unique_topic("metrics-cluster")
    with LocalCluster(tmp_path / "cluster", ClusterSettings(brokers=3)) as cluster:
        urls = [b.metrics_url for b in cluster.brokers]
        assert len(set(urls)) == 3, "parallel brokers get ports of their own"

        async def produce() -> None:
            async with DanubeClient(",".join(cluster.service_urls)) as client:
                producer = await client.producer(
                    topic, "p", partitions=6, dispatch=DispatchStrategy.RELIABLE
                ).create()
                for index in range(12):
                    await producer.send(b"m", key=str(index))

        run(produce, timeout=60)
        for url in urls:
            assert http_get(f"{url}/readyz")[::2] == (200, "ready\n")
        deadline = time.monotonic() + 10
        while True:  # an election may still be settling
            scrapes = [scrape(url) for url in urls]
            leaders = [s.value("danube_leader_election_state") for s in scrapes]
            if sorted(leaders) == [0, 0, 1] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert sorted(leaders) == [0, 0, 1], leaders
        ids = {
            s.matching("danube_broker_info", mode="cluster")[0].labels["broker"] for s in scrapes
        }
        assert len(ids) == 3
        partitions = [
            sample
            for s in scrapes
            for sample in s.matching("danube_topic_messages_in_total")
            if sample.labels["topic"].startswith(topic)
        ]
        assert len(partitions) == 6 and sum(p.value for p in partitions) == 12
        assert sum(s.value("danube_wal_append_total") for s in scrapes) == 12
        cvs = [s.matching("danube_cluster_imbalance_cv") for s in scrapes]
        assert [len(found) for found in cvs] == [int(leader) for leader in leaders], (
            "only the leader reports the cluster's imbalance"
        )
        assert all(math.isfinite(sample.value) for found in cvs for sample in found)
        owners = {p.labels["broker"] for p in partitions}
        redirects = sum(s.value("danube_client_redirects_total") for s in scrapes)
        assert len(owners) > 1 and redirects > 0, (owners, redirects)


def test_a_broker_told_metrics_per_topic_off_names_no_topic(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """`--metrics-per-topic off` reaches the exporter: messages on several topics are counted
    in one series per broker, and no series names a topic or a subscription."""
    broker = broker_factory(tmp_path / "data", extra_args=("--metrics-per-topic", "off")).start()
    topics = [unique_topic("per-broker") for _ in range(3)]

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            for topic in topics:
                producer = await client.producer(topic, "p", batching=None).create()
                await producer.send(b"x" * 10)

    run(scenario)
    samples = scrape(broker.metrics_url)
    assert "topic=" not in samples.text and "subscription=" not in samples.text
    assert samples.value("danube_topic_messages_in_total") == 3
    assert samples.value("danube_broker_topics_owned") >= 3
