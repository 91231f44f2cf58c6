"""Broker load reports and how the load manager scores them (danube-reference.md §7.2-7.4,
spec/cluster.md "Load manager").

The formulas are Danube's, down to the integer truncation of every score, so that a Danube
operator reading `GetClusterBalance` sees the numbers, thresholds and presets
they know. All of it is pure arithmetic on frozen values: the load manager decides with it
and the tests check it against hand-computed examples.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from danube.machines.cluster.records import broker_id_from_json, broker_id_to_json
from danube.metadata.model import JSONValue
from danube.values.load_manager_config import Strategy as Strategy

# -- load reports (Danube's JSON, §7.2) --------------------------------------------------------


class Resource(enum.Enum):
    """Danube's `ResourceType`, spelled as its serde names."""

    CPU = "CPU"
    MEMORY = "Memory"
    DISK_IO = "DiskIO"
    NETWORK_IO = "NetworkIO"


_MISSING: Any = object()


def _object(value: JSONValue, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def _count(data: dict[str, Any], key: str, what: str, default: int = _MISSING) -> int:
    """A Rust u64/usize field: a non-negative JSON integer (not a float, not a bool)."""
    value = data.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{what}: missing field {key!r}")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what}.{key}: expected a non-negative integer, got {value!r}")
    return value


def _amount(data: dict[str, Any], key: str, what: str, default: float = _MISSING) -> float:
    """A Rust f64 field that only ever holds a rate or a percentage: finite, not negative."""
    value = data.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{what}: missing field {key!r}")
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{what}.{key}: expected a finite number >= 0, got {value!r}")
    return float(value)


def _list(data: dict[str, Any], key: str, what: str, default: list[Any] = _MISSING) -> list[Any]:
    value = data.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{what}: missing field {key!r}")
    if not isinstance(value, list):
        raise ValueError(f"{what}.{key}: expected a list, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """CPU and memory in percent, disk and network I/O in bytes per second."""

    resource: Resource
    usage: float

    @classmethod
    def from_json(cls, value: JSONValue) -> ResourceUsage:
        data = _object(value, "resources_usage[]")
        try:
            resource = Resource(data.get("resource"))
        except ValueError:
            names = ", ".join(r.value for r in Resource)
            raise ValueError(
                f"resources_usage[].resource: expected one of {names}, got {data.get('resource')!r}"
            ) from None
        return cls(resource, _amount(data, "usage", "resources_usage[]"))

    def to_json(self) -> dict[str, Any]:
        return {"resource": self.resource.value, "usage": self.usage}


@dataclass(frozen=True, slots=True)
class TopicLoad:
    """One topic's line of a load report; rates are per second since the previous report."""

    topic_name: str
    message_rate: int = 0
    byte_rate: int = 0
    byte_rate_mbps: float = 0.0
    producer_count: int = 0
    consumer_count: int = 0
    subscription_count: int = 0
    backlog_messages: int = 0

    @property
    def estimated_load(self) -> float:
        """How disruptive moving the topic is: rebalancing moves the lightest one first.
        Danube reads MB/s from `byte_rate` here (not `byte_rate_mbps`)."""
        return (
            self.byte_rate / 1_000_000 * 0.5
            + (self.producer_count + self.consumer_count) * 0.3
            + self.backlog_messages / 10_000 * 0.2
        )

    @classmethod
    def from_json(cls, value: JSONValue) -> TopicLoad:
        data = _object(value, "topics[]")
        name = data.get("topic_name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"topics[].topic_name: expected a topic name, got {name!r}")
        what = f"topics[{name}]"
        return cls(
            name,
            _count(data, "message_rate", what),
            _count(data, "byte_rate", what),
            _amount(data, "byte_rate_mbps", what),
            _count(data, "producer_count", what),
            _count(data, "consumer_count", what),
            _count(data, "subscription_count", what),
            _count(data, "backlog_messages", what),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_name": self.topic_name,
            "message_rate": self.message_rate,
            "byte_rate": self.byte_rate,
            "byte_rate_mbps": self.byte_rate_mbps,
            "producer_count": self.producer_count,
            "consumer_count": self.consumer_count,
            "subscription_count": self.subscription_count,
            "backlog_messages": self.backlog_messages,
        }


@dataclass(frozen=True, slots=True)
class LoadReport:
    """`/cluster/load/<broker_id>`. Parsed like Danube's serde struct: `topics` and the
    totals may be absent (zero), other fields are required, unknown fields are ignored (a
    newer broker may report more during a rolling upgrade)."""

    broker_id: str
    resources_usage: tuple[ResourceUsage, ...] = ()
    topics: tuple[TopicLoad, ...] = ()
    total_throughput_mbps: float = 0.0
    total_message_rate: int = 0
    total_lag_messages: int = 0
    timestamp: int = 0

    def usage(self, resource: Resource) -> float:
        """The reported usage of `resource` (the last entry wins, as in Danube), else 0."""
        found = 0.0
        for entry in self.resources_usage:
            if entry.resource is resource:
                found = entry.usage
        return found

    @classmethod
    def from_json(cls, value: JSONValue) -> LoadReport:
        data = _object(value, "load report")
        if "broker_id" not in data:
            raise ValueError("load report: missing field 'broker_id'")
        broker_id = broker_id_from_json(data["broker_id"])
        if broker_id is None:
            raise ValueError(f"load report.broker_id: expected an id, got {data['broker_id']!r}")
        return cls(
            broker_id,
            tuple(
                ResourceUsage.from_json(v) for v in _list(data, "resources_usage", "load report")
            ),
            tuple(TopicLoad.from_json(v) for v in _list(data, "topics", "load report", [])),
            _amount(data, "total_throughput_mbps", "load report", 0.0),
            _count(data, "total_message_rate", "load report", 0),
            _count(data, "total_lag_messages", "load report", 0),
            _count(data, "timestamp", "load report"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "resources_usage": [r.to_json() for r in self.resources_usage],
            "topics": [t.to_json() for t in self.topics],
            "total_throughput_mbps": self.total_throughput_mbps,
            "total_message_rate": self.total_message_rate,
            "total_lag_messages": self.total_lag_messages,
            "timestamp": self.timestamp,
            "broker_id": broker_id_to_json(self.broker_id),
        }


# -- scores (§7.3) -------------------------------------------------------------------------------


def topic_weight(topics: Sequence[TopicLoad], count: int | None = None) -> float:
    """Danube's weighted topic load W: count, throughput, connections and backlog. With
    `count`, `topics` are only those of `count` topics whose figures are not all zero (the
    others add nothing to the sums): the load manager keeps those as they change."""
    count = len(topics) if count is None else count
    if not count:
        return 0.0
    return (
        0.2 * count
        + 0.3 * sum(t.byte_rate_mbps for t in topics)
        + 0.3 * sum(t.producer_count + t.consumer_count for t in topics)
        + 0.2 * sum(t.backlog_messages for t in topics) / 10_000
    )


@dataclass(frozen=True, slots=True)
class BrokerLoad:
    """The figures of one broker's report that the strategies read, computed once per report
    so that ranking a cluster costs one step per broker, not per topic."""

    topics: int
    topic_weight: float
    cpu: float
    memory: float
    disk_io: float
    network_io: float
    throughput_mbps: float

    @classmethod
    def of(
        cls,
        report: LoadReport,
        *,
        count: int | None = None,
        topics: Sequence[TopicLoad] | None = None,
    ) -> BrokerLoad:
        """The report's figures; with `count` and `topics`, those instead of the report's
        topics (`topic_weight`'s shorthand: the topics with figures, of `count`)."""
        if topics is None:
            topics = report.topics
        count = len(topics) if count is None else count
        return cls(
            count,
            topic_weight(topics, count),
            report.usage(Resource.CPU),
            report.usage(Resource.MEMORY),
            report.usage(Resource.DISK_IO),
            report.usage(Resource.NETWORK_IO),
            report.total_throughput_mbps,
        )


def scores(strategy: Strategy, loads: Mapping[str, BrokerLoad]) -> dict[str, int]:
    """Every broker's score under `strategy`; lower is less loaded."""
    if strategy is Strategy.FAIR:
        return {broker: load.topics for broker, load in loads.items()}
    if strategy is Strategy.BALANCED:
        return _balanced(loads)
    return _weighted(loads)


def _balanced(loads: Mapping[str, BrokerLoad]) -> dict[str, int]:
    # Until some broker reports CPU or memory (startup, or no monitor), count topics, so that
    # the first topics spread instead of all landing on the broker that reported first.
    if not any(load.cpu > 0 or load.memory > 0 for load in loads.values()):
        return {broker: load.topics for broker, load in loads.items()}
    return {
        broker: int(0.3 * load.topic_weight + 0.35 * load.cpu + 0.35 * load.memory)
        for broker, load in loads.items()
    }


def _weighted(loads: Mapping[str, BrokerLoad]) -> dict[str, int]:
    """Every figure as a fraction of the cluster's largest (at least 1.0); a broker with one
    figure above 70% is scored mostly by that bottleneck."""
    values = loads.values()
    top_cpu = max([1.0, *(v.cpu for v in values)])
    top_mem = max([1.0, *(v.memory for v in values)])
    top_disk = max([1.0, *(v.disk_io for v in values)])
    top_net = max([1.0, *(v.network_io for v in values)])
    top_thr = max([1.0, *(v.throughput_mbps for v in values)])
    top_topic = max([1.0, *(v.topic_weight for v in values)])
    result = {}
    for broker, load in loads.items():
        cpu = load.cpu / top_cpu
        mem = load.memory / top_mem
        disk = load.disk_io / top_disk
        net = load.network_io / top_net
        thr = load.throughput_mbps / top_thr
        topic = load.topic_weight / top_topic
        peak = max(cpu, mem, disk, net, thr, topic)
        if peak <= 0.7:
            score = 0.25 * topic + 0.25 * cpu + 0.25 * mem + 0.15 * thr + 0.1 * net
        elif peak == cpu:  # Danube tests the bottleneck in this order
            score = 0.5 * cpu + 0.2 * mem + 0.15 * thr + 0.15 * topic
        elif peak == mem:
            score = 0.5 * mem + 0.2 * cpu + 0.15 * thr + 0.15 * topic
        elif peak == thr:
            score = 0.5 * thr + 0.2 * net + 0.15 * cpu + 0.15 * mem
        elif peak == net:
            score = 0.5 * net + 0.2 * thr + 0.15 * cpu + 0.15 * mem
        else:  # topic load, or disk (which Danube scores like topic load)
            score = 0.5 * topic + 0.2 * cpu + 0.2 * mem + 0.1 * thr
        result[broker] = int(100 * score)
    return result


def ranking(broker_scores: Mapping[str, int]) -> list[tuple[str, int]]:
    """Least loaded first; equal scores by broker id, so that every replica of the load
    manager ranks alike whatever order it learnt of the brokers in."""
    return sorted(broker_scores.items(), key=lambda item: (item[1], item[0]))


# -- imbalance (§7.4) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Imbalance:
    """How unevenly the scores spread; `GetClusterBalance` reports these."""

    brokers: int
    mean: float
    std_deviation: float
    coefficient_of_variation: float
    max_load: float
    min_load: float
    overloaded: tuple[str, ...]
    underloaded: tuple[str, ...]


def imbalance(broker_scores: Mapping[str, int]) -> Imbalance:
    """Coefficient of variation (population σ / mean) and the brokers outside the band
    mean ± k·σ', where σ' = max(σ, 0.2·mean, 2) keeps small clusters with few topics from
    flapping and k = 0.5 when the cluster is clearly uneven (CV > 0.3), else 1."""
    if len(broker_scores) < 2:
        return Imbalance(len(broker_scores), 0.0, 0.0, 0.0, 0.0, 0.0, (), ())
    values = [float(v) for v in broker_scores.values()]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    cv = std / mean if mean > 0 else 0.0
    band = (0.5 if cv > 0.3 else 1.0) * max(std, 0.2 * mean, 2.0)
    return Imbalance(
        len(values),
        mean,
        std,
        cv,
        max(values),
        min(values),
        tuple(b for b, s in _heaviest_first(broker_scores) if s > mean + band),
        tuple(b for b, s in ranking(broker_scores) if s < mean - band),
    )


def _heaviest_first(broker_scores: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(broker_scores.items(), key=lambda item: (-item[1], item[0]))


def rebalance_sources(broker_scores: Mapping[str, int], stats: Imbalance) -> tuple[str, ...]:
    """Brokers to move a topic away from, most loaded first: the overloaded ones; or, when
    none is but some broker is underloaded and the spread is real (max − min above
    max(0.1·mean, 2)), every broker above the mean."""
    if stats.overloaded:
        return stats.overloaded
    if stats.underloaded and stats.max_load - stats.min_load > max(0.1 * stats.mean, 2.0):
        return tuple(b for b, s in _heaviest_first(broker_scores) if s > stats.mean)
    return ()


def blacklisted(topic: str, patterns: Sequence[str]) -> bool:
    """`blacklist_topics`: an exact topic name, or `/namespace/*` for a whole namespace."""
    for pattern in patterns:
        if pattern == topic:
            return True
        namespace = pattern[:-1]
        if pattern.endswith("/*") and topic.startswith(namespace) and len(topic) > len(namespace):
            return True
    return False
