"""Replication between real broker processes (issue 27, point 5): a 3-broker local cluster
(etcd, moto's S3, lease TTL 3 s) at the default durability (`fsync`), reliable traffic from
the official client (`tests/conformance/scenarios/cluster_traffic.py`: one send at a time, the
producer rebuilt after a failure) through brokers that do not own the topic.

1. The owner is SIGKILLed mid-run: its in-sync follower takes the topic over with every
   acknowledged record, so nothing acknowledged is lost (before replication: 41 % lost).
2. The new owner's follower is SIGKILLed: publishing goes on (after `lag_ms` the owner
   acknowledges alone).
3. The first killed broker restarts: it is assigned as a follower and catches up (the owner
   counts it in sync again).

The consumer then drains the subscription: 0 acknowledged messages lost. Beside it,
`danube-cli load` publishes on topics of its own (the fair assignment puts some on the killed
brokers) and logs what it was acknowledged and received; the Spark audit of every broker's WAL
directory, the indexed objects and those logs must be clean.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from danube.client import DanubeClient
from danube.client.client import DispatchStrategy
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from tests.conformance.harness import ScenarioProcess
from tests.support import replicated
from tests.support.replicated import Load, broker_id, describe, followed, wait

pytestmark = pytest.mark.slow

TOPIC = "/default/replicated"
LAG_MS = 500
LOAD_PREFIX = "/default/replicated-load"
LOAD_TOPICS = 5
"""With the scenario's topic, 6 topics on 3 brokers: the fair assignment gives each broker
some, so the brokers killed own load topics too."""
LOAD_MESSAGES = 1_500


def _copies(broker: BrokerProcess) -> float:
    return replicated.copies(broker, TOPIC)


def _owner(cluster: LocalCluster) -> BrokerProcess | None:
    return replicated.owner(cluster, TOPIC)


def _wait(check: object, timeout: float, what: str, cluster: LocalCluster) -> None:
    wait(check, timeout, what, cluster)  # type: ignore[arg-type]


async def _create_topic(url: str) -> None:
    async with DanubeClient(url) as client:
        producer = await client.producer(
            TOPIC, "creator", dispatch=DispatchStrategy.RELIABLE
        ).create()
        await producer.send(b"first")


def test_owner_and_follower_killed_and_restarted_lose_nothing(
    tmp_path: Path,
    spark: SparkSession,
) -> None:
    settings = ClusterSettings(brokers=3, replication_lag_ms=LAG_MS)
    began = time.monotonic()
    times: list[str] = []

    def mark(what: str) -> None:
        times.append(f"{what} {time.monotonic() - began:.1f} s")

    with LocalCluster(tmp_path / "cluster", settings) as cluster:
        mark("cluster up")
        asyncio.run(_create_topic(cluster.brokers[0].url))
        # A broker's first object-store calls (botocore starting up) can stall it past its
        # lease on a busy machine, and the topic fails over before any traffic: the test
        # starts from whoever owns the topic once a follower is in sync.
        _wait(lambda: (o := _owner(cluster)) and _copies(o) == 2, 30, "a follower in sync", cluster)
        owner = _owner(cluster)
        assert owner is not None
        others = [b for b in cluster.brokers if b is not owner]
        # Beside the official client, `danube-cli load` on topics of its own, logging what it
        # was acknowledged and received for the audit.
        load = Load(
            [b.url for b in cluster.brokers], tmp_path / "logs",
            "--topic-prefix", LOAD_PREFIX, "--topics", str(LOAD_TOPICS),
            "-c", str(LOAD_MESSAGES), "-r", "100", "--subscriptions", "exclusive,shared",
            "--drain", "30",
        )  # fmt: skip
        traffic = ScenarioProcess("cluster_traffic", ",".join(b.url for b in others), TOPIC)
        try:
            traffic.wait_event("ready", timeout=60)
            _wait(lambda: load.acknowledged > 50, 30, "the load running", cluster)
            load_topics = [f"{LOAD_PREFIX}-{i}" for i in range(LOAD_TOPICS)]
            owned = {t: replicated.owner(cluster, t) for t in load_topics}
            time.sleep(1)

            # 1. the owner dies; its in-sync follower takes over
            owner.kill()
            killed = owner
            _wait(lambda: _owner(cluster) is not None, 60, "a new owner", cluster)
            second = _owner(cluster)
            assert second is not None
            time.sleep(4)

            # 2. the new owner's follower dies (if it got one): publishing goes on
            follower = next(b for b in cluster.brokers if b.alive and b is not second)
            _wait(lambda: _copies(second) == 2, 30, "the new owner's follower in sync", cluster)
            follower.kill()
            _wait(lambda: _copies(second) == 1, 30, "the dead follower shrunk away", cluster)
            time.sleep(2)

            # 3. the first killed broker comes back as a follower and catches up
            killed.start()
            _wait(lambda: _copies(second) == 2, 60, "the restarted broker in sync", cluster)
            assert followed(killed) >= 1
            # what `danube-admin topics describe` shows, asked of a broker that does not own it
            state = describe(killed, TOPIC)
            assert state.live and state.owner == broker_id(second), state
            assert [(f.broker_id, f.in_sync) for f in state.followers] == [
                (broker_id(killed), True)
            ]
            time.sleep(2)

            mark("steps done")
            traffic.send("stop")
            result = traffic.result(timeout=120)
            mark("official client done")
            code, out, err = load.finish(timeout=120)
            mark("load done")
        finally:
            if load.process.poll() is None:
                load.process.kill()
        print(f"replication kill test: {result}")
        assert result["missing"] == [], f"{result}\n{replicated.logs(cluster, TOPIC)}"
        assert "consumer_failure" not in result, result
        assert result["acked"] > 100, result
        killed_owned = sorted(t for t, b in owned.items() if b in (killed, follower))
        print(f"replication kill test load: {out}; load topics on killed brokers {killed_owned}")
        assert code == 0, f"{out}\n{err[-3000:]}\n{replicated.logs(cluster)}"
        assert out.count("all received") == 2, out
        assert killed_owned, f"no load topic on a killed broker: {owned}"

        # Every copy the run left: each broker's WAL (the killed follower's too) and the
        # object tier, read while the object store still runs.
        summary = replicated.audit_stopped_run(spark, cluster, tmp_path, mark)
    print(f"replication kill test audit: {summary}; {', '.join(times)}")
    assert summary["ok"], summary
    assert summary["acknowledged"] == LOAD_MESSAGES
