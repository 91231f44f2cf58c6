"""What per-topic state costs in a real broker (issue 28, "accounting of the rest"): RSS deltas
of a standalone `danube-broker` over N idle reliable topics, then N subscriptions, N
consumers and N × K dispatch entries (messages delivered and not acknowledged).

    PYTHONPATH=src:. python -m bench.state_memory --topics 2000 --entries 10

Phases, each measured as the broker's RSS after it less before, divided by what it made
(a warm-up of `--warm` topics with a subscription and a consumer each comes first, so that
code paths, interned strings and allocator arenas of the first ones are not charged):

- topic: a reliable topic created by a producer (kept open) with one stored message;
- subscription: a consumer subscribes, receives that message, acknowledges it and leaves
  (the subscription stays: its cursor is durable);
- subscription + consumer: a second subscription per topic whose consumer stays connected;
- entry: `--entries` more messages per topic, delivered to the connected consumers and not
  acknowledged, less what the hot caches account for them (`danube_memory_pool_used_bytes`).

Python's allocator seldom returns memory, so a phase that freed objects (a consumer that
left) lends that room to the next: the consumer's cost is the third phase less the second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.workload import rss_mib
from danube.cli.admin_brokers import memory_of
from danube.client import DanubeClient, DispatchStrategy, Producer
from danube.client.consumer import Consumer, SubType
from danube.localcluster.broker_process import BrokerProcess

KIB = 1024
PER_CONNECTION = 50


def _cache_bytes(broker: BrokerProcess) -> float:
    # A broker busy with thousands of subscriptions may take a while to answer a scrape.
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=120) as answer:
        return memory_of(answer.read().decode()).get("danube_memory_pool_used_bytes:cache", 0)


async def _each(indices: range, concurrency: int, action) -> None:  # type: ignore[no-untyped-def]
    queue = iter(indices)

    async def worker() -> None:
        for index in queue:
            await action(index)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run(args: argparse.Namespace) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="danube-state-"))
    broker = BrokerProcess(work / "data", log_file=work / "broker.log").start()
    print(f"broker log {work / 'broker.log'}", flush=True)
    producers: dict[int, Producer] = {}
    kept: list[Consumer] = []
    out: dict[str, float] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            # A connection per 50 topics: it caps its concurrent streams (a kept consumer
            # holds two) and the resets of consumers that leave (the rapid-reset guard).
            clients = [
                await stack.enter_async_context(DanubeClient(broker.url))
                for _ in range((args.warm + args.topics) // PER_CONNECTION + 1)
            ]

            async def topic(index: int) -> None:
                client = clients[index // PER_CONNECTION]
                producer = client.producer(
                    f"/default/st-{index}", "p", dispatch=DispatchStrategy.RELIABLE, batching=None
                )
                await producer.create()
                await producer.send(b"x" * 64)
                producers[index] = producer

            async def subscription(index: int, name: str, keep: bool) -> None:
                client = clients[index // PER_CONNECTION]
                consumer = client.consumer(
                    f"/default/st-{index}", f"c-{name}", name, sub_type=SubType.EXCLUSIVE,
                    start="earliest",
                )  # fmt: skip
                await consumer.subscribe()
                message = await asyncio.wait_for(consumer.receive(), 30)
                await consumer.ack(message)
                if keep:
                    kept.append(consumer)
                else:
                    await consumer.close()

            warm, n = args.warm, args.topics
            await _each(range(warm), args.concurrency, topic)
            await _each(range(warm), args.concurrency, lambda i: subscription(i, "w", True))
            time.sleep(1)
            rss = [rss_mib(broker.pid)]
            print(f"after warm-up of {warm}: RSS {rss[-1]:.1f} MiB", flush=True)
            span = range(warm, warm + n)
            await _each(span, args.concurrency, topic)
            rss.append(rss_mib(broker.pid))
            print(f"{n} topics: RSS {rss[-1]:.1f} MiB", flush=True)
            await _each(span, args.concurrency, lambda i: subscription(i, "s", False))
            rss.append(rss_mib(broker.pid))
            print(f"{n} subscriptions: RSS {rss[-1]:.1f} MiB", flush=True)
            await _each(span, args.concurrency, lambda i: subscription(i, "t", True))
            rss.append(rss_mib(broker.pid))
            print(f"{n} subscriptions with a consumer: RSS {rss[-1]:.1f} MiB", flush=True)
            cache_before = _cache_bytes(broker)

            async def more(index: int) -> None:
                for _ in range(args.entries):
                    await producers[index].send(b"y" * 64)

            await _each(span, args.concurrency, more)
            await asyncio.sleep(3)  # delivered to the kept consumers, not acknowledged
            rss.append(rss_mib(broker.pid))
            cached = _cache_bytes(broker) - cache_before
            deltas = [(b - a) * 1024 * KIB for a, b in itertools.pairwise(rss)]
            out = {
                "rss_after_warmup_mib": round(rss[0], 1),
                "topic_bytes": round(deltas[0] / n),
                "subscription_bytes": round(deltas[1] / n),
                "subscription_and_consumer_bytes": round(deltas[2] / n),
                "consumer_bytes": round((deltas[2] - deltas[1]) / n),
                "entry_bytes": round((deltas[3] - cached) / (n * args.entries)),
                "entry_cache_accounted_bytes": round(cached / (n * args.entries)),
                "rss_end_mib": round(rss[-1], 1),
            }
            for consumer in kept:
                await consumer.close()
            for producer in producers.values():
                await producer.__aexit__()
    finally:
        broker.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=2_000)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--entries", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
