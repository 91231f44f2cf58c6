"""Our broker under the peer benchmark's workloads (`bench.workload`): a real `danube-broker`
process on loopback and our client in this process, batching on the batched path."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

from bench.phases import Stopwatch, Ticker, record_latencies, stamped_index, until, within
from bench.workload import SystemResult, Workload, rss_mib
from danube.client import DanubeClient, DispatchStrategy, Receipt
from danube.localcluster.broker_process import BrokerProcess

WINDOW = 10_000
"""The broker's `dispatch.max_unacked_messages` for the run (Danube's default is 10, which
makes a consumer wait for its acknowledgements every 10 messages)."""
PUBLISH_WINDOW = 20_000
"""Messages the throughput phase keeps enqueued and unanswered."""
ACK_BATCH = 1_000
"""Messages the consume phase acknowledges per call."""
CONFIG = f"""storage:
  wal:
    durability: fsync
dispatch:
  max_unacked_messages: {WINDOW}
"""


async def run_danube(workload: Workload, progress: Callable[[str], None]) -> SystemResult:
    result = SystemResult(
        system=f"Danube for Python {version('pydanube')}",
        durability="fsync (fdatasync) before ack, one group commit per batch",
    )
    result.notes.append(
        f"batched path, client batching defaults (linger 0 ms, up to 1,000 messages, 4 in "
        f"flight); broker dispatch.max_unacked_messages {WINDOW}"
    )
    with tempfile.TemporaryDirectory(prefix="danube-bench-") as tmp:
        root = Path(tmp)
        (root / "broker.yaml").write_text(CONFIG)
        broker = BrokerProcess(root / "data", config_file=root / "broker.yaml").start()
        try:
            async with DanubeClient(broker.url) as client:
                progress("danube: publish throughput")
                watch = Stopwatch(broker.pid)
                result.publish_per_s = await _publish(client, workload, "/default/pub", progress)
                result.notes.append(watch.stop().note("publish"))
                progress("danube: latency")
                await _latency(client, workload, result)
                progress("danube: consume throughput")
                watch = await _consume(client, workload, progress, broker.pid)
                result.consume_per_s = workload.consume_messages / watch.elapsed
                result.notes.append(watch.note("consume"))
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


async def _publish(
    client: DanubeClient, workload: Workload, topic: str, progress: Callable[[str], None]
) -> float:
    """Messages per second, one producer keeping `PUBLISH_WINDOW` enqueued and unanswered."""
    count = workload.publish_messages
    tick = Ticker(progress, f"danube: published to {topic}", count)
    payload = bytes(workload.message_bytes)
    producer = client.producer(topic, "bench", dispatch=DispatchStrategy.RELIABLE)
    async with producer:
        await producer.send(payload)
        pending: list[Awaitable[Receipt]] = []
        started = time.perf_counter()
        for index in range(count):
            pending.append(producer.enqueue(payload))
            if len(pending) >= PUBLISH_WINDOW:
                for answer in pending[: PUBLISH_WINDOW // 2]:
                    await answer
                del pending[: PUBLISH_WINDOW // 2]
                tick(index)
        for answer in pending:
            await answer
        return count / (time.perf_counter() - started)


async def _latency(client: DanubeClient, workload: Workload, result: SystemResult) -> None:
    """Open loop at `latency_rate`: each send starts on schedule, whatever is unanswered."""
    topic = "/default/latency"
    count, rate = workload.latency_messages, workload.latency_rate
    acked: list[float] = []
    received: dict[int, float] = {}
    sent: list[float] = [0.0] * count
    producer = await client.producer(topic, "lat", dispatch=DispatchStrategy.RELIABLE).create()
    consumer = await client.consumer(topic, "lat", "lat", start="latest").subscribe()

    async def consume() -> None:
        acks = []
        while len(received) < count:
            message = await consumer.receive()
            received[stamped_index(message.payload)] = time.perf_counter()
            acks.append(asyncio.ensure_future(consumer.ack(message)))
        await asyncio.gather(*acks)

    async def answer(index: int, stored: Awaitable[Receipt]) -> None:
        await stored
        acked.append(time.perf_counter() - sent[index])

    reader = asyncio.ensure_future(consume())
    padding = bytes(workload.message_bytes - 8)
    answers = []
    start = time.perf_counter()
    for index in range(count):
        await until(start + index / rate)
        sent[index] = time.perf_counter()
        stored = producer.enqueue(index.to_bytes(8, "little") + padding)
        answers.append(asyncio.ensure_future(answer(index, stored)))
    await within(asyncio.gather(*answers), "danube latency answers")
    result.latency_achieved_per_s = count / (time.perf_counter() - start)
    await within(reader, "danube latency consumer")
    await consumer.close()
    record_latencies(result, sent, acked, received)


async def _consume(
    client: DanubeClient, workload: Workload, progress: Callable[[str], None], broker_pid: int
) -> Stopwatch:
    """One consumer reads `consume_messages` published first, acknowledging every message
    (up to `ACK_BATCH` per call, without waiting for the answer before reading on); the
    stopwatch covers the reading."""
    topic = "/default/consume"
    count = workload.consume_messages
    await _publish(client, replace(workload, publish_messages=count), topic, progress)
    consumer = await client.consumer(topic, "reader", "reader", start="earliest").subscribe()
    tick = Ticker(progress, "danube: consumed", count)
    acks, pending = [], []
    watch = Stopwatch(broker_pid)
    for got in range(1, count + 1):
        pending.append(await consumer.receive())
        if len(pending) >= ACK_BATCH or consumer.queued == 0:
            acks.append(asyncio.ensure_future(consumer.ack_many(pending)))
            pending = []
        tick(got)
    watch.stop()
    await asyncio.gather(*acks)
    await consumer.close()
    return watch


async def _idle_topics(
    client: DanubeClient, workload: Workload, progress: Callable[[str], None]
) -> None:
    tick = Ticker(progress, "danube: idle topics", workload.idle_topics)
    for index in range(workload.idle_topics):
        producer = client.producer(
            f"/default/idle-{index}", "idle", dispatch=DispatchStrategy.RELIABLE, batching=None
        )
        await producer.create()
        await producer.send(b"x")
        tick(index + 1)
