"""An owner cut off from its follower, with real processes (issue 27, point 5): a 2-broker
local cluster (etcd, moto's S3, lease TTL 3 s, default durability `fsync`) where each broker
advertises a loopback proxy as its admin address (`--advertised-admin-addr`, the address
brokers reach each other by), so the owner reaches its follower only through the follower's
proxy; clients reach the brokers directly. `danube-cli load`
publishes reliable messages throughout and logs what it was acknowledged and received.

1. The follower's proxy is cut (connections reset, new ones refused); the follower keeps its
   etcd lease, so only the owner–follower link is down. After `lag_ms` the owner leaves the
   follower out of the in-sync set (copies 1) and goes on acknowledging.
2. The proxy heals: the follower catches up and is in sync again (copies 2).
3. The owner is SIGKILLed: its follower, in sync, takes the topic over with everything.
4. The killed broker restarts and follows the new owner (copies 2 again).

The load generator then drains every subscription: nothing acknowledged is missing, and the
Spark audit of both brokers' WALs, the object tier and the generator's logs is clean.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from danube.localcluster.cluster import ClusterSettings, LocalCluster
from tests.support.replicated import (
    Load,
    audit_stopped_run,
    broker_id,
    copies,
    describe,
    logs,
    owner,
    wait,
)
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

PREFIX = "/default/partitioned"
TOPIC = f"{PREFIX}-0"
LAG_MS = 500
MESSAGES = 1_500
RATE = 150


@pytest.fixture
def proxies() -> Iterator[list[TcpProxy]]:
    made = [TcpProxy(), TcpProxy()]
    yield made
    for proxy in made:
        proxy.close()


def test_owner_cut_off_from_its_follower_then_killed_loses_nothing(
    tmp_path: Path,
    proxies: list[TcpProxy],
    spark: SparkSession,
) -> None:
    settings = ClusterSettings(brokers=0, replication_lag_ms=LAG_MS)
    with LocalCluster(tmp_path / "cluster", settings) as cluster:
        for proxy in proxies:
            broker = cluster.add_broker(advertised_admin_addr=proxy.address)
            host, port = broker.admin_addr.rsplit(":", 1)
            proxy.target = (host, int(port))
        load = Load(
            [b.url for b in cluster.brokers], tmp_path / "logs",
            "--topic-prefix", PREFIX, "-c", str(MESSAGES), "-r", str(RATE),
            "--subscriptions", "exclusive,shared", "--drain", "30",
        )  # fmt: skip

        started = time.monotonic()
        phases: list[str] = []

        def phase(name: str) -> None:
            """What the run's report prints: when each step came, with the acks so far."""
            phases.append(f"{time.monotonic() - started:5.1f} s {name} (acked {load.acknowledged})")

        def network() -> str:
            return f"load: {load.err_lines[-3:]}\nproxies: " + ", ".join(
                f"{p.address} cut={p.is_cut} accepted={p.accepted} refused={p.refused} "
                f"dropped={p.dropped}"
                for p in proxies
            )

        try:
            wait(
                lambda: (o := owner(cluster, TOPIC)) and copies(o, TOPIC) == 2,
                30, "a follower in sync", cluster, network,
            )  # fmt: skip
            first = owner(cluster, TOPIC)
            assert first is not None
            (follower,) = [b for b in cluster.brokers if b is not first]
            cut = proxies[cluster.brokers.index(follower)]
            state = describe(follower, TOPIC)
            assert [(f.broker_id, f.in_sync) for f in state.followers] == [
                (broker_id(follower), True)
            ], state
            wait(lambda: load.acknowledged > 50, 30, "the load running", cluster, network)

            # 1. owner and follower cut apart: the owner acknowledges alone after lag_ms
            phase("cut")
            cut.cut()
            wait(
                lambda: copies(first, TOPIC) == 1,
                30,
                "the cut-off follower out of sync",
                cluster,
                network,
            )
            state = describe(follower, TOPIC)
            assert [(f.broker_id, f.in_sync) for f in state.followers] == [
                (broker_id(follower), False)
            ], state
            during = load.acknowledged
            wait(
                lambda: load.acknowledged > during + 100,
                20,
                "acknowledgements while cut",
                cluster,
                network,
            )
            assert cut.is_cut and cut.dropped + cut.refused > 0

            # 2. healed: the follower catches up and is counted in sync again
            phase("heal")
            cut.heal()
            wait(
                lambda: copies(first, TOPIC) == 2, 30, "the follower back in sync", cluster, network
            )
            assert describe(first, TOPIC).followers[0].in_sync
            time.sleep(1)

            # 3. the owner dies: the follower takes over with every acknowledged message
            phase("owner killed")
            first.kill()
            wait(
                lambda: owner(cluster, TOPIC) is follower,
                60,
                "the follower promoted",
                cluster,
                network,
            )
            after = load.acknowledged
            wait(
                lambda: load.acknowledged > after + 100,
                30,
                "acknowledgements after",
                cluster,
                network,
            )

            # 4. the killed broker comes back and follows the new owner
            phase("restart")
            first.start()
            host, port = first.admin_addr.rsplit(":", 1)
            proxies[cluster.brokers.index(first)].target = (host, int(port))
            wait(
                lambda: copies(follower, TOPIC) == 2,
                60,
                "the restarted broker in sync",
                cluster,
                network,
            )

            phase("in sync again")
            code, out, err = load.finish(timeout=120)
            phase("load done")
        finally:
            if load.process.poll() is None:
                load.process.kill()
        print("partition test phases:\n" + "\n".join(phases))
        print(f"partition test load: {out}")
        assert code == 0, f"{out}\n{err[-3000:]}\n{logs(cluster, TOPIC)}"
        assert f"acknowledged {MESSAGES} messages" in out, out
        assert out.count("all received") == 2, out

        # Stopped in order (each seals and uploads), the object store still up for the audit.
        summary = audit_stopped_run(spark, cluster, tmp_path, phase)
    print(f"partition test audit: {summary}; {phases[-2:]}")
    assert summary["ok"], summary
    assert summary["acknowledged"] == MESSAGES
