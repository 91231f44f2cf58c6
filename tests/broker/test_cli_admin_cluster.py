"""`danube-admin` against a real three-broker cluster (etcd, S3, broker processes): the
brokers and their leader, where topics live, moving one topic, draining a broker and bringing
it back, and a rebalance proposal (issue 10, points 2 and 5). The tests share one cluster and
run in file order, each leaving it with every broker active."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from tests.broker.test_cli_admin import as_json, ok, row

pytestmark = pytest.mark.slow
T = TypeVar("T")
TOPICS = 6


def eventually(what: str, check: Callable[[], T | None], timeout_s: float = 90.0) -> T:
    """`check()`'s first answer that is not None, asked every half second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("admin-cluster")
    with LocalCluster(root, ClusterSettings(brokers=3, rebalancing=True)) as running:
        yield running


@pytest.fixture(scope="module")
def any_broker(cluster: LocalCluster) -> BrokerProcess:
    return cluster.brokers[0]


def brokers(any_broker: BrokerProcess) -> list[dict[str, str]]:
    return as_json(any_broker, "brokers", "list")["brokers"]  # type: ignore[return-value]


def leader(cluster: LocalCluster, any_broker: BrokerProcess) -> BrokerProcess:
    """The leader's process, found as an operator would: its id, then its admin address."""
    leader_id = ok(any_broker, "brokers", "leader-broker").strip()
    (info,) = [b for b in brokers(any_broker) if b["broker_id"] == leader_id]
    (process,) = [p for p in cluster.brokers if info["admin_addr"] == f"http://{p.admin_addr}"]
    return process


def placement(any_broker: BrokerProcess, ns: str) -> dict[str, str] | None:
    """topic -> broker id from every broker's `topics list --broker`, once each topic of
    `ns` is served by exactly one broker."""
    found: dict[str, list[str]] = {}
    for info in brokers(any_broker):
        served = as_json(any_broker, "topics", "list", "--broker", info["broker_id"])["topics"]
        for topic in served:  # type: ignore[attr-defined]
            if topic["name"].startswith(f"/{ns}/"):
                found.setdefault(topic["name"], []).append(info["broker_id"])
    if len(found) != TOPICS or any(len(owners) != 1 for owners in found.values()):
        return None
    return {topic: owners[0] for topic, owners in found.items()}


def status_of(any_broker: BrokerProcess, broker_id: str) -> str:
    (info,) = [b for b in brokers(any_broker) if b["broker_id"] == broker_id]
    return info["broker_status"]


@pytest.fixture(scope="module")
def namespace(any_broker: BrokerProcess) -> str:
    """A namespace of reliable topics spread over the brokers."""
    ns = f"adm-{uuid.uuid4().hex[:8]}"
    ok(any_broker, "namespaces", "create", ns)
    for i in range(TOPICS):
        ok(any_broker, "topics", "create", f"t{i}", "-n", ns, "--dispatch-strategy", "reliable")
    eventually("every topic assigned", lambda: placement(any_broker, ns))
    return ns


def test_brokers_list_three_with_one_leader(
    cluster: LocalCluster, any_broker: BrokerProcess
) -> None:
    def three() -> list[dict[str, str]] | None:
        found = brokers(any_broker)
        return found if len(found) == 3 else None

    listed = eventually("three brokers registered", three)
    roles = sorted(b["broker_role"] for b in listed)
    assert roles == ["Cluster_Follower", "Cluster_Follower", "Cluster_Leader"]
    assert {b["broker_status"] for b in listed} == {"active"}
    assert {b["broker_addr"] for b in listed} == {p.url for p in cluster.brokers}
    leader_id = ok(any_broker, "brokers", "leader-broker").strip()
    assert [b["broker_id"] for b in listed if b["broker_role"] == "Cluster_Leader"] == [leader_id]
    table = ok(any_broker, "brokers", "list")
    assert row(table, leader_id)[1:3] == ["Cluster_Leader", "active"]


def test_balance_covers_every_broker(cluster: LocalCluster, any_broker: BrokerProcess) -> None:
    boss = leader(cluster, any_broker)

    def reported() -> dict[str, object] | None:
        found = as_json(boss, "brokers", "balance")
        return found if found["broker_count"] == 3 else None

    balance = eventually("loads of three brokers", reported)
    assert len(balance["brokers"]) == 3  # type: ignore[arg-type]
    assert "coefficient of variation:" in ok(boss, "brokers", "balance")


def test_topics_list_by_namespace_agrees_with_the_brokers(
    any_broker: BrokerProcess, namespace: str
) -> None:
    where = placement(any_broker, namespace)
    assert where is not None
    assert len(set(where.values())) > 1, f"fair placement used one broker: {where}"
    listed = as_json(any_broker, "topics", "list", "--namespace", namespace)["topics"]
    assert {t["name"]: t["broker_id"] for t in listed} == where  # type: ignore[union-attr, attr-defined]
    table = ok(any_broker, "topics", "list", "--broker", next(iter(where.values())))
    assert table.splitlines()[0].split() == ["TOPIC", "BROKER_ID", "DELIVERY"]


def test_topic_commands_sent_to_any_broker_reach_the_owner(
    any_broker: BrokerProcess, namespace: str
) -> None:
    """One endpoint serves the whole cluster: settings of a topic another broker serves are
    made and read through `any_broker`, which asks the owner."""
    where = placement(any_broker, namespace)
    assert where is not None
    (mine,) = [
        b for b in brokers(any_broker) if b["admin_addr"] == f"http://{any_broker.admin_addr}"
    ]
    topic, owner = next((t, o) for t, o in sorted(where.items()) if o != mine["broker_id"])
    described = as_json(any_broker, "topics", "describe", topic)
    assert described["broker_id"] == owner and described["delivery"] == "Reliable"
    ok(
        any_broker,
        "topics",
        "set-dispatch-config",
        topic,
        "-s",
        "audit",
        "--max-unacked-messages",
        "7",
    )
    got = as_json(any_broker, "topics", "get-dispatch-config", topic, "-s", "audit")
    assert got["dispatch_config"] == {"max_unacked_messages": 7}
    ok(any_broker, "topics", "set-policies", topic, "--max-producers-per-topic", "2")
    policies = as_json(any_broker, "topics", "get-policies", topic)
    assert policies["policies"]["max_producers_per_topic"] == 2  # type: ignore[index]
    assert policies["overridden"] == ["max_producers_per_topic"]
    assert as_json(any_broker, "topics", "subscriptions", topic)["subscriptions"] == []


def test_topic_unload_moves_it_to_another_broker(any_broker: BrokerProcess, namespace: str) -> None:
    before = placement(any_broker, namespace)
    assert before is not None
    topic = f"/{namespace}/t0"
    done = ok(any_broker, "topics", "unload", topic)
    assert done.strip().startswith(f"Unloaded topic {topic}")

    def moved() -> str | None:
        now = placement(any_broker, namespace)
        return now[topic] if now is not None and now[topic] != before[topic] else None

    eventually(f"{topic} served by another broker", moved)


def test_broker_unload_drains_it_and_activate_brings_it_back(
    any_broker: BrokerProcess, namespace: str
) -> None:
    where = placement(any_broker, namespace)
    assert where is not None
    counts = {b: list(where.values()).count(b) for b in set(where.values())}
    drained = max(counts, key=lambda b: counts[b])
    theirs = {t for t, b in where.items() if b == drained}

    dry = as_json(any_broker, "brokers", "unload", "--broker-id", drained, "--dry-run")
    assert dry["total"] >= len(theirs)  # type: ignore[operator]
    assert placement(any_broker, namespace) == where, "a dry run moved topics"

    done = ok(any_broker, "brokers", "unload", "--broker-id", drained)
    assert done.startswith(f"Unloading broker {drained}: ")
    assert status_of(any_broker, drained) in ("draining", "drained")

    def emptied() -> dict[str, str] | None:
        now = placement(any_broker, namespace)
        if now is None or drained in now.values():
            return None
        return now if status_of(any_broker, drained) == "drained" else None

    after = eventually(f"broker {drained} drained", emptied)
    assert set(after) == set(where)
    served = as_json(any_broker, "topics", "list", "--broker", drained)["topics"]
    assert [t for t in served if t["name"] in theirs] == []  # type: ignore[union-attr, index]
    assert "no topics on broker" in ok(any_broker, "topics", "list", "--broker", drained)

    activated = ok(any_broker, "brokers", "activate", "--broker-id", drained)
    assert activated.strip() == f"Activated broker {drained} (admin_activate)"
    assert status_of(any_broker, drained) == "active"


def test_rebalance_dry_run_proposes_without_moving(
    cluster: LocalCluster, any_broker: BrokerProcess, namespace: str
) -> None:
    """After the drain one broker is empty: a dry run may propose moves onto it, and must
    not make them."""
    boss = leader(cluster, any_broker)
    before = placement(any_broker, namespace)
    answer = as_json(boss, "brokers", "rebalance", "--dry-run")
    assert answer["success"] is True
    ids = {int(b["broker_id"]) for b in brokers(any_broker)}
    for move in answer["proposed_moves"]:  # type: ignore[attr-defined]
        assert move["from_broker"] in ids and move["to_broker"] in ids
        assert move["from_broker"] != move["to_broker"]
    assert placement(any_broker, namespace) == before
    assert ok(boss, "brokers", "rebalance", "--dry-run").startswith("Dry run: ")


def test_replication_factor_of_a_topic_and_its_namespace_adds_and_drops_followers(
    any_broker: BrokerProcess, namespace: str
) -> None:
    """Issue 27 point 1: `replication-factor --set` on a topic, then on its namespace, and the
    leader's load manager adds or drops the topic's followers (seen in `topics describe`)."""
    topic = sorted(eventually("placed", lambda: placement(any_broker, namespace)))[0]

    def followers_are(count: int) -> Callable[[], bool | None]:
        def check() -> bool | None:
            described = as_json(any_broker, "topics", "describe", topic)
            found = described["replication"]["followers"]  # type: ignore[index]
            return True if len(found) == count else None

        return check

    eventually("one follower by default (3 brokers)", followers_are(1))
    shown = as_json(any_broker, "topics", "replication-factor", topic, "--set", "3")
    assert (shown["own"], shown["effective"], shown["source"]) == (3, 3, "topic")
    eventually("a second follower", followers_are(2))
    ok(any_broker, "namespaces", "replication-factor", namespace, "--set", "1")
    shown = as_json(any_broker, "topics", "replication-factor", topic, "--clear")
    assert (shown["own"], shown["namespace_factor"], shown["source"]) == (0, 1, "namespace")
    assert shown["effective"] == 1
    eventually("no follower: the owner alone", followers_are(0))
    shown = as_json(any_broker, "namespaces", "replication-factor", namespace, "--clear")
    assert shown["source"] == "default" and shown["effective"] == 2
    eventually("the default's follower again", followers_are(1))
