"""The broker's latency breakdown (issue 23, point 2): a real broker process, scraped over HTTP
after our client published reliable messages on the plain path (`SendMessage`, one request
each) and the batched one (`PublishBatches`), and received them: every stage of
`danube_stage_latency_ms` was observed, as often as its rule says (per request, per group
commit, per stream turn), and a non-reliable topic adds nothing. The histogram and the bench
table's arithmetic are checked on their own below."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from bench import stage_breakdown
from danube.client import DanubeClient, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from danube.runtime.stage_metrics import (
    REPLICATION_STAGES,
    STAGE_BUCKETS_MS,
    STAGES,
    StageHistogram,
    StageLatency,
)
from danube.values.config import DispatchStrategy
from tests.support import replicated
from tests.support.aio import receive_n, run, unique_topic
from tests.support.metrics import Samples, scrape

SENDS = 6
FAMILY = "danube_stage_latency_ms"


def _count(samples: Samples, stage: str) -> float:
    return samples.value(f"{FAMILY}_count", stage=stage)


def _total(samples: Samples, stage: str) -> float:
    return samples.value(f"{FAMILY}_sum", stage=stage)


@pytest.mark.slow
def test_every_stage_is_observed_for_reliable_messages(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path / "data").start()
    url = broker.metrics_url
    reliable, plain = unique_topic("stages-rel"), unique_topic("stages-plain")
    before = scrape(url)
    assert {_count(before, stage) for stage in STAGES} == {0}

    async def publish_reliable() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(
                reliable, "p", dispatch=DispatchStrategy.RELIABLE, batching=None
            ).create()
            consumer = await client.consumer(
                reliable, "c", "s", sub_type=SubType.EXCLUSIVE
            ).subscribe()
            for n in range(SENDS):
                await producer.send(b"m%d" % n)
            await receive_n(consumer, SENDS)

    run(publish_reliable)
    after = scrape(url)
    # Per request: one each for every SendMessage stored.
    for stage in ("receive", "check", "acknowledgement", "publish"):
        assert _count(after, stage) == SENDS, (stage, after.matching(f"{FAMILY}_count"))
    # Per group commit: one each (sends one at a time: a commit each, and the segment's
    # creation is not a write).
    for stage in ("write", "fsync", "back"):
        assert 1 <= _count(after, stage) <= SENDS, stage
    # Per stream turn that sent stored records.
    for stage in ("dispatch", "send"):
        assert 1 <= _count(after, stage) <= SENDS, stage
    for stage in STAGES:
        if stage in REPLICATION_STAGES:  # a standalone broker replicates nothing
            assert _count(after, stage) == 0, stage
        else:
            assert _total(after, stage) > 0, stage
    # A publish's whole time covers its parts that run one after the other.
    assert _total(after, "publish") >= _total(after, "check")

    async def publish_plain() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(plain, "p").create()
            consumer = await client.consumer(plain, "c", "s", sub_type=SubType.SHARED).subscribe()
            for n in range(SENDS):
                await producer.send(b"n%d" % n)
            await receive_n(consumer, SENDS)

    run(publish_plain)
    later = scrape(url)
    for stage in ("write", "fsync", "back", "acknowledgement", "dispatch", "publish"):
        assert _count(later, stage) == _count(after, stage), stage


@pytest.mark.slow
def test_the_batched_path_observes_once_per_batch(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path / "data").start()
    topic = unique_topic("stages-batch")

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(
                topic, "p", dispatch=DispatchStrategy.RELIABLE
            ).create()
            consumer = await client.consumer(
                topic, "c", "s", sub_type=SubType.EXCLUSIVE
            ).subscribe()
            for n in range(SENDS):
                await producer.send(b"b%d" % n)
            await receive_n(consumer, SENDS)

    run(scenario)
    deadline = time.monotonic() + 10
    while True:  # a stream is counted when it ends, a moment after the client closed it
        after = scrape(broker.metrics_url)
        batches = sum(
            s.value for s in after.matching("danube_broker_rpc_total", method="PublishBatches")
        )
        if batches >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert batches >= 1  # the stream of batches, not SendMessage
    assert not after.matching("danube_broker_rpc_total", method="SendMessage")
    requests = _count(after, "receive")
    assert 1 <= requests <= SENDS
    assert _count(after, "publish") == _count(after, "check") == requests, batches
    assert _count(after, "dispatch") >= 1 and _count(after, "fsync") >= 1


def test_a_histogram_puts_each_value_in_its_bucket() -> None:
    histogram = StageHistogram()
    for ms in (0.005, 0.01, 0.011, 3.0, 10_000.0):
        histogram.observe(ms)
    buckets = dict(histogram.buckets())
    assert buckets["0.01"] == 2  # `le`: a bound holds what equals it
    assert buckets["0.025"] == 3
    assert buckets["2.5"] == 3 and buckets["5"] == 4
    assert buckets["+Inf"] == 5 == len(histogram.counts) - len(STAGE_BUCKETS_MS) + 4
    assert math.isclose(histogram.total, 0.005 + 0.01 + 0.011 + 3.0 + 10_000.0)


def test_a_group_commit_splits_into_write_fsync_and_back() -> None:
    stages = StageLatency()
    stages.committed(submitted=1.0, finished=1.004, answered=1.0045, synced=0.003)
    h = stages.histograms
    assert math.isclose(h["write"].total, 1.0, rel_tol=1e-6)  # 4 ms in the thread - 3 ms fsync
    assert math.isclose(h["fsync"].total, 3.0, rel_tol=1e-6)
    assert math.isclose(h["back"].total, 0.5, rel_tol=1e-6)
    assert stages.stored_at == 1.0045
    stages.committed(submitted=2.0, finished=2.001, answered=2.002, synced=0.001, wrote=False)
    assert sum(h["write"].counts) == 1 and sum(h["fsync"].counts) == 2


def test_the_bench_table_reads_the_difference_of_two_scrapes() -> None:
    def exposition(counts: list[int], total: float) -> str:
        lines = []
        cumulative = 0
        for bound, count in zip((*STAGE_BUCKETS_MS, "+Inf"), counts, strict=True):
            cumulative += count
            lines.append(f'{FAMILY}_bucket{{broker="b",stage="fsync",le="{bound}"}} {cumulative}')
        lines.append(f'{FAMILY}_count{{broker="b",stage="fsync"}} {cumulative}')
        lines.append(f'{FAMILY}_sum{{broker="b",stage="fsync"}} {total}')
        return f"# TYPE {FAMILY} histogram\n" + "\n".join(lines) + "\n"

    empty = [0] * (len(STAGE_BUCKETS_MS) + 1)
    first = list(empty)
    first[STAGE_BUCKETS_MS.index(0.5)] = 10  # ten in (0.25, 0.5]
    second = list(first)
    second[STAGE_BUCKETS_MS.index(5)] = 4  # four more in (2.5, 5]
    before = stage_breakdown.parse(exposition(first, 4.0))
    after = stage_breakdown.parse(exposition(second, 20.0))
    (row,) = stage_breakdown.table(stage_breakdown.difference(after, before))
    assert row["stage"] == "fsync" and row["count"] == 4
    assert row["mean_ms"] == 4.0
    assert 2.5 < row["p50_ms"] <= 5  # type: ignore[operator]
    (whole,) = stage_breakdown.table(after)
    assert whole["count"] == 14 and 0.25 < whole["p50_ms"] <= 0.5  # type: ignore[operator]


@pytest.mark.slow
def test_a_replicated_round_is_observed_on_the_owner_and_the_follower(tmp_path: Path) -> None:
    """Issue 27 point 6: the owner observes the send and the round of each replicated group
    commit, its follower the way to durable and the answer (`bench.cluster_e2e e2e
    --stages` prints them)."""
    topic = unique_topic("stages-replicated")
    with LocalCluster(tmp_path / "cluster", ClusterSettings(brokers=2)) as cluster:

        async def create() -> None:
            async with DanubeClient(cluster.brokers[0].url) as client:
                producer = await client.producer(
                    topic, "creator", dispatch=DispatchStrategy.RELIABLE
                ).create()
                await producer.send(b"first")

        run(create)
        replicated.wait(
            lambda: (o := replicated.owner(cluster, topic)) and replicated.copies(o, topic) == 2,
            30,
            "a follower in sync",
            cluster,
        )
        owner = replicated.owner(cluster, topic)
        assert owner is not None
        follower = next(b for b in cluster.brokers if b is not owner)
        before = {b.pid: scrape(b.metrics_url) for b in cluster.brokers}

        async def publish() -> None:
            async with DanubeClient(owner.url) as client:
                producer = await client.producer(
                    topic, "p", dispatch=DispatchStrategy.RELIABLE, batching=None
                ).create()
                for n in range(SENDS):
                    await producer.send(b"r%d" % n)

        run(publish)
        owner_seen, follower_seen = scrape(owner.metrics_url), scrape(follower.metrics_url)
        for stage in ("replicate_queue", "replicate_round"):
            grew = _count(owner_seen, stage) - _count(before[owner.pid], stage)
            assert SENDS <= grew <= SENDS + 1, (stage, grew)  # + the creator's, if not seen yet
            assert _count(follower_seen, stage) == 0, stage
        for stage in ("replica_durable", "replica_answer"):
            grew = _count(follower_seen, stage) - _count(before[follower.pid], stage)
            assert 1 <= grew <= SENDS + 1, (stage, grew)
            assert _count(owner_seen, stage) == 0, stage
