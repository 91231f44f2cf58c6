"""Load reports and the ranking arithmetic, against scores computed by hand from the formulas
of danube-reference.md §7.3-7.4 (each expected value shows its working)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from danube.machines.cluster.ranking import (
    BrokerLoad,
    LoadReport,
    Resource,
    ResourceUsage,
    Strategy,
    TopicLoad,
    blacklisted,
    imbalance,
    ranking,
    rebalance_sources,
    scores,
    topic_weight,
)


def report(
    broker: str,
    cpu: float = 0.0,
    mem: float = 0.0,
    *,
    topics: tuple[TopicLoad, ...] = (),
    disk: float = 0.0,
    net: float = 0.0,
    throughput: float = 0.0,
) -> LoadReport:
    usage = (
        ResourceUsage(Resource.CPU, cpu),
        ResourceUsage(Resource.MEMORY, mem),
        ResourceUsage(Resource.DISK_IO, disk),
        ResourceUsage(Resource.NETWORK_IO, net),
    )
    return LoadReport(broker, usage, topics, total_throughput_mbps=throughput)


def idle(n: int) -> tuple[TopicLoad, ...]:
    return tuple(TopicLoad(f"/ns/t{i}") for i in range(n))


def loads(*reports: LoadReport) -> dict[str, BrokerLoad]:
    return {r.broker_id: BrokerLoad.of(r) for r in reports}


# -- scores --------------------------------------------------------------------------------------


def test_fair_counts_topics_whatever_the_resources() -> None:
    got = scores(Strategy.FAIR, loads(report("a", 99, 99, topics=idle(3)), report("b")))
    assert got == {"a": 3, "b": 0}


@pytest.mark.parametrize(
    ("cpu", "mem", "topics", "expected"),
    [
        # W = 0.2·10 = 2;  0.3·2 + 0.35·50 + 0.35·30 = 0.6 + 17.5 + 10.5 = 28.6
        (50, 30, idle(10), 28),
        # W = 0.2·5 = 1;   0.3 + 7 + 7 = 14.3
        (20, 20, idle(5), 14),
        # W = 0.2·2 = 0.4; 0.12 + 3.5 + 3.5 = 7.12
        (10, 10, idle(2), 7),
        # W = 0.2·2 + 0.3·(2.0 + 0) + 0.3·((1+2) + (0+1)) + 0.2·(20000 + 0)/10000
        #   = 0.4 + 0.6 + 1.2 + 0.4 = 2.6;  0.3·2.6 + 0.35·10 + 0.35·20 = 0.78 + 10.5 = 11.28
        (
            10,
            20,
            (
                TopicLoad("/ns/a", byte_rate_mbps=2.0, producer_count=1, consumer_count=2,
                          backlog_messages=20_000),
                TopicLoad("/ns/b", consumer_count=1),
            ),
            11,
        ),
    ],
)  # fmt: skip
def test_balanced_weighs_topics_cpu_and_memory(
    cpu: float, mem: float, topics: tuple[TopicLoad, ...], expected: int
) -> None:
    got = scores(Strategy.BALANCED, loads(report("x", cpu, mem, topics=topics), report("idle")))
    assert got["x"] == expected
    assert got["idle"] == 0


def test_balanced_counts_topics_until_some_broker_reports_cpu_or_memory() -> None:
    quiet = loads(report("a", topics=idle(3), disk=500), report("b", topics=idle(1)))
    assert scores(Strategy.BALANCED, quiet) == {"a": 3, "b": 1}
    # One broker reporting CPU switches the whole cluster to the resource formula:
    # a: 0.3·0.6 = 0.18; b: 0.3·0.2 + 0.35·10 = 3.56.
    busy = loads(report("a", topics=idle(3)), report("b", 10, topics=idle(1)))
    assert scores(Strategy.BALANCED, busy) == {"a": 0, "b": 3}


def test_topic_weight_sums_count_throughput_connections_and_backlog() -> None:
    topics = (
        TopicLoad("/ns/a", byte_rate_mbps=1.5, producer_count=2, backlog_messages=5_000),
        TopicLoad("/ns/b", byte_rate_mbps=0.5, consumer_count=4, backlog_messages=15_000),
    )
    # 0.2·2 + 0.3·2.0 + 0.3·6 + 0.2·2 = 0.4 + 0.6 + 1.8 + 0.4
    assert topic_weight(topics) == pytest.approx(3.2)
    assert topic_weight(()) == 0.0


def test_weighted_load_scores_each_broker_by_its_bottleneck() -> None:
    # Maxima: cpu 90, mem 30, disk 1 (floor), net 100, throughput 8, topic load 1 (floor).
    cpu_bound = report("c", 90, 30, throughput=1.0)
    thr_bound = report("t", 30, 15, net=50, throughput=8.0)
    net_bound = report("n", 10, 10, net=100, throughput=2.0)
    got = scores(Strategy.WEIGHTED_LOAD, loads(cpu_bound, thr_bound, net_bound))
    assert got == {
        # cpu 1 (peak, first in Danube's order), mem 1, thr 1/8:
        # 0.5·1 + 0.2·1 + 0.15·0.125 + 0.15·0 = 0.71875
        "c": 71,
        # thr 1 (peak), net 0.5, cpu 1/3, mem 0.5: 0.5 + 0.1 + 0.05 + 0.075 = 0.725
        "t": 72,
        # net 1 (peak), thr 0.25, cpu 1/9, mem 1/3: 0.5 + 0.05 + 0.01667 + 0.05 = 0.61667
        "n": 61,
    }


def test_weighted_load_below_70_percent_and_topic_or_disk_bottlenecks() -> None:
    conns = tuple(TopicLoad(f"/ns/{i}", producer_count=1, consumer_count=1) for i in range(5))
    # Maxima: cpu 40, mem 40, disk 1000, topic load W(h) = 0.2·5 + 0.3·10 = 4.
    quiet = report("q", 20, 20, topics=idle(1))  # W = 0.2
    heavy = report("h", 10, 10, topics=conns)
    maxed = report("m", 40, 40)
    disky = report("d", 10, 10, disk=1000)
    got = scores(Strategy.WEIGHTED_LOAD, loads(quiet, heavy, maxed, disky))
    assert got == {
        # peak 0.5 <= 0.7: 0.25·0.05 + 0.25·0.5 + 0.25·0.5 = 0.2625
        "q": 26,
        # topic 1 (peak): 0.5·1 + 0.2·0.25 + 0.2·0.25 + 0.1·0 = 0.6
        "h": 60,
        # cpu 1 and mem 1, cpu tested first: 0.5 + 0.2 = 0.7
        "m": 70,
        # disk 1 is scored like topic load: 0.5·0 + 0.2·0.25 + 0.2·0.25 = 0.1
        "d": 10,
    }


def test_ranking_is_ascending_with_ties_by_broker_id() -> None:
    assert ranking({"b": 3, "c": 1, "a": 3, "d": 0}) == [("d", 0), ("c", 1), ("a", 3), ("b", 3)]


# -- imbalance -----------------------------------------------------------------------------------


def test_imbalance_flags_brokers_outside_the_band() -> None:
    stats = imbalance({"a": 12, "b": 10, "c": 10, "d": 2})
    # mean 8.5; σ = sqrt((3.5² + 1.5² + 1.5² + 6.5²)/4) = sqrt(14.75); CV = σ/8.5 ≈ 0.452 > 0.3
    # so k = 0.5, σ' = max(σ, 1.7, 2) = σ; band = 8.5 ± 1.92 → over > 10.42, under < 6.58
    assert stats.mean == 8.5
    assert stats.std_deviation == pytest.approx(math.sqrt(14.75))
    assert stats.coefficient_of_variation == pytest.approx(math.sqrt(14.75) / 8.5)
    assert (stats.max_load, stats.min_load, stats.brokers) == (12, 2, 4)
    assert stats.overloaded == ("a",)
    assert stats.underloaded == ("d",)
    assert rebalance_sources({"a": 12, "b": 10, "c": 10, "d": 2}, stats) == ("a",)


def test_imbalance_floor_keeps_small_counts_from_flapping() -> None:
    # mean 1.5, σ 0.5, CV 0.33: k = 0.5 but σ' = max(0.5, 0.3, 2) = 2, band ±1: nobody.
    stats = imbalance({"a": 2, "b": 1})
    assert stats.coefficient_of_variation == pytest.approx(1 / 3)
    assert (stats.overloaded, stats.underloaded) == ((), ())
    assert rebalance_sources({"a": 2, "b": 1}, stats) == ()


def test_without_overloaded_brokers_every_broker_above_the_mean_is_a_source() -> None:
    loads_ = {"c": 10, "a": 10, "b": 10, "d": 5}
    stats = imbalance(loads_)
    # mean 8.75, σ = sqrt(4.6875) ≈ 2.165, CV ≈ 0.247 → k = 1, band ±2.165: over > 10.9
    # (nobody), under < 6.58 (d); spread 5 > max(0.875, 2), so a, b, c are sources.
    assert stats.overloaded == ()
    assert stats.underloaded == ("d",)
    assert rebalance_sources(loads_, stats) == ("a", "b", "c")
    # mean 2.5, σ ≈ 0.87, CV ≈ 0.35 → k = 0.5, σ' = 2, band ±1: d (1) is underloaded, but a
    # spread of 2 is not above max(0.25, 2): not worth a move.
    narrow = {"a": 3, "b": 3, "c": 3, "d": 1}
    assert imbalance(narrow).underloaded == ("d",)
    assert rebalance_sources(narrow, imbalance(narrow)) == ()


def test_imbalance_of_fewer_than_two_brokers_or_no_load_is_zero() -> None:
    assert imbalance({"a": 50}).coefficient_of_variation == 0.0
    assert imbalance({}).brokers == 0
    idle_cluster = imbalance({"a": 0, "b": 0})
    assert (idle_cluster.coefficient_of_variation, idle_cluster.overloaded) == (0.0, ())


def test_estimated_topic_load_prefers_light_topics() -> None:
    topic = TopicLoad(
        "/ns/a", byte_rate=2_000_000, producer_count=1, consumer_count=3, backlog_messages=50_000
    )
    # 0.5·2 MB/s + 0.3·4 + 0.2·5 = 1 + 1.2 + 1
    assert topic.estimated_load == pytest.approx(3.2)
    assert TopicLoad("/ns/idle").estimated_load == 0.0


@pytest.mark.parametrize(
    ("topic", "patterns", "expected"),
    [
        ("/ns/t", ["/ns/t"], True),
        ("/ns/t", ["/other/x", "/ns/*"], True),
        ("/ns2/t", ["/ns/*"], False),
        ("/nsx/t", ["/ns/*"], False),
        ("/ns/t", ["/ns/u"], False),
        ("/ns/t", [], False),
    ],
)
def test_blacklist_matches_exact_names_and_namespaces(
    topic: str, patterns: list[str], expected: bool
) -> None:
    assert blacklisted(topic, patterns) is expected


# -- JSON ------------------------------------------------------------------------------------------

DANUBE_REPORT: dict[str, Any] = {
    "resources_usage": [
        {"resource": "CPU", "usage": 12.5},
        {"resource": "Memory", "usage": 40},
        {"resource": "DiskIO", "usage": 1024.0},
        {"resource": "NetworkIO", "usage": 2048.0},
    ],
    "topics": [
        {
            "topic_name": "/default/orders",
            "message_rate": 10,
            "byte_rate": 2000,
            "byte_rate_mbps": 0.002,
            "producer_count": 1,
            "consumer_count": 2,
            "subscription_count": 1,
            "backlog_messages": 0,
        }
    ],
    "total_throughput_mbps": 0.002,
    "total_message_rate": 10,
    "total_lag_messages": 0,
    "timestamp": 1_700_000_000,
    "broker_id": 7421,
}


def test_load_report_reads_danube_json_and_writes_it_back() -> None:
    parsed = LoadReport.from_json(DANUBE_REPORT)
    assert parsed.broker_id == "7421"
    assert parsed.usage(Resource.MEMORY) == 40.0
    assert parsed.topics[0].consumer_count == 2
    assert parsed.to_json() == {**DANUBE_REPORT, "resources_usage": [
        {"resource": "CPU", "usage": 12.5},
        {"resource": "Memory", "usage": 40.0},
        {"resource": "DiskIO", "usage": 1024.0},
        {"resource": "NetworkIO", "usage": 2048.0},
    ]}  # fmt: skip
    assert LoadReport.from_json(parsed.to_json()) == parsed


def test_load_report_defaults_like_danubes_serde_and_ignores_unknown_fields() -> None:
    minimal = {"resources_usage": [], "timestamp": 5, "broker_id": "b1", "future_field": [1]}
    parsed = LoadReport.from_json(minimal)
    assert parsed == LoadReport("b1", timestamp=5)
    assert parsed.usage(Resource.CPU) == 0.0


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in DANUBE_REPORT.items() if k != key}


def _topic_with(**fields: Any) -> dict[str, Any]:
    return {**DANUBE_REPORT, "topics": [{**DANUBE_REPORT["topics"][0], **fields}]}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "load report: expected a JSON object"),
        (_without("resources_usage"), "missing field 'resources_usage'"),
        (_without("timestamp"), "missing field 'timestamp'"),
        (_without("broker_id"), "missing field 'broker_id'"),
        ({**DANUBE_REPORT, "broker_id": -1}, "broker_id: expected an id"),
        ({**DANUBE_REPORT, "topics": {}}, "topics: expected a list"),
        (
            {**DANUBE_REPORT, "resources_usage": [{"resource": "GPU", "usage": 1}]},
            "expected one of CPU, Memory, DiskIO, NetworkIO, got 'GPU'",
        ),
        (
            {**DANUBE_REPORT, "resources_usage": [{"resource": "CPU", "usage": -1}]},
            "usage: expected a finite number >= 0",
        ),
        (
            {**DANUBE_REPORT, "resources_usage": [{"resource": "CPU", "usage": "high"}]},
            "usage: expected a finite number >= 0",
        ),
        (
            {**DANUBE_REPORT, "resources_usage": [{"resource": "CPU", "usage": math.inf}]},
            "usage: expected a finite number >= 0",
        ),
        (_topic_with(message_rate=1.5), "message_rate: expected a non-negative integer"),
        (_topic_with(producer_count=True), "producer_count: expected a non-negative integer"),
        (_topic_with(topic_name=""), "topic_name: expected a topic name"),
        ({**DANUBE_REPORT, "total_message_rate": -3}, "total_message_rate: expected a non-neg"),
    ],
)
def test_malformed_load_reports_are_refused_with_the_field_named(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        LoadReport.from_json(value)


def test_topic_load_requires_every_danube_field() -> None:
    entry = dict(DANUBE_REPORT["topics"][0])
    del entry["backlog_messages"]
    with pytest.raises(ValueError, match=r"topics\[/default/orders\]: missing field"):
        TopicLoad.from_json(entry)
