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

The consumer then drains the subscription: 0 acknowledged messages lost.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from grpclib.client import Channel

from danube.client import DanubeClient
from danube.client.client import DispatchStrategy
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from danube.proto import danube_ext as ext_pb
from tests.conformance.harness import ScenarioProcess
from tests.support.metrics import scrape

pytestmark = pytest.mark.slow

TOPIC = "/default/replicated"
LAG_MS = 500


def _wait(check: object, timeout: float, what: str, cluster: LocalCluster) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}\n{_logs(cluster)}"
            )
        time.sleep(0.2)


def _logs(cluster: LocalCluster) -> str:
    lines = [
        f"{b.data_dir.name}: {line}"
        for b in cluster.brokers
        for line in b.log_lines
        if "replica" in line or "error" in line.lower() or "warn" in line.lower()
        or TOPIC in line
    ]  # fmt: skip
    return "\n".join(lines[-80:])


def _copies(broker: BrokerProcess) -> float:
    """The topic's in-sync copies as `broker` (its owner) counts them; 0 when unknown."""
    try:
        samples = scrape(broker.metrics_url).matching(
            "danube_replication_in_sync_copies", topic=TOPIC
        )
    except OSError:
        return 0.0
    return samples[0].value if samples else 0.0


def _followed(broker: BrokerProcess) -> float:
    try:
        return scrape(broker.metrics_url).value("danube_replication_followed_topics")
    except (OSError, KeyError, AssertionError):
        return 0.0


async def _create_topic(url: str) -> None:
    async with DanubeClient(url) as client:
        producer = await client.producer(
            TOPIC, "creator", dispatch=DispatchStrategy.RELIABLE
        ).create()
        await producer.send(b"first")


def _id(broker: BrokerProcess) -> str:
    match = re.search(r"event=broker_ready broker_id=(\S+)", broker.log_text())
    assert match is not None
    return match.group(1)


async def _replication(broker: BrokerProcess) -> ext_pb.TopicReplicationResponse:
    channel = Channel(*broker.admin_addr.rsplit(":", 1))
    try:
        stub = ext_pb.ReplicationAdminStub(channel, timeout=10)
        return await stub.topic_replication(ext_pb.TopicReplicationRequest(name=TOPIC))
    finally:
        channel.close()


def _owner(cluster: LocalCluster) -> BrokerProcess | None:
    """The one live broker whose last word on the topic is that it loaded it."""
    pattern = re.compile(rf"event=topic_(loaded|dropped|unloaded) topic={re.escape(TOPIC)} ")
    found = [
        b
        for b in cluster.brokers
        if b.alive and [m.group(1) for m in pattern.finditer(b.log_text())][-1:] == ["loaded"]
    ]
    return found[0] if len(found) == 1 else None


def test_owner_and_follower_killed_and_restarted_lose_nothing(tmp_path: Path) -> None:
    settings = ClusterSettings(brokers=3, replication_lag_ms=LAG_MS)
    with LocalCluster(tmp_path / "cluster", settings) as cluster:
        asyncio.run(_create_topic(cluster.brokers[0].url))
        # A broker's first object-store calls (botocore starting up) can stall it past its
        # lease on a busy machine, and the topic fails over before any traffic: the test
        # starts from whoever owns the topic once a follower is in sync.
        _wait(lambda: (o := _owner(cluster)) and _copies(o) == 2, 30, "a follower in sync", cluster)
        owner = _owner(cluster)
        assert owner is not None
        others = [b for b in cluster.brokers if b is not owner]
        traffic = ScenarioProcess("cluster_traffic", ",".join(b.url for b in others), TOPIC)
        traffic.wait_event("ready", timeout=60)
        time.sleep(2)

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
        assert _followed(killed) >= 1
        # what `danube-admin topics describe` shows, asked of a broker that does not own it
        state = asyncio.run(_replication(killed))
        assert state.live and state.owner == _id(second), state
        assert [(f.broker_id, f.in_sync) for f in state.followers] == [(_id(killed), True)]
        time.sleep(2)

        traffic.send("stop")
        result = traffic.result(timeout=120)
    print(f"replication kill test: {result}")
    assert result["missing"] == [], f"{result}\n{_logs(cluster)}"
    assert "consumer_failure" not in result, result
    assert result["acked"] > 100, result
