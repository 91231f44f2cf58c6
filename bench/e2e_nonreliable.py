"""End-to-end non-reliable benchmark: a real broker process, our client, 1 KiB payloads.

Two phases against one broker:
- throughput: `--producers` concurrent producers send `--messages` messages as fast as acks
  return, one consumer (Exclusive) receives them; reports publish and delivery msg/s;
- latency: one producer paced at `--rate` msg/s; each payload carries its send time
  (CLOCK_MONOTONIC, shared by processes on one machine); reports publish-ack and end-to-end
  p50/p99.

    .venv/bin/python -m bench.e2e_nonreliable --messages 20000 --rate 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import struct
import tempfile
import time
from pathlib import Path

from danube.client import DanubeClient, SubType
from danube.localcluster.broker_process import BrokerProcess

PAYLOAD_SIZE = 1024
_STAMP = struct.Struct("<Q")


def _payload(padding: bytes) -> bytes:
    return _STAMP.pack(time.monotonic_ns()) + padding


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _throughput(url: str, messages: int, producers: int) -> dict[str, float]:
    topic = f"/default/bench-tput-{time.monotonic_ns()}"
    padding = b"x" * (PAYLOAD_SIZE - _STAMP.size)
    async with DanubeClient(url) as client:
        await client.producer(topic, "creator").create()
        consumer = await client.consumer(topic, "c", "s", sub_type=SubType.EXCLUSIVE).subscribe()
        senders = [await client.producer(topic, f"p{i}").create() for i in range(producers)]
        per_producer = messages // producers

        async def send_all(producer_index: int) -> None:
            producer = senders[producer_index]
            for _ in range(per_producer):
                await producer.send(_payload(padding))

        async def receive_all() -> float:
            for _ in range(per_producer * producers):
                await consumer.receive()
            return time.perf_counter()

        receiver = asyncio.create_task(receive_all())
        started = time.perf_counter()
        await asyncio.gather(*(send_all(i) for i in range(producers)))
        published = time.perf_counter()
        delivered = await asyncio.wait_for(receiver, 120)
    total = per_producer * producers
    return {
        "messages": total,
        "publish_msgs_per_s": total / (published - started),
        "delivery_msgs_per_s": total / (delivered - started),
    }


async def _latency(url: str, messages: int, rate: int) -> dict[str, float]:
    topic = f"/default/bench-lat-{time.monotonic_ns()}"
    padding = b"x" * (PAYLOAD_SIZE - _STAMP.size)
    ack_ms: list[float] = []
    e2e_ms: list[float] = []
    async with DanubeClient(url) as client:
        await client.producer(topic, "creator").create()
        consumer = await client.consumer(topic, "c", "s", sub_type=SubType.EXCLUSIVE).subscribe()
        producer = await client.producer(topic, "p").create()

        async def receive_all() -> None:
            for _ in range(messages):
                message = await consumer.receive()
                (sent,) = _STAMP.unpack_from(message.payload)
                e2e_ms.append((time.monotonic_ns() - sent) / 1e6)

        async def send_one() -> None:
            before = time.monotonic_ns()
            await producer.send(_payload(padding))
            ack_ms.append((time.monotonic_ns() - before) / 1e6)

        receiver = asyncio.create_task(receive_all())
        # Open loop: sends start on schedule whether or not earlier ones were acknowledged,
        # so the offered rate is the one asked for and queueing shows up as latency.
        interval = 1.0 / rate
        started = time.monotonic()
        sends = []
        for n in range(messages):
            delay = started + n * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sends.append(asyncio.create_task(send_one()))
        await asyncio.gather(*sends)
        elapsed = time.monotonic() - started
        await asyncio.wait_for(receiver, 60)
    return {
        "messages": messages,
        "offered_msgs_per_s": rate,
        "achieved_msgs_per_s": messages / elapsed,
        "publish_ack_p50_ms": statistics.median(ack_ms),
        "publish_ack_p99_ms": _percentile(ack_ms, 0.99),
        "end_to_end_p50_ms": statistics.median(e2e_ms),
        "end_to_end_p99_ms": _percentile(e2e_ms, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rate", type=int, default=1000, help="msg/s in the latency phase")
    parser.add_argument("--latency-messages", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data, BrokerProcess(Path(data)) as broker:
        result = {
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "cpus": len(__import__("os").sched_getaffinity(0)),
            "python": platform.python_version(),
            "throughput": asyncio.run(_throughput(broker.url, args.messages, args.producers)),
            "latency": asyncio.run(_latency(broker.url, args.latency_messages, args.rate)),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
