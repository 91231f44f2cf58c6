"""Memory of departed clients (issue 28, spec/memory.md "Departed clients"), with a real
`danube-broker`:

- `producers`: `--producers` producers on `--topics` non-reliable topics, each created by a
  client that publishes one message and goes away (no close, no health check), `--rounds`
  times with new names. The broker's RSS and the producers its metrics count, before, and
  after each round right away and `--wait` seconds later
  (past `broker.producer_idle_timeout_ms`, `--idle-ms`; without it the key is not written, so
  a broker that predates it runs too).
- `subscription`: a reliable subscription whose consumer read a window of `--window`
  records (the broker's `dispatch.max_unacked_messages` set to it), acknowledged none, and left: the
  consumer pool's use right after and `--wait` seconds later.

    PYTHONPATH=src:. nice -n 10 python -m bench.departed_clients producers --idle-ms 20000 --wait 25
    PYTHONPATH=src:. nice -n 10 python -m bench.departed_clients subscription --wait 15

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.workload import rss_mib
from danube.client import DanubeClient, DispatchStrategy
from danube.localcluster.broker_process import BrokerProcess


def _metric(broker: BrokerProcess, name: str, label: str = "") -> float:
    """The sum of a metric's samples (those whose labels contain `label`)."""
    text = urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _sample(broker: BrokerProcess) -> dict[str, Any]:
    return {
        "rss_mib": round(rss_mib(broker.pid), 1),
        "producers": int(_metric(broker, "danube_topic_active_producers")),
        "consumer_pool_used_b": int(
            _metric(broker, "danube_memory_pool_used_bytes", 'pool="consumer"')
        ),
        "state_pool_used_b": int(_metric(broker, "danube_memory_pool_used_bytes", 'pool="state"')),
    }


async def _producers(client: DanubeClient, topics: int, names: range, concurrency: int) -> None:
    queue = iter(names)

    async def worker() -> None:
        for index in queue:
            producer = client.producer(
                f"/default/departed-{index % topics}", f"gone-{index}",
                dispatch=DispatchStrategy.NON_RELIABLE, batching=None,
            )  # fmt: skip
            await producer.create()
            await producer.send(b"x")  # and the client leaves: no close, no health check

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _broker(root: Path, args: argparse.Namespace) -> BrokerProcess:
    config = "storage:\n  wal:\n    durability: fsync\n"
    config += f"dispatch:\n  max_unacked_messages: {args.window}\n"
    if args.idle_ms is not None:
        config += f"broker:\n  producer_idle_timeout_ms: {args.idle_ms}\n"
    (root / "broker.yaml").write_text(config)
    extra = ("--memory-budget", args.budget)
    return BrokerProcess(root / "data", config_file=root / "broker.yaml", extra_args=extra).start()


async def producers(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="danube-departed-"))
    broker = _broker(root, args)
    try:
        async with DanubeClient(broker.url) as client:
            await _producers(client, args.topics, range(args.topics), args.concurrency)
        await asyncio.sleep(2)
        start = _sample(broker)
        rounds = []
        for number in range(args.rounds):  # each round: new names, the clients leave
            began = time.monotonic()
            async with DanubeClient(broker.url) as client:
                names = range(number * args.producers, (number + 1) * args.producers)
                await _producers(client, args.topics, names, args.concurrency)
            created_s = time.monotonic() - began
            await asyncio.sleep(2)
            after = _sample(broker)
            await asyncio.sleep(args.wait)
            later = _sample(broker)
            rounds.append(
                {"created_s": round(created_s, 1), "after_creation": after,
                 f"after_{args.wait}s": later}
            )  # fmt: skip
    finally:
        broker.kill()
    first = rounds[0]["after_creation"]
    return {
        "mode": "producers",
        "producers_per_round": args.producers,
        "topics": args.topics,
        "idle_ms": args.idle_ms,
        "start": start,
        "rounds": rounds,
        "rss_per_producer_b": round(
            (first["rss_mib"] - start["rss_mib"]) * 1024 * 1024 / args.producers
        ),
    }


async def subscription(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="danube-departed-"))
    broker = _broker(root, args)
    try:
        async with DanubeClient(broker.url) as client:
            topic = "/default/departed-sub"
            producer = client.producer(topic, "p", dispatch=DispatchStrategy.RELIABLE)
            await producer.create()
            payload = b"x" * args.payload
            for _ in range(args.window * 2):
                await producer.send(payload)
            consumer = client.consumer(topic, "c", "gone", start="earliest")
            await consumer.subscribe()
            received = 0
            try:  # the subscription's window of records, none acknowledged
                while received < args.window:
                    await asyncio.wait_for(consumer.receive(), 5)
                    received += 1
            except TimeoutError:
                pass
            await asyncio.sleep(1)
            held = _sample(broker)
            await consumer.close()  # the consumer leaves, nothing acknowledged
            await asyncio.sleep(1)
            left = _sample(broker)
            await asyncio.sleep(args.wait)
            later = _sample(broker)
    finally:
        broker.kill()
    return {
        "mode": "subscription",
        "window": args.window,
        "payload_b": args.payload,
        "received": received,
        "while_connected": held,
        "after_leaving": left,
        f"after_{args.wait}s": later,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("producers", "subscription"))
    parser.add_argument("--producers", type=int, default=10_000, help="per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--idle-ms", type=int, default=None)
    parser.add_argument("--wait", type=int, default=25)
    parser.add_argument("--window", type=int, default=1_000)
    parser.add_argument("--payload", type=int, default=1_024)
    parser.add_argument("--budget", default="256MiB")
    args = parser.parse_args()
    run = producers if args.mode == "producers" else subscription
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
