"""Issue 27, moves on real broker processes (spec/replication.md, "Failover and moves"): a
3-broker local cluster (etcd, moto's S3) at the default durability; a reliable topic with a
follower in sync is unloaded by the admin. The in-sync follower gets it (a promotion: it
keeps its own WAL, `kept_local_wal=True`, under a new epoch), the old owner hands over
without uploading its tail (its WAL directory stays, where the upload path deletes it, until
the replica set no longer counts on it), and every acknowledged message is still consumed."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from danube.proto import danube_admin as pb
from tests.broker.test_cluster_admin import call, consume, create, produce, subscribe
from tests.support import replicated
from tests.support.replicated import broker_id, describe, wait

pytestmark = pytest.mark.slow

TOPIC = "/default/handed-over"
COUNT = 40


def wal_files(broker: BrokerProcess) -> list[Path]:
    """The topic's WAL segments in `broker`'s data directory."""
    local = TOPIC.rsplit("/", 1)[1]
    return [p for p in Path(broker.data_dir).rglob("*.wal") if local in str(p)]


def test_an_unloaded_replicated_topic_goes_to_its_in_sync_follower(tmp_path: Path) -> None:
    settings = ClusterSettings(brokers=3, replication_lag_ms=500)
    with LocalCluster(tmp_path / "cluster", settings) as cluster:
        urls = ",".join(cluster.service_urls)
        create(cluster, TOPIC)
        asyncio.run(subscribe(urls, TOPIC))
        asyncio.run(produce(urls, TOPIC, COUNT))

        def in_sync() -> BrokerProcess | None:
            owner = replicated.owner(cluster, TOPIC)
            return owner if owner is not None and replicated.copies(owner, TOPIC) == 2 else None

        wait(in_sync, 60, "a follower in sync", cluster)
        owner = in_sync()
        assert owner is not None
        before = describe(owner, TOPIC)
        assert len(before.in_sync) == 1
        follower = before.in_sync[0]
        assert wal_files(owner)

        other = next(b for b in cluster.brokers if b is not owner)
        assert call(other, "unload_topic", pb.TopicRequest(TOPIC)).success

        def moved() -> BrokerProcess | None:
            now = replicated.owner(cluster, TOPIC)
            return now if now is not None and now is not owner else None

        wait(moved, 60, "the topic to move", cluster)
        new = moved()
        assert new is not None
        assert broker_id(new) == follower, "the move went to a broker without the log"
        assert f"event=topic_loaded topic={TOPIC} kept_local_wal=True" in new.log_text()
        # the new owner reads its replica set once loaded: describe shows epoch 0 until then
        wait(lambda: describe(new, TOPIC).epoch > before.epoch, 30, "a new epoch", cluster)
        drops = re.findall(
            rf"event=wal_dropped topic={re.escape(TOPIC)} deleted=(\w+)", owner.log_text()
        )
        assert drops[:1] == ["False"], "the old owner took the upload path (it deletes its WAL)"
        received = asyncio.run(consume(urls, TOPIC, COUNT))
        assert received == [f"m-{i}" for i in range(COUNT)]
        # The kept directory is the old owner's replica if the new owner follows to it,
        # else it goes once the replica set no longer counts on the old owner.
        old_id = broker_id(owner)

        def kept_settled() -> bool:
            after = describe(new, TOPIC)
            counted = old_id in [f.broker_id for f in after.followers] or old_id in after.in_sync
            return counted == bool(wal_files(owner))

        wait(kept_settled, 30, "the old owner's kept directory to follow or go", cluster)
