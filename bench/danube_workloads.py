"""Our broker under the peer benchmark's workloads (`bench.workload`): a real `danube-broker`
process on loopback and our client in this process, batching on the batched path."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

from bench.workload import SystemResult, Workload, percentile, rss_mib
from danube.client import DanubeClient, DispatchStrategy
from danube.client.consumer import Consumer
from danube.localcluster.broker_process import BrokerProcess

WINDOW = 10_000
"""The broker's `dispatch.max_unacked_messages` for the run (Danube's default is 10, which
makes a consumer wait for its acknowledgements every 10 messages)."""
PUBLISH_WINDOW = 20_000
"""Messages the throughput phase keeps enqueued and unanswered."""


def _config(durability: str) -> str:
    return (
        f"storage:\n  wal:\n    durability: {durability}\n"
        f"dispatch:\n  max_unacked_messages: {WINDOW}\n"
    )


async def run_danube(
    workload: Workload, progress: Callable[[str], None], durability: str = "fsync"
) -> SystemResult:
    result = SystemResult(
        system=f"Danube for Python {version('pydanube')}",
        durability=(
            "fsync (fdatasync) before ack, one group commit per batch"
            if durability == "fsync"
            else "written to the OS before ack, fsync every second (`flush`)"
        ),
    )
    result.notes.append(
        f"batched path, client batching defaults (linger 0 ms, up to 1,000 messages, 4 in "
        f"flight); broker dispatch.max_unacked_messages {WINDOW}"
    )
    with tempfile.TemporaryDirectory(prefix="danube-bench-") as tmp:
        root = Path(tmp)
        (root / "broker.yaml").write_text(_config(durability))
        broker = BrokerProcess(root / "data", config_file=root / "broker.yaml").start()
        try:
            async with DanubeClient(broker.url) as client:
                progress("danube: publish throughput")
                result.publish_per_s = await _publish(client, workload, "/default/pub")
                progress("danube: latency")
                await _latency(client, workload, result)
                progress("danube: consume throughput")
                result.consume_per_s = await _consume(client, workload, progress)
        finally:
            broker.stop()
        progress(f"danube: memory with {workload.idle_topics} idle topics")
        idle = BrokerProcess(root / "idle", config_file=root / "broker.yaml").start()
        try:
            result.base_rss_mib = rss_mib(idle.pid)
            async with DanubeClient(idle.url) as client:
                await _idle_topics(client, workload, progress)
            result.idle_rss_mib = rss_mib(idle.pid)
        finally:
            idle.stop()
    result.notes.append(
        "idle topics: reliable topics with one stored message each, created by a producer "
        "each, on a fresh broker"
    )
    return result


async def _publish(client: DanubeClient, workload: Workload, topic: str) -> float:
    payload = bytes(workload.message_bytes)
    producer = client.producer(topic, "bench", dispatch=DispatchStrategy.RELIABLE)
    async with producer:
        await producer.send(payload)
        pending = []
        started = time.perf_counter()
        for _ in range(workload.publish_messages):
            pending.append(producer.enqueue(payload))
            if len(pending) >= PUBLISH_WINDOW:
                for answer in pending[: PUBLISH_WINDOW // 2]:
                    await answer
                del pending[: PUBLISH_WINDOW // 2]
        for answer in pending:
            await answer
        return workload.publish_messages / (time.perf_counter() - started)


async def _latency(client: DanubeClient, workload: Workload, result: SystemResult) -> None:
    topic = "/default/latency"
    count, rate = workload.latency_messages, workload.latency_rate
    acked: list[float] = []
    received: dict[int, float] = {}
    sent: list[float] = [0.0] * count
    done = asyncio.Event()
    producer = client.producer(topic, "lat", dispatch=DispatchStrategy.RELIABLE)
    await producer.create()
    consumer = client.consumer(topic, "lat", "lat", start="latest")
    await consumer.subscribe()

    async def consume() -> None:
        acks = []
        while len(received) < count:
            message = await consumer.receive()
            received[int.from_bytes(message.payload[:8], "little")] = time.perf_counter()
            acks.append(asyncio.ensure_future(consumer.ack(message)))
        await asyncio.gather(*acks)
        done.set()

    async def answer(index: int, stored: object) -> None:
        await stored  # type: ignore[misc]
        acked.append(time.perf_counter() - sent[index])

    reader = asyncio.ensure_future(consume())
    padding = bytes(workload.message_bytes - 8)
    tasks = []
    start = time.perf_counter()
    for index in range(count):
        due = start + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[index] = time.perf_counter()
        stored = producer.enqueue(index.to_bytes(8, "little") + padding)
        tasks.append(asyncio.ensure_future(answer(index, stored)))
    await asyncio.gather(*tasks)
    result.latency_achieved_per_s = count / (time.perf_counter() - start)
    await asyncio.wait_for(done.wait(), 60)
    reader.cancel()
    await consumer.close()
    end_to_end = [received[i] - sent[i] for i in range(count)]
    result.ack_p50_ms = percentile(acked, 0.5) * 1000
    result.ack_p99_ms = percentile(acked, 0.99) * 1000
    result.e2e_p50_ms = percentile(end_to_end, 0.5) * 1000
    result.e2e_p99_ms = percentile(end_to_end, 0.99) * 1000


async def _consume(
    client: DanubeClient, workload: Workload, progress: Callable[[str], None]
) -> float:
    topic = "/default/consume"
    await _publish(client, replace(workload, publish_messages=workload.consume_messages), topic)
    consumer = client.consumer(topic, "reader", "reader", start="earliest")
    await consumer.subscribe()
    got, acks, pending = 0, [], []
    started = last_report = time.perf_counter()
    while got < workload.consume_messages:
        message = await consumer.receive()
        got += 1
        pending.append(message)
        if len(pending) >= 1000 or _drained(consumer):
            acks.append(asyncio.ensure_future(consumer.ack_many(pending)))
            pending = []
        if time.perf_counter() - last_report > 5:
            last_report = time.perf_counter()
            progress(f"danube: consumed {got:,} of {workload.consume_messages:,}")
    elapsed = time.perf_counter() - started
    await asyncio.gather(*acks)
    await consumer.close()
    return workload.consume_messages / elapsed


def _drained(consumer: Consumer) -> bool:
    return consumer.queued == 0


async def _idle_topics(
    client: DanubeClient, workload: Workload, progress: Callable[[str], None]
) -> None:
    last_report = time.perf_counter()
    for index in range(workload.idle_topics):
        producer = client.producer(
            f"/default/idle-{index}", "idle", dispatch=DispatchStrategy.RELIABLE, batching=None
        )
        await producer.create()
        await producer.send(b"x")
        if time.perf_counter() - last_report > 5:
            last_report = time.perf_counter()
            progress(f"danube: {index + 1:,} of {workload.idle_topics:,} idle topics")
