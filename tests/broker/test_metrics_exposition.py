"""The `/metrics` answer of a broker with many topics, made a family (or a histogram's piece)
at a time (`danube.runtime.metrics_exposition`; issue 28: a scrape held 4.9x its body)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from danube.machines.dispatch import QueueLimits
from danube.runtime.metrics import BrokerMetrics, Histogram
from danube.runtime.metrics_exposition import HISTOGRAM_PIECE_TOPICS, exposition_parts
from danube.runtime.metrics_http import Endpoints, Request, answer
from danube.testing.support import make_core

LATENCY = "danube_producer_send_latency_ms"


def _metrics(topics: int, per_topic: bool = True) -> BrokerMetrics:
    """A broker's metrics with `topics` topics' series as a load leaves them (a send latency
    and a message size histogram, a sends counter, two subscriptions' deliveries and nacks)."""
    core = make_core(url="http://b:1", limits=QueueLimits(10, 1 << 20), namespaces=("default",))
    metrics = BrokerMetrics(core, "7", "standalone", per_topic=per_topic)
    for i in range(topics):
        topic = f"/default/t-{i:05d}"
        metrics.sends[(topic, "ok", "")] = i
        for table, bounds in (
            (metrics.send_latency, (1, 5, 25, 100)),
            (metrics.message_size, (64, 1024)),
        ):
            histogram = table[topic] = Histogram(bounds)
            histogram.counts[:] = range(1, len(histogram.counts) + 1)
            histogram.total = float(i)
        for sub in ("a", "b"):
            metrics.delivered[(topic, sub)] = [i, 128 * i]
            metrics.nacks[(topic, sub)] = i
    metrics.forget_removed = lambda topics: None  # type: ignore[method-assign]  # no core topics
    return metrics


async def _alive() -> bool:
    return True


def _answered(metrics: BrokerMetrics) -> list[bytes]:
    endpoints = Endpoints(metrics.exposition_parts, lambda: None, _alive)
    response = trio.run(answer, endpoints, Request("GET", "/metrics"))
    return response.encode()


def test_a_scrape_of_many_topics_holds_less_than_its_body_beside_it() -> None:
    """The peak traced while the answer is made and encoded, beyond the body it sends, is
    under the body's size; `generate_latest` of the whole registry and the head copied onto
    the body held 4.9 times the body beside it (1,000 topics: 14.6 MiB for 3.0)."""
    metrics = _metrics(500)
    _answered(metrics)  # warm: imports and caches are not the scrape's
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        parts = _answered(metrics)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    body = sum(map(len, parts))
    assert body > 800_000  # a real exposition: the series of 500 topics
    assert peak - body < body, (peak, body)


def test_the_parts_make_one_exposition_each_family_headed_once() -> None:
    metrics = _metrics(2 * HISTOGRAM_PIECE_TOPICS + 7)
    parts = _answered(metrics)
    head, text = parts[0].decode(), b"".join(parts[1:]).decode()
    assert f"Content-Length: {len(text.encode())}\r\n" in head
    assert text.count(f"# TYPE {LATENCY} histogram\n") == 1
    assert text.count(f"# HELP {LATENCY} ") == 1
    families = [family.name for family in text_string_to_metric_families(text)]
    assert len(families) == len(set(families))
    # the histogram's pieces, joined, are the family formatted whole
    whole = HistogramMetricFamily(LATENCY, "", labels=["broker", "topic"])
    for topic, histogram in sorted(metrics.send_latency.items()):
        whole.add_metric(["7", topic], histogram.buckets(), histogram.total)
    lines = generate_latest(_One(whole)).decode().split("\n", 2)[2]
    assert lines in text


def test_summed_per_broker_adds_a_histograms_pieces_into_one_family() -> None:
    topics = 2 * HISTOGRAM_PIECE_TOPICS + 7
    metrics = _metrics(topics, per_topic=False)
    text = b"".join(metrics.exposition_parts()).decode()
    latency = [f for f in text_string_to_metric_families(text) if f.name == LATENCY]
    assert len(latency) == 1
    values = {(s.name, s.labels.get("le")): s.value for s in latency[0].samples}
    assert values[(f"{LATENCY}_count", None)] == 15 * topics  # 1 + 2 + 3 + 4 + 5 a topic
    assert values[(f"{LATENCY}_bucket", "1")] == topics
    assert values[(f"{LATENCY}_sum", None)] == sum(range(topics))


class _One(Collector):
    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> list[Metric]:
        return [self.family]


def test_a_registry_of_one_family_is_formatted_as_generate_latest_does() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        _One(HistogramMetricFamily("h", "d", buckets=[("1", 1), ("+Inf", 2)], sum_value=3))
    )
    assert b"".join(exposition_parts(registry)) == generate_latest(registry)


def test_the_parts_served_over_a_socket_are_one_exposition_with_its_length() -> None:
    """A real metrics port: the head's Content-Length is what arrives, the parts gathered
    into chunks (`metrics_http.SEND_CHUNK`) make the same text (review of issue 28 part 17)."""
    import socket
    import urllib.request

    from danube.runtime import metrics_http

    async def alive() -> bool:
        return True

    metrics = _metrics(500)
    whole = metrics.exposition()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    got: dict[str, Any] = {}

    def fetch() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            got["length"] = int(answer.headers["Content-Length"])
            got["body"] = answer.read()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            endpoints = Endpoints(metrics.exposition_parts, lambda: None, alive)
            nursery.start_soon(metrics_http.serve_http, listener, endpoints)
            await trio.to_thread.run_sync(fetch)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert got["length"] == len(got["body"])
    process = (b"process_", b"python_", b"# HELP process", b"# TYPE process")
    process += (b"# HELP python", b"# TYPE python")

    def lines(text: bytes) -> list[bytes]:
        return [line for line in text.split(b"\n") if not line.startswith(process)]

    assert lines(got["body"]) == lines(whole)
