"""Replication as operators watch it (spec/replication.md, issue 27): per topic this broker
owns, how many copies hold everything acknowledged and how far each follower is behind; per
broker, how many topics are under-replicated, how many it follows, and what its streams did.

Read from `BrokerCore.replication_state` at scrape time (the owner machines' view), and from
the transport's counters; nothing here is kept between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Metric

from danube.machines.node.core import BrokerCore


def follower_lag(state: dict[str, Any]) -> dict[str, int]:
    """Records the owner holds durably that each follower has not acknowledged yet."""
    durable = state["durable_end"]
    return {
        name: max(0, durable - link["acknowledged"]) for name, link in state["followers"].items()
    }


def under_replicated(state: dict[str, Any]) -> bool:
    """Some follower of the topic is out of the in-sync set."""
    return any(name not in state["in_sync"] for name in state["followers"])


def replication_families(broker: str, core: BrokerCore, port: Any) -> Iterator[Metric]:
    in_sync = GaugeMetricFamily(
        "danube_replication_in_sync_copies",
        "Copies of the topic's log that hold everything acknowledged (the owner included).",
        labels=["broker", "topic"],
    )
    lag = GaugeMetricFamily(
        "danube_replication_follower_lag_messages",
        "Records durable on the owner that the follower has not acknowledged.",
        labels=["broker", "topic", "follower"],
    )
    under = 0
    for topic in core.served_topics():
        state = core.replication_state(topic)
        if state is None:
            continue
        in_sync.add_metric([broker, topic], 1 + len(state["in_sync"]))
        for follower, behind in sorted(follower_lag(state).items()):
            lag.add_metric([broker, topic, follower], behind)
        under += under_replicated(state)
    yield in_sync
    yield lag
    gauge = GaugeMetricFamily(
        "danube_replication_under_replicated_topics",
        "Topics owned here with a follower out of the in-sync set.",
        labels=["broker"],
    )
    gauge.add_metric([broker], under)
    yield gauge
    followed = GaugeMetricFamily(
        "danube_replication_followed_topics",
        "Topics this broker keeps a follower copy of.",
        labels=["broker"],
    )
    followed.add_metric([broker], len(core.followers.replicas))
    yield followed
    stats = port.links.stats
    for name, doc, value in (
        ("sent", "Replicates written to follower streams.", stats.sent),
        ("sent_bytes", "Frame bytes written to follower streams.", stats.sent_bytes),
        ("answers", "Follower answers received.", stats.answers),
        ("breaks", "Follower streams lost (the owner resends).", stats.breaks),
        ("dropped", "Replicates dropped by lost streams.", stats.dropped),
    ):
        counter = CounterMetricFamily(f"danube_replication_{name}_total", doc, labels=["broker"])
        counter.add_metric([broker], value)
        yield counter
    received = CounterMetricFamily(
        "danube_replication_received_total",
        "Replicates received from owners (this broker as follower).",
        labels=["broker"],
    )
    received.add_metric([broker], port.service.stats.requests)
    yield received
