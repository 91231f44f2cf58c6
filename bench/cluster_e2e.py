"""Cluster benchmarks with real processes (`danube.localcluster`: etcd, moto's S3 server,
broker processes in cluster mode) and our client in this process.

- `failover`: a reliable topic (`object` level) with one sequential producer (each send waits
  for its acknowledgement, then 10 ms: at most 100 msg/s, fewer at `object`); its owner is
  SIGKILLed; measures SIGKILL → the new owner loaded the topic (its log) and SIGKILL → the
  consumer's first message from the new owner. A fresh broker replaces the dead one before the
  next round, so every round starts with the same number of brokers.
- `assign`: topics created one at a time by a producer: first CreateProducer → producer ready
  (the first attempt answers UNAVAILABLE while the leader assigns the new topic).
- `throughput`: `--topics` reliable topics (`fsync`), one producer each with `--window` sends
  in flight, 1 KiB payloads for `--seconds`; aggregate acknowledged msg/s, for each broker
  count in `--brokers` (with two brokers or more each topic replicates to a follower).
- `latency`: one sequential producer (`fsync`, 100 B): publish → acknowledgement p50 and p99,
  replicated with two brokers or more.

    .venv/bin/python -m bench.cluster_e2e failover --rounds 3
    .venv/bin/python -m bench.cluster_e2e assign --topics 50
    .venv/bin/python -m bench.cluster_e2e throughput --brokers 1 3 --topics 12 --seconds 20
    .venv/bin/python -m bench.cluster_e2e latency --brokers 1 3 --sends 300
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from danube.client import DanubeClient, DispatchStrategy, SubType
from danube.localcluster.cluster import ClusterSettings, LocalCluster

PAYLOAD = b"x" * 1024


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _failover_round(cluster: LocalCluster, topic: str) -> tuple[float, float]:
    urls = ",".join(cluster.service_urls)
    async with DanubeClient(urls) as client:
        producer = await client.producer(topic, "p", dispatch=DispatchStrategy.RELIABLE).create()
        consumer = await client.consumer(topic, "c", "s", sub_type=SubType.EXCLUSIVE).subscribe()
        sent_at: dict[int, float] = {}
        received: list[tuple[float, int]] = []
        stop = asyncio.Event()

        async def produce() -> None:
            sequence = 0
            while not stop.is_set():
                sent_at[sequence] = time.monotonic()
                await producer.send(str(sequence).encode().ljust(len(PAYLOAD)))
                sequence += 1
                await asyncio.sleep(0.01)

        async def consume() -> None:
            async for message in consumer:
                received.append((time.monotonic(), int(message.payload.strip())))
                await consumer.ack(message)

        def served_after(moment: float) -> list[float]:
            """Receipts of messages sent after `moment` (earlier ones may have waited in
            the client's buffers)."""
            return [at for at, seq in received if sent_at[seq] > moment]

        tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
        while len(received) < 50:
            await asyncio.sleep(0.05)
        victim = cluster.owner(topic)
        survivors = [b for b in cluster.brokers if b is not victim]
        victim.kill()
        killed = time.monotonic()
        while not any(topic in b.loaded_topics() for b in survivors):
            await asyncio.sleep(0.02)
        loaded = time.monotonic() - killed
        while not served_after(killed):
            await asyncio.sleep(0.01)
        first = min(served_after(killed)) - killed
        stop.set()
        for task in tasks:
            task.cancel()
        return loaded, first


def failover(args: argparse.Namespace, root: Path) -> None:
    settings = ClusterSettings(
        brokers=3, lease_ttl_ms=args.lease_ttl_ms, durability="object", object_batch_ms=20
    )
    loaded, served = [], []
    with LocalCluster(root, settings) as cluster:
        for round_ in range(args.rounds):
            took = asyncio.run(_failover_round(cluster, f"/default/failover-{round_}"))
            loaded.append(took[0])
            served.append(took[1])
            print(f"round {round_}: loaded by the new owner {took[0]:.2f} s, "
                  f"first message served {took[1]:.2f} s after SIGKILL", flush=True)  # fmt: skip
            cluster.add_broker()
    print(f"lease TTL {args.lease_ttl_ms} ms; over {args.rounds} rounds: loaded median "
          f"{statistics.median(loaded):.2f} s (max {max(loaded):.2f}), first message served "
          f"median {statistics.median(served):.2f} s (max {max(served):.2f})")  # fmt: skip


async def _assign(urls: str, topics: int) -> list[float]:
    took = []
    async with DanubeClient(urls) as client:
        for i in range(topics):
            started = time.monotonic()
            await client.producer(f"/default/assign-{i}", "p").create()
            took.append(time.monotonic() - started)
    return took


def assign(args: argparse.Namespace, root: Path) -> None:
    with LocalCluster(root, ClusterSettings(brokers=3)) as cluster:
        took = asyncio.run(_assign(",".join(cluster.service_urls), args.topics))
        brokers = [len(b.loaded_topics()) for b in cluster.brokers]
    ms = [t * 1000 for t in took]
    print(f"{args.topics} topics created one at a time: create → producer ready p50 "
          f"{_percentile(ms, 0.5):.0f} ms, p99 {_percentile(ms, 0.99):.0f} ms, max "
          f"{max(ms):.0f} ms; topics per broker {brokers}")  # fmt: skip


async def _throughput(urls: str, topics: int, window: int, seconds: float) -> int:
    acked = 0
    async with DanubeClient(urls) as client:
        producers = [
            await client.producer(
                f"/default/load-{i}", "p", dispatch=DispatchStrategy.RELIABLE
            ).create()
            for i in range(topics)
        ]
        deadline = time.monotonic() + seconds

        async def send_loop(producer: object) -> None:
            nonlocal acked
            while time.monotonic() < deadline:
                await producer.send(PAYLOAD)  # type: ignore[attr-defined]
                acked += 1

        await asyncio.gather(*(send_loop(p) for p in producers for _ in range(window)))
    return acked


def throughput(args: argparse.Namespace, root: Path) -> None:
    for brokers in args.brokers:
        with LocalCluster(root / f"b{brokers}", ClusterSettings(brokers=brokers)) as cluster:
            acked = asyncio.run(
                _throughput(",".join(cluster.service_urls), args.topics, args.window, args.seconds)
            )
        print(f"{brokers} broker(s), {args.topics} topics × {args.window} in flight, "
              f"{args.seconds:.0f} s: {acked / args.seconds:.0f} msg/s acknowledged "
              f"({acked} messages)", flush=True)  # fmt: skip


async def _latency(url: str, sends: int) -> list[float]:
    """Milliseconds from each send to its acknowledgement, one at a time, after a warm-up."""
    async with DanubeClient(url) as client:
        producer = await client.producer(  # type: ignore[attr-defined]
            "/default/latency", "p", dispatch=DispatchStrategy.RELIABLE
        ).create()
        for _ in range(20):
            await producer.send(PAYLOAD[:100])
        await asyncio.sleep(2)  # the followers catch up and join the in-sync set
        took = []
        for _ in range(sends):
            started = time.perf_counter()
            await producer.send(PAYLOAD[:100])
            took.append((time.perf_counter() - started) * 1000)
    return took


def latency(args: argparse.Namespace, root: Path) -> None:
    """Sequential reliable publishes (`fsync`): replicated to a follower with two brokers or
    more (issue 27), alone with one."""
    for brokers in args.brokers:
        with LocalCluster(root / f"l{brokers}", ClusterSettings(brokers=brokers)) as cluster:
            time.sleep(3)
            took = asyncio.run(_latency(cluster.brokers[0].url, args.sends))
        print(f"{brokers} broker(s), {args.sends} sequential reliable sends of 100 B: "
              f"publish→ack p50 {_percentile(took, 0.5):.2f} ms, p99 "
              f"{_percentile(took, 0.99):.2f} ms", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bench.cluster_e2e", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("failover")
    one.add_argument("--rounds", type=int, default=3)
    one.add_argument("--lease-ttl-ms", type=int, default=3_000)
    two = sub.add_parser("assign")
    two.add_argument("--topics", type=int, default=50)
    three = sub.add_parser("throughput")
    three.add_argument("--brokers", type=int, nargs="+", default=[1, 3])
    three.add_argument("--topics", type=int, default=12)
    three.add_argument("--window", type=int, default=4)
    three.add_argument("--seconds", type=float, default=20.0)
    four = sub.add_parser("latency")
    four.add_argument("--brokers", type=int, nargs="+", default=[1, 3])
    four.add_argument("--sends", type=int, default=300)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="danube-bench-") as tmp:
        commands = {
            "failover": failover, "assign": assign, "throughput": throughput, "latency": latency,
        }  # fmt: skip
        commands[args.command](args, Path(tmp))


if __name__ == "__main__":
    main()
