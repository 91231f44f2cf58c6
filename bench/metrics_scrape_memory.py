"""What a `/metrics` scrape of a broker with many topics allocates while it is answered (issue 28:
memory outside every pool the budget governs). A `BrokerMetrics` over a core with `--topics`
topics' series filled in as a load leaves them (a send latency and a message size histogram, a
sends counter, two subscriptions' deliveries and nacks per topic), then the answer the metrics
port sends (`metrics_http.answer` and `Response.encode`) made `--scrapes` times under
tracemalloc: the body's bytes, the peak traced during one answer over what was traced before it
(the transient the scrape costs on top of the body), and the RSS the process grew.

    PYTHONPATH=src:. python -m bench.metrics_scrape_memory --topics 1000
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tracemalloc

from danube.machines.dispatch import QueueLimits
from danube.runtime.metrics import BrokerMetrics, Histogram
from danube.runtime.metrics_http import Endpoints, Request, answer
from danube.testing.support import make_core

LATENCY_BOUNDS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
SIZE_BOUNDS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)


def filled_metrics(topics: int) -> BrokerMetrics:
    core = make_core(url="http://b:1", limits=QueueLimits(10, 1 << 20), namespaces=("default",))
    metrics = BrokerMetrics(core, "7", "standalone")
    for i in range(topics):
        topic = f"/default/soak-{i:05d}"
        metrics.sends[(topic, "ok", "")] = 1_000 + i
        for name, bounds, table in (
            ("latency", LATENCY_BOUNDS, metrics.send_latency),
            ("size", SIZE_BOUNDS, metrics.message_size),
        ):
            histogram = table[topic] = Histogram(bounds)
            histogram.counts[:] = range(len(histogram.counts))
            histogram.total = float(i)
            del name
        for sub in ("soak-sub-a", "soak-sub-b"):
            metrics.delivered[(topic, sub)] = [1_000 + i, 128_000 + i]
            metrics.nacks[(topic, sub)] = i
    metrics.forget_removed = lambda topics: None  # type: ignore[method-assign]  # no core topics
    return metrics


def parts_of(encoded: bytes | list[bytes] | tuple[bytes, ...]) -> list[bytes]:
    return [encoded] if isinstance(encoded, bytes) else list(encoded)


async def _never() -> bool:
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=1_000)
    parser.add_argument("--scrapes", type=int, default=3)
    args = parser.parse_args()
    metrics = filled_metrics(args.topics)
    endpoints = Endpoints(metrics.exposition_parts if hasattr(metrics, "exposition_parts")
                          else metrics.exposition, lambda: None, _never)  # fmt: skip
    request = Request("GET", "/metrics")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    asyncio.run(answer(endpoints, request))  # warm: imports, caches
    tracemalloc.start()
    for n in range(args.scrapes):
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        parts = parts_of((asyncio.run(answer(endpoints, request))).encode())
        size = sum(map(len, parts))
        peak = tracemalloc.get_traced_memory()[1] - base
        print(
            f"scrape {n + 1}: {args.topics} topics, {size / 2**20:.2f} MiB sent in {len(parts)} "
            f"parts, peak traced over the body {(peak - size) / 2**20:.2f} MiB "
            f"(peak {peak / 2**20:.2f} MiB)"
        )
        del parts
    tracemalloc.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"max RSS grew {(rss_after - rss_before) / 1024:.1f} MiB over the scrapes")


if __name__ == "__main__":
    main()
