"""What operators read of a topic's replication: `ReplicationAdmin.TopicReplication` (behind
`danube-admin topics describe`) and the replication metrics, from the owner machine's state
(`BrokerCore.replication_state`), here a stand-in's."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client.core import Metric

from danube.cli.admin_topics import replication_fields
from danube.proto import danube_ext as ext_pb
from danube.runtime.replication_admin import ReplicationAdminService
from danube.runtime.replication_metrics import replication_families

TOPIC = "/default/t"
STATE: dict[str, Any] = {
    "epoch": 12,
    "high_watermark": 90,
    "durable_end": 100,
    "in_sync": ["a"],
    "followers": {"a": {"acknowledged": 95, "sent": 100}, "b": {"acknowledged": 40, "sent": 60}},
    "deposed": False,
}


class _Core:
    def __init__(self, state: dict[str, Any] | None) -> None:
        self.state = state
        self.followers = type("F", (), {"replicas": {"/default/other": object()}})()

    def serves(self, topic: str) -> bool:
        return topic == TOPIC

    def served_topics(self) -> list[str]:
        return [TOPIC]

    def replication_state(self, topic: str) -> dict[str, Any] | None:
        return self.state


def _ask(service: ReplicationAdminService) -> ext_pb.TopicReplicationResponse:
    request = ext_pb.TopicReplicationRequest(name=TOPIC)
    return asyncio.run(service.topic_replication(request))


def test_the_owner_answers_with_each_followers_lag() -> None:
    answer = _ask(ReplicationAdminService(_Core(STATE), "me", None))  # type: ignore[arg-type]
    assert (answer.owner, answer.epoch, answer.live) == ("me", 12, True)
    assert (answer.high_watermark, answer.in_sync) == (90, ["a"])
    assert [(f.broker_id, f.in_sync, f.lag, f.acknowledged) for f in answer.followers] == [
        ("a", True, 5, 95),
        ("b", False, 60, 40),
    ]
    text = dict(replication_fields(answer))
    assert text["follower b"] == "out of sync, lag 60, acknowledged 40, not connected"
    assert text["high_watermark"] == 90


def test_a_topic_without_followers_says_so() -> None:
    answer = _ask(ReplicationAdminService(_Core(None), "me", None))  # type: ignore[arg-type]
    assert (answer.owner, answer.live, answer.note) == ("me", True, "no followers")


def _values(families: list[Metric], name: str) -> list[float]:
    family = next(f for f in families if f.name == name)
    return sorted(s.value for s in family.samples)


def test_metrics_count_copies_lag_and_under_replicated_topics() -> None:
    class _Stats:
        requests = 3

    class _Links:
        stats = type("S", (), {"sent": 1, "sent_bytes": 2, "answers": 3, "breaks": 4, "dropped": 5})

    port = type("P", (), {"links": _Links(), "service": type("V", (), {"stats": _Stats()})()})()
    families = list(replication_families("me", _Core(STATE), port))  # type: ignore[arg-type]
    assert _values(families, "danube_replication_in_sync_copies") == [2]
    assert _values(families, "danube_replication_follower_lag_messages") == [5, 60]
    assert _values(families, "danube_replication_under_replicated_topics") == [1]
    assert _values(families, "danube_replication_followed_topics") == [1]
