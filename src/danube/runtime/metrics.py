"""A broker's Prometheus metrics (spec/observability.md).

Gauges describing current state (topics, producers, consumers, backlog, upload lag) and the
per-topic message counters are read from the core when Prometheus scrapes (`node.stats`), so
the hot paths pay nothing for them. Events the core does not keep (RPC outcomes, send
outcomes and latency, deliveries, nacks, WAL I/O) are plain integers and small histograms
bumped by the driver once per call, batch or group commit, not once per message: no
prometheus_client lock on the publish path. Everything is exported by one custom collector in
the broker's own registry, with the const label `broker="<broker_id>"` on every sample.
"""

from __future__ import annotations

import bisect
import importlib.metadata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from danube.machines.dispatch.types import DropReason
from danube.machines.memory.connections import ConnectionGate
from danube.machines.node import stats
from danube.machines.node.core import BrokerCore
from danube.runtime.metrics_exposition import Continued, exposition_parts, histogram_pieces
from danube.runtime.poison_metrics import poison_families
from danube.runtime.replication_metrics import replication_families
from danube.runtime.stage_metrics import StageLatency, stage_families

LATENCY_BUCKETS_MS = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
SIZE_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
NOT_SERVED = ""
"""The topic label of sends for topics this broker does not serve: a client naming random
topics must not grow the number of series."""
PER_TOPIC_LABELS = frozenset({"topic", "subscription"})
"""Dropped (their samples added up per broker) with `metrics.per_topic: false`."""


def _version() -> str:
    try:
        return importlib.metadata.version("pydanube")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


VERSION = _version()
"""Read once: the package metadata lookup costs about 0.25 ms, too much for every scrape."""


_EDGES: dict[tuple[float, ...], np.ndarray] = {}


def _edges(bounds: tuple[float, ...]) -> np.ndarray:
    found = _EDGES.get(bounds)
    if found is None:
        found = _EDGES[bounds] = np.asarray(bounds, dtype=np.float64)
        found.flags.writeable = False  # shared: no histogram may change another's
    return found


class Histogram:
    """Bucket counts, sum and count; `le` buckets as Prometheus means them."""

    __slots__ = ("bounds", "counts", "edges", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.edges = _edges(self.bounds)
        """The bounds as numpy takes them, converted once rather than on every batch, and
        shared by every histogram with these bounds (two per topic: 200 bytes each, issue 23)."""
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_many(self, values: np.ndarray) -> None:
        """A batch's values in one numpy pass, whatever its size: no Python work per
        message on the batched path."""
        slots = np.searchsorted(self.edges, values, side="left")
        self.counts += np.bincount(slots, minlength=len(self.counts))
        self.total += float(values.sum())

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, out = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts.tolist(), strict=True):
            cumulative += count
            out.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
        return out


class WalMetrics:
    """Storage counters, bumped by the WAL drivers (`SegmentFiles`, `BrokerRuntime`)."""

    def __init__(self) -> None:
        self.appends = 0
        """Records handed to WALs (one per message, counted per publish call or batch)."""
        self.append_bytes = 0
        """Frame bytes written to segment files."""
        self.flushes = 0
        self.rotations = 0
        self.flush_latency_ms = Histogram(LATENCY_BUCKETS_MS)
        self.group_commit = Histogram(GROUP_BUCKETS)
        """Records acknowledged together (one group commit: one write and fsync)."""

    def flushed(self, seconds: float) -> None:
        self.flushes += 1
        self.flush_latency_ms.observe(seconds * 1000)


def _counter(name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=["broker", *labels])


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["broker", *labels])


def _histogram(name: str, doc: str, labels: Sequence[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=["broker", *labels])


class BrokerMetrics:
    """One broker's metrics and its registry (never prometheus_client's global one, so that
    several brokers in one process, as in tests, keep apart)."""

    def __init__(
        self,
        core: BrokerCore,
        broker_id: str,
        mode: str,
        *,
        leading: Callable[[], bool] = lambda: True,
        per_topic: bool = True,
    ) -> None:
        self.core = core
        self.broker_id = broker_id
        self.mode = mode
        self.per_topic = per_topic
        """False: no series names a topic or subscription (`metrics.per_topic`), so however
        many topics clients create, a scrape has the same number of series."""
        self.leading = leading
        """Whether this broker is the cluster's leader (a standalone broker always is)."""
        self.wal = WalMetrics()
        self.stages = StageLatency()
        """Where a reliable message's time goes (`danube_stage_latency_ms`)."""
        self.rpcs: dict[tuple[str, str, str], int] = {}
        """(service, method, grpc status name) -> calls that ended so."""
        self.sends: dict[tuple[str, str, str], int] = {}
        """(topic, result, error code) -> messages sent."""
        self.send_latency: dict[str, Histogram] = {}
        self.message_size: dict[str, Histogram] = {}
        self.delivered: dict[tuple[str, str], list[int]] = {}
        """(topic, subscription) -> [messages, bytes] sent to consumers."""
        self.nacks: dict[tuple[str, str], int] = {}
        self.redirects = 0
        """Topic lookups answered with a Redirect to another broker."""
        self.schema_checks: dict[tuple[str, str], int] = {}
        self.schema_parses: dict[str, int] = {}
        """Schema definitions a caller had parsed (and, Protobuf, compiled), by schema type:
        the registry's expensive step, which no unauthenticated call may reach."""
        """(topic, validation policy) -> messages the schema gate inspected."""
        self.schema_failures: dict[tuple[str, str], int] = {}
        """(topic, problem) -> inspected messages that did not fit (refused or warned)."""
        self.imbalance: Callable[[], float] | None = None
        """Cluster mode: the load manager's coefficient of variation of broker loads."""
        self.rebalancing: Callable[[], tuple[Mapping[str, int], int]] | None = None
        """Cluster mode: (moves made by reason, moves that failed) as this broker led."""
        self.replication: Any = None
        """Cluster mode: the replication port (`runtime.replication_port.ReplicationPort`)."""
        self.authz: dict[tuple[str, str, bool], int] = {}
        """(resource scope, permission, allowed) -> authorization decisions (auth on)."""
        self.authn_failures: dict[str, int] = {}
        """Calls refused UNAUTHENTICATED, by kind (missing, invalid)."""
        self.connections: Mapping[str, ConnectionGate] = {}
        """The broker's connection gates by port, `client` and `admin`
        (`danube_broker_connections*`); empty: no cap."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        # The process's own series (process_cpu_seconds_total, process_resident_memory_bytes,
        # process_open_fds, ...), the interpreter's version and its garbage collections:
        # what a dashboard or an alert on the broker process needs beside ours.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)

    def exposition(self) -> bytes:
        return b"".join(self.exposition_parts())

    def exposition_parts(self) -> list[bytes]:
        """The exposition, a part per metric family (`exposition_parts`): what the metrics
        port sends."""
        return exposition_parts(self.registry)

    # -- events (driver side) ---------------------------------------------------------------

    def authz_done(self, resource: str, permission: str, allowed: bool) -> None:
        key = (resource, permission, allowed)
        self.authz[key] = self.authz.get(key, 0) + 1

    def authn_failed(self, kind: str) -> None:
        self.authn_failures[kind] = self.authn_failures.get(kind, 0) + 1

    def rpc_done(self, service: str, method: str, status: str) -> None:
        key = (service, method, status)
        self.rpcs[key] = self.rpcs.get(key, 0) + 1

    def _topic_label(self, topic: str) -> str:
        """Without per-topic series every send shares one key: the tables stay one entry."""
        return topic if self.per_topic and self.core.serves(topic) else NOT_SERVED

    def send_failed(self, topic: str, count: int, error_code: str) -> None:
        key = (self._topic_label(topic), "error", error_code)
        self.sends[key] = self.sends.get(key, 0) + count

    def sent(self, topic: str, size: int, seconds: float, *, stored: bool) -> None:
        """One message (SendMessage) acknowledged after `seconds`."""
        label = self._topic_label(topic)
        key = (label, "ok", "")
        self.sends[key] = self.sends.get(key, 0) + 1
        self._latency(label).observe(seconds * 1000)
        self._sizes(label).observe(size)
        if stored:
            self.wal.appends += 1

    def sent_batch(self, topic: str, sizes: np.ndarray, seconds: float, *, stored: bool) -> None:
        """A batch (PublishBatch) acknowledged after `seconds`: one latency observation."""
        label = self._topic_label(topic)
        key = (label, "ok", "")
        self.sends[key] = self.sends.get(key, 0) + len(sizes)
        self._latency(label).observe(seconds * 1000)
        self._sizes(label).observe_many(sizes)
        if stored:
            self.wal.appends += len(sizes)

    def _latency(self, topic: str) -> Histogram:
        found = self.send_latency.get(topic)
        if found is None:
            found = self.send_latency[topic] = Histogram(LATENCY_BUCKETS_MS)
        return found

    def _sizes(self, topic: str) -> Histogram:
        found = self.message_size.get(topic)
        if found is None:
            found = self.message_size[topic] = Histogram(SIZE_BUCKETS)
        return found

    def consumer_sent(self, target: tuple[str, str], messages: int, size: int) -> None:
        counts = self.delivered.get(target)
        if counts is None:
            counts = self.delivered[target] = [0, 0]
        counts[0] += messages
        counts[1] += size

    def redirected(self) -> None:
        self.redirects += 1

    def schema_checked(self, topic: str, policy: str, problem: str | None) -> None:
        """One message the schema gate inspected (topics with a policy only)."""
        key = (topic, policy)
        self.schema_checks[key] = self.schema_checks.get(key, 0) + 1
        if problem is not None:
            failure = (topic, problem)
            self.schema_failures[failure] = self.schema_failures.get(failure, 0) + 1

    def schema_parsed(self, schema_type: str) -> None:
        """A definition sent by a caller (RegisterSchema, CheckCompatibility) went to the
        parser, whatever it found."""
        self.schema_parses[schema_type] = self.schema_parses.get(schema_type, 0) + 1

    def nacked(self, topic: str, subscription: str) -> None:
        key = (topic, subscription)
        self.nacks[key] = self.nacks.get(key, 0) + 1

    # -- scrape side ----------------------------------------------------------------------------

    def forget_removed(self, topics: list[stats.TopicStats]) -> None:
        """Drops the series of topics this broker no longer serves (deleted or moved away)
        and of subscriptions no longer on them (unsubscribed, deleted), keeping label
        cardinality to what it serves."""
        served = {t.topic for t in topics}
        subscribed = {(t.topic, s.name) for t in topics for s in t.subscriptions}
        for table in (self.sends, self.schema_checks, self.schema_failures):
            for key in [k for k in table if k[0] != NOT_SERVED and k[0] not in served]:
                del table[key]
        for table in (self.delivered, self.nacks):
            for key in [k for k in table if k not in subscribed]:
                del table[key]
        for histograms in (self.send_latency, self.message_size):
            for topic in [t for t in histograms if t != NOT_SERVED and t not in served]:
                del histograms[topic]


class _Collector(Collector):
    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        if self._metrics.per_topic:
            yield from families
        else:
            yield from _summed(families)

    def _families(self) -> Iterator[Metric]:
        m = self._metrics
        broker = m.broker_id
        topics = stats.topic_stats(m.core)
        m.forget_removed(topics)
        yield from _topic_families(broker, topics)
        yield from _event_families(m)
        yield from _drop_families(broker, m.core)
        yield from poison_families(broker, m.core)
        yield from _wal_families(broker, m.wal)
        yield from stage_families(broker, m.stages)
        yield from _security_families(m)
        if m.connections:
            yield from _connection_families(broker, m.connections)
        yield from _memory_families(broker, stats.memory_use(m.core))
        if m.replication is not None:
            yield from replication_families(broker, m.core, m.replication)
        info = _gauge("danube_broker_info", "Version and mode of this broker.", ["version", "mode"])
        info.add_metric([broker, VERSION, m.mode], 1)
        yield info
        leader = _gauge(
            "danube_leader_election_state",
            "1 while this broker is the cluster leader (a standalone broker always is).",
        )
        leader.add_metric([broker], 1 if m.leading() else 0)
        yield leader
        if m.imbalance is not None and m.leading():
            cv = _gauge(
                "danube_cluster_imbalance_cv",
                "Coefficient of variation of the brokers' load scores (the leader's view).",
            )
            cv.add_metric([broker], m.imbalance())
            yield cv
        if m.rebalancing is not None:
            made, failed = m.rebalancing()
            moves = _counter(
                "danube_rebalancing_moves_total",
                "Topic moves this broker made as leader (rebalancing or a manual rebalance).",
                ["reason"],
            )
            for reason in sorted(made):
                moves.add_metric([broker, reason], made[reason])
            yield moves
            failures = _counter(
                "danube_rebalancing_failures_total",
                "Moves whose transaction failed or found the cluster changed.",
                [],
            )
            failures.add_metric([broker], failed)
            yield failures


def summed_per_broker(family: Metric) -> Metric:
    """The family without its topic and subscription labels: samples left with the same
    labels are added up (counters and gauges per broker, histogram buckets per bound). A
    family without those labels is returned as it is."""
    if not any(PER_TOPIC_LABELS & sample.labels.keys() for sample in family.samples):
        return family
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in family.samples:
        labels = tuple(
            sorted((k, v) for k, v in sample.labels.items() if k not in PER_TOPIC_LABELS)
        )
        key = (sample.name, labels)
        totals[key] = totals.get(key, 0.0) + sample.value
    summed = Metric(family.name, family.documentation, family.type, family.unit)
    for (name, labels), value in totals.items():
        summed.add_sample(name, dict(labels), value)
    return summed


def _topic_families(broker: str, topics: list[stats.TopicStats]) -> Iterator[Metric]:
    """A family made, filled and handed on at a time, so that a scrape holds one family's
    samples at once (`exposition_parts`), not every topic's series of every family: no local
    keeps a family past its `yield`."""
    owned = _gauge("danube_broker_topics_owned", "Topics this broker serves.")
    owned.add_metric([broker], len(topics))
    yield owned
    TopicValue = Callable[[stats.TopicStats], float]
    per_topic: tuple[tuple[Callable[..., Metric], str, str, TopicValue], ...] = (
        (_counter, "danube_topic_messages_in_total",
         "Messages accepted on the topic since this broker loaded it.",
         lambda topic: topic.messages_in),
        (_counter, "danube_topic_bytes_in_total",
         "Payload bytes accepted on the topic since this broker loaded it.",
         lambda topic: topic.bytes_in),
        (_gauge, "danube_topic_active_producers", "Producers of the topic.",
         lambda topic: topic.producers),
        (_gauge, "danube_topic_active_consumers",
         "Consumers attached to the topic's subscriptions (receive stream open).",
         lambda topic: sum(s.consumers for s in topic.subscriptions)),
        (_gauge, "danube_topic_active_subscriptions", "Subscriptions of the topic.",
         lambda topic: len(topic.subscriptions)),
    )  # fmt: skip
    for make, name, help_text, value in per_topic:
        family = make(name, help_text, ["topic"])
        for topic in topics:
            family.add_metric([broker, topic.topic], value(topic))
        yield family
    per_subscription: tuple[tuple[Callable[..., Metric], str, str, str, bool], ...] = (
        (_gauge, "danube_subscription_active_consumers",
         "Consumers attached to the subscription (receive stream open).", "consumers", False),
        (_gauge, "danube_subscription_lag_messages",
         "Reliable subscriptions: messages stored and not yet acknowledged (the backlog).",
         "backlog", True),
        (_counter, "danube_subscription_redelivery_total",
         "Reliable subscriptions: messages sent again (after a nack, an ack timeout or their "
         "consumer leaving) since the subscription was loaded on this broker.",
         "redeliveries", True),
    )  # fmt: skip
    for make, name, help_text, attribute, reliable_only in per_subscription:
        family = make(name, help_text, ["topic", "subscription"])
        for topic in topics:
            for sub in topic.subscriptions:
                if not reliable_only or sub.backlog is not None:
                    family.add_metric([broker, topic.topic, sub.name], getattr(sub, attribute))
        yield family
    family = _gauge(
        "danube_tier_upload_lag_messages",
        "Object tier: committed messages of the topic not yet in an indexed object.",
        ["topic"],
    )
    for topic in topics:
        if topic.upload_lag is not None:
            family.add_metric([broker, topic.topic], topic.upload_lag)
    yield family


def _security_families(m: BrokerMetrics) -> Iterable[Metric]:
    """Danube's `danube_authz_{allow,deny}_total{resource, permission}`, `resource` the scope
    (cluster, namespace, topic, subject) so that series stay few; and refused logins."""
    allow = _counter(
        "danube_authz_allow_total", "Calls authorization allowed.", ["resource", "permission"]
    )
    deny = _counter(
        "danube_authz_deny_total", "Calls authorization denied.", ["resource", "permission"]
    )
    for (resource, permission, allowed), count in sorted(m.authz.items()):
        (allow if allowed else deny).add_metric([m.broker_id, resource, permission], count)
    refused = _counter(
        "danube_authn_failures_total", "Calls refused UNAUTHENTICATED, by kind.", ["kind"]
    )
    for kind, count in sorted(m.authn_failures.items()):
        refused.add_metric([m.broker_id, kind], count)
    return allow, deny, refused


def _connection_families(broker: str, gates: Mapping[str, ConnectionGate]) -> Iterable[Metric]:
    """The connection gates, by port: connections open and pending (no call admitted yet)
    against their caps, and those refused or closed by the gate, by reason
    (spec/memory.md)."""
    open_ = _gauge(
        "danube_broker_connections",
        "Connections the port's connection gate admitted and that are open, by state "
        "(pending: no call admitted yet).",
        ["port", "state"],
    )
    limit = _gauge(
        "danube_broker_connections_limit",
        "The connection caps by port (client: broker.grpc.max_connections, "
        "max_pending_connections; admin: fixed).",
        ["port", "state"],
    )
    refused = _counter(
        "danube_broker_connections_refused_total",
        "Connections the gate refused as they arrived or closed for want of a first call.",
        ["port", "reason"],
    )
    for port, gate in gates.items():
        open_.add_metric([broker, port, "open"], gate.open)
        open_.add_metric([broker, port, "pending"], gate.pending)
        limit.add_metric([broker, port, "open"], gate.limits.max_connections)
        limit.add_metric([broker, port, "pending"], gate.limits.max_pending)
        for reason, count in gate.refused.items():
            refused.add_metric([broker, port, reason.value], count)
    return open_, limit, refused


def _event_families(m: BrokerMetrics) -> Iterator[Metric]:
    """Each family handed on once filled, and its local dropped (`_topic_families`)."""
    broker = m.broker_id
    rpcs = _counter(
        "danube_broker_rpc_total",
        "gRPC calls on the client and admin ports, by outcome (grpc status name).",
        ["service", "method", "result"],
    )
    for (service, method, status), count in sorted(m.rpcs.items()):
        rpcs.add_metric([broker, service, method, status], count)
    yield rpcs
    del rpcs
    sends = _counter(
        "danube_producer_send_total",
        "Messages producers sent, by result (ok, error) and error code.",
        ["topic", "result", "error_code"],
    )
    for (topic, result, code), count in sorted(m.sends.items()):
        sends.add_metric([broker, topic, result, code], count)
    yield sends
    del sends
    out_messages = _counter(
        "danube_consumer_messages_out_total",
        "Messages sent to consumers of the subscription (redeliveries included).",
        ["topic", "subscription"],
    )
    out_bytes = _counter(
        "danube_consumer_bytes_out_total",
        "Bytes of the StreamMessages sent to consumers of the subscription.",
        ["topic", "subscription"],
    )
    for (topic, sub), (count, size) in sorted(m.delivered.items()):
        out_messages.add_metric([broker, topic, sub], count)
        out_bytes.add_metric([broker, topic, sub], size)
    yield out_messages
    del out_messages
    yield out_bytes
    del out_bytes
    nacks = _counter(
        "danube_subscription_nack_total",
        "Negative acknowledgements accepted on the subscription.",
        ["topic", "subscription"],
    )
    for (topic, sub), count in sorted(m.nacks.items()):
        nacks.add_metric([broker, topic, sub], count)
    yield nacks
    del nacks
    yield from histogram_pieces(
        "danube_producer_send_latency_ms",
        "Time from a send's arrival to its acknowledgement (per SendMessage or per batch).",
        broker,
        m.send_latency,
    )
    yield from histogram_pieces(
        "danube_topic_message_size_bytes", "Payload sizes of accepted messages.", broker,
        m.message_size,
    )  # fmt: skip
    redirects = _counter(
        "danube_client_redirects_total",
        "Topic lookups answered with a Redirect: the topic is served by another broker.",
        ["reason"],
    )
    redirects.add_metric([broker, "not_local"], m.redirects)
    yield redirects
    del redirects
    checks = _counter(
        "danube_schema_validation_total",
        "Messages checked against their topic's schema policy (topics with a policy only).",
        ["topic", "policy"],
    )
    for (topic, policy), count in sorted(m.schema_checks.items()):
        checks.add_metric([broker, topic, policy], count)
    yield checks
    del checks
    failures = _counter(
        "danube_schema_validation_failures_total",
        "Checked messages that did not fit the schema, refused (enforce) or accepted (warn).",
        ["topic", "reason"],
    )
    for (topic, reason), count in sorted(m.schema_failures.items()):
        failures.add_metric([broker, topic, reason], count)
    yield failures
    del failures
    parses = _counter(
        "danube_schema_parse_total",
        "Schema definitions sent by callers that were parsed (Protobuf: compiled), by type.",
        ["schema_type"],
    )
    for schema_type, count in sorted(m.schema_parses.items()):
        parses.add_metric([broker, schema_type], count)
    yield parses
    del parses


def _summed(families: Iterable[Metric]) -> Iterator[Metric]:
    """`summed_per_broker` of each family, a family's pieces
    (`metrics_exposition.Continued`) added into one."""
    pending: Metric | None = None
    for family in families:
        summed = summed_per_broker(family)
        if isinstance(family, Continued) and pending is not None:
            totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in (*pending.samples, *summed.samples):
                key = (sample.name, tuple(sorted(sample.labels.items())))
                totals[key] = totals.get(key, 0.0) + sample.value
            pending = Metric(pending.name, pending.documentation, pending.type, pending.unit)
            for (sample_name, labels), value in totals.items():
                pending.add_sample(sample_name, dict(labels), value)
            continue
        if pending is not None:
            yield pending
        pending = summed
    if pending is not None:
        yield pending


def _drop_families(broker: str, core: BrokerCore) -> Iterable[Metric]:
    dropped = _counter(
        "danube_nonreliable_dropped_total",
        "Non-reliable messages dropped for a subscription, by reason.",
        ["topic", "subscription", "reason"],
    )
    for (topic, sub, reason), count in sorted(core.drop_counts().items()):
        if reason == DropReason.POISON_POLICY.value:
            continue  # a reliable message: danube_subscription_poison_dropped_total
        dropped.add_metric([broker, topic, sub, reason], count)
    return (dropped,)


def _memory_families(broker: str, use: stats.MemoryUse | None) -> Iterable[Metric]:
    """The memory budget, each pool's size and use (spec/memory.md)."""
    if use is None:
        return ()
    budget = _gauge("danube_memory_budget_bytes", "The broker's memory budget (--memory-budget).")
    budget.add_metric([broker], use.budget)
    size = _gauge("danube_memory_pool_bytes", "Each pool's share of the budget.", ["pool"])
    used = _gauge("danube_memory_pool_used_bytes", "Accounted bytes each pool holds now.", ["pool"])
    for pool, limit, held in use.pools:
        size.add_metric([broker, pool], limit)
        used.add_metric([broker, pool], held)
    evicted = _counter(
        "danube_memory_cache_evicted_bytes_total",
        "Hot-cache bytes evicted because the cache pool was full (across topics).",
        [],
    )
    evicted.add_metric([broker], use.cache_evicted)
    borrowed = _gauge(
        "danube_memory_publish_borrowed_bytes",
        "Bytes of the cache pool publishes in flight hold (the cache gave way to them).",
    )
    borrowed.add_metric([broker], use.publish_borrowed)
    paused = _counter(
        "danube_memory_publish_paused_seconds",
        "Time publishes waited for room in the publish pool (producers paused), added up.",
        [],
    )
    paused.add_metric([broker], use.publish_paused_ms / 1000)
    refused = _counter(
        "danube_memory_publish_refused",
        "Publishes refused RESOURCE_EXHAUSTED because the publish pool stayed full.",
        [],
    )
    refused.add_metric([broker], use.publish_refused)
    held = _gauge(
        "danube_memory_subscription_held_bytes",
        "Accounted bytes of the records a reliable subscription holds until acknowledged (the "
        "consumer pool by subscription; only subscriptions holding some).",
        ["topic", "subscription"],
    )
    for topic, sub, holding in use.held:
        held.add_metric([broker, topic, sub], holding)
    cached = _gauge(
        "danube_memory_topic_cached_bytes",
        "Accounted bytes of a topic's hot cache (the cache pool by topic; only topics "
        "caching some).",
        ["topic"],
    )
    for topic, holding in use.cached:
        cached.add_metric([broker, topic], holding)
    rss = _gauge(
        "danube_memory_rss_bytes",
        "The broker process's resident set at the last tick (/proc/self/statm).",
    )
    unaccounted = _gauge(
        "danube_memory_unaccounted_bytes",
        "The resident set less what the pools account: the interpreter, buffers and "
        "fragmentation no pool measures.",
    )
    squeeze = _gauge(
        "danube_memory_rss_squeeze_bytes",
        "Bytes the cache pool is lowered by because the resident set is over 90 % of the "
        "budget (spec/memory.md, the process's RSS).",
    )
    if use.rss is not None:
        rss.add_metric([broker], use.rss)
        unaccounted.add_metric([broker], use.unaccounted)
    squeeze.add_metric([broker], use.rss_squeeze)
    families = (budget, size, used, evicted, borrowed, paused, refused, held, cached)
    return (*families, rss, unaccounted, squeeze)


def _wal_families(broker: str, wal: WalMetrics) -> Iterable[Metric]:
    families: list[Metric] = []
    for name, doc, value in (
        ("danube_wal_append_total", "Records appended to WALs.", wal.appends),
        ("danube_wal_append_bytes_total", "Frame bytes written to WALs.", wal.append_bytes),
        ("danube_wal_flush_total", "fsyncs (fdatasync) of WAL segments.", wal.flushes),
        (
            "danube_wal_file_rotate_total",
            "WAL segments started after a topic's first.",
            wal.rotations,
        ),
    ):
        family = _counter(name, doc, [])
        family.add_metric([broker], value)
        families.append(family)
    flush = _histogram(
        "danube_wal_flush_latency_ms", "Latency of WAL fsyncs (fdatasync), the durability cost.", []
    )
    flush.add_metric([broker], wal.flush_latency_ms.buckets(), wal.flush_latency_ms.total)
    group = _histogram(
        "danube_wal_group_commit_records",
        "Records acknowledged together by one group commit (one write and fsync).",
        [],
    )
    group.add_metric([broker], wal.group_commit.buckets(), wal.group_commit.total)
    return (*families, flush, group)
