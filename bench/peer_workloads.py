"""NATS JetStream and Redis Streams under the peer benchmark's workloads (`bench.workload`):
each on a fresh server of its own (`bench.peer_servers`), driven by one producer in this
process through the ordinary Python client, as our broker is by ours (`bench.danube_workloads`).
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StorageType
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from bench.peer_servers import PeerServer, nats_server, redis_server
from bench.phases import (
    Stopwatch,
    Ticker,
    record_latencies,
    stamped_index,
    until,
    within,
)
from bench.workload import SystemResult, Workload, rss_mib

PUBLISH_WINDOW = 4_000
"""NATS publishes awaiting their ack at once (nats-py's own default for `publish_async`)."""
PIPELINE = 500
"""Redis XADDs sent in one pipeline; the next is sent once all of its replies are in."""
BATCH = 1_000
"""Messages one consumer read asks for: a NATS fetch, a Redis XREADGROUP COUNT."""
MAX_ACK_PENDING = 20_000
"""The NATS consumer's unacknowledged-message limit, well above one fetch, so the limit never
holds back the next fetch while the previous batch's ack is still on its way."""
OPEN_FILES_PER_STREAM = 2
"""nats-server 2.9 keeps each stream's message block and its index open, even when idle."""
OPEN_FILES_SPARE = 512
NATS_DURABILITY = (
    "written to the OS before ack, fsync every 2 min (JetStream file store default sync "
    "interval; not fsynced per ack)"
)
REDIS_DURABILITY = {
    "everysec": (
        "AOF appendfsync everysec: fsync once per second (up to 1 s of acked messages lost on "
        "power failure)"
    ),
    "always": "AOF appendfsync always: fsync before the replies of each event-loop batch",
}


def _check(workload: Workload) -> None:
    if workload.message_bytes < 8:
        raise ValueError("message_bytes must be at least 8: the latency phase stamps 8 bytes")


async def run_nats(workload: Workload, progress: Callable[[str], None]) -> SystemResult:
    _check(workload)
    with nats_server() as server:
        result = SystemResult(system=f"NATS JetStream {server.version}", durability=NATS_DURABILITY)
        connection = await nats.connect(server.url, allow_reconnect=False)
        try:
            js = connection.jetstream(publish_async_max_pending=PUBLISH_WINDOW)
            progress(f"nats: publish throughput, {workload.publish_messages:,} messages")
            watch = await _nats_throughput(js, server.pid, workload, progress)
            result.publish_per_s = workload.publish_messages / watch.elapsed
            result.notes.append(watch.note("NATS publish"))
            progress(
                f"nats: latency, {workload.latency_messages:,} messages at "
                f"{workload.latency_rate:,} msg/s"
            )
            await _nats_latency(js, workload, result)
            progress(f"nats: consume throughput, {workload.consume_messages:,} messages")
            watch = await _nats_consume(js, server.pid, workload, progress)
            result.consume_per_s = workload.consume_messages / watch.elapsed
            result.notes.append(watch.note("NATS consume"))
        finally:
            await connection.close()
    result.notes += [
        f"NATS publish: js.publish_async with up to {PUBLISH_WINDOW:,} publishes awaiting their "
        "ack; file storage, one stream per phase",
        "NATS latency consumer: an ordered push consumer (no acks, flow control) in this process",
        f"NATS consume: a durable pull consumer fetching {BATCH:,} at a time, AckPolicy all, "
        f"acking the last message of each batch; max_ack_pending {MAX_ACK_PENDING:,}",
    ]
    await _nats_memory(workload, progress, result)
    return result


async def _nats_publish(
    js: JetStreamContext, subject: str, count: int, payload: bytes, tick: Ticker
) -> None:
    answers: list[asyncio.Future[Any]] = []
    for index in range(count):
        answers.append(await js.publish_async(subject, payload))
        tick(index + 1)
    await within(asyncio.gather(*answers), f"acks of {count:,} NATS publishes")


async def _nats_throughput(
    js: JetStreamContext, server_pid: int, workload: Workload, progress: Callable[[str], None]
) -> Stopwatch:
    count = workload.publish_messages
    await js.add_stream(name="BENCH_PUB", subjects=["bench.pub"], storage=StorageType.FILE)
    tick = Ticker(progress, "nats: published", count)
    payload = os.urandom(workload.message_bytes)
    watch = Stopwatch(server_pid)
    await _nats_publish(js, "bench.pub", count, payload, tick)
    watch.stop()
    await js.delete_stream("BENCH_PUB")
    return watch


async def _nats_latency(js: JetStreamContext, workload: Workload, result: SystemResult) -> None:
    count, rate = workload.latency_messages, workload.latency_rate
    await js.add_stream(name="BENCH_LAT", subjects=["bench.lat"], storage=StorageType.FILE)
    sent = [0.0] * count
    acked: list[float] = []
    received: dict[int, float] = {}
    all_received = asyncio.Event()

    async def receive(message: Msg) -> None:
        received[stamped_index(message.data)] = time.perf_counter()
        if len(received) == count:
            all_received.set()

    def answered(at: float) -> Callable[[asyncio.Future[Any]], None]:
        return lambda _: acked.append(time.perf_counter() - at)

    subscription = await js.subscribe("bench.lat", cb=receive, ordered_consumer=True)
    padding = os.urandom(workload.message_bytes - 8)
    answers: list[asyncio.Future[Any]] = []
    start = time.perf_counter()
    for index in range(count):
        await until(start + index / rate)
        sent[index] = time.perf_counter()
        answer = await js.publish_async("bench.lat", index.to_bytes(8, "little") + padding)
        answer.add_done_callback(answered(sent[index]))
        answers.append(answer)
    await within(asyncio.gather(*answers), "NATS latency acks")
    result.latency_achieved_per_s = count / (time.perf_counter() - start)
    await within(all_received.wait(), "NATS latency consumer")
    await subscription.unsubscribe()
    await js.delete_stream("BENCH_LAT")
    record_latencies(result, sent, acked, received)


async def _nats_consume(
    js: JetStreamContext, server_pid: int, workload: Workload, progress: Callable[[str], None]
) -> Stopwatch:
    count = workload.consume_messages
    await js.add_stream(name="BENCH_CON", subjects=["bench.con"], storage=StorageType.FILE)
    payload = os.urandom(workload.message_bytes)
    await _nats_publish(js, "bench.con", count, payload, Ticker(progress, "nats: filled", count))
    reader = await js.pull_subscribe(
        "bench.con",
        durable="reader",
        stream="BENCH_CON",
        config=ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=MAX_ACK_PENDING),
    )
    tick = Ticker(progress, "nats: consumed", count)
    got = 0
    watch = Stopwatch(server_pid)
    while got < count:
        batch = await reader.fetch(BATCH, timeout=5)
        got += len(batch)
        await batch[-1].ack()
        tick(got)
    watch.stop()
    await reader.unsubscribe()
    await js.delete_stream("BENCH_CON")
    return watch


async def _nats_memory(
    workload: Workload, progress: Callable[[str], None], result: SystemResult
) -> None:
    topics = workload.idle_topics
    progress(f"nats: memory with {topics:,} idle topics")
    with nats_server() as server:
        result.base_rss_mib = rss_mib(server.pid)
        open_files = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)[0]
        fit = (open_files - OPEN_FILES_SPARE) // OPEN_FILES_PER_STREAM
        connection = await nats.connect(server.url, allow_reconnect=False)
        try:
            js = connection.jetstream()
            if topics <= fit:
                elapsed = await _nats_idle_streams(js, topics, progress)
                result.notes.append(
                    f"NATS idle topics: one JetStream stream (file storage) each, holding one "
                    f"1-byte message, on a fresh server; creating them took {elapsed:.0f} s"
                )
            else:
                await _nats_idle_subjects(js, topics, progress)
                result.notes.append(
                    f"NATS idle topics: {topics:,} subjects of ONE stream (file storage), one "
                    f"1-byte message each, on a fresh server, because {topics:,} streams would "
                    f"need about {OPEN_FILES_PER_STREAM * topics:,} open files (nats-server 2.9 "
                    f"keeps {OPEN_FILES_PER_STREAM} per stream) and its open-file limit here is "
                    f"{open_files:,}; a subject is far lighter than a stream, which flatters "
                    "NATS here"
                )
            result.idle_rss_mib = rss_mib(server.pid)
        finally:
            await connection.close()
    if topics > fit:
        await _nats_reference_streams(fit // 1000 * 1000, progress, result)


async def _nats_idle_streams(
    js: JetStreamContext, count: int, progress: Callable[[str], None]
) -> float:
    tick = Ticker(progress, "nats: idle streams", count)
    started = time.perf_counter()
    for index in range(count):
        # One at a time: each creation waits on the server's stream-wide bookkeeping anyway.
        await js.add_stream(
            name=f"IDLE_{index}", subjects=[f"idle.{index}"], storage=StorageType.FILE
        )
        await js.publish(f"idle.{index}", b"x")
        tick(index + 1)
    return time.perf_counter() - started


async def _nats_idle_subjects(
    js: JetStreamContext, count: int, progress: Callable[[str], None]
) -> None:
    await js.add_stream(name="IDLE", subjects=["idle.>"], storage=StorageType.FILE)
    answers: list[asyncio.Future[Any]] = []
    tick = Ticker(progress, "nats: idle subjects", count)
    for index in range(count):
        answers.append(await js.publish_async(f"idle.{index}", b"x"))
        tick(index + 1)
    await within(asyncio.gather(*answers), "NATS idle subject publishes")


async def _nats_reference_streams(
    count: int, progress: Callable[[str], None], result: SystemResult
) -> None:
    """What streams, NATS's counterpart of a topic, cost at the largest round count the
    open-file limit allows: the subjects measured instead would otherwise be the only word."""
    if count <= 0:
        return
    progress(f"nats: reference, memory with {count:,} idle streams")
    with nats_server() as server:
        connection = await nats.connect(server.url, allow_reconnect=False)
        try:
            elapsed = await _nats_idle_streams(connection.jetstream(), count, progress)
            memory = rss_mib(server.pid)
        finally:
            await connection.close()
    result.notes.append(
        f"NATS for reference: {count:,} streams (file storage, one 1-byte message each) on a "
        f"fresh server took {elapsed:.0f} s to create and left it at {memory:.0f} MiB RSS"
    )


async def run_redis(
    workload: Workload, appendfsync: str, progress: Callable[[str], None]
) -> SystemResult:
    _check(workload)
    label = f"redis {appendfsync}"
    with redis_server(appendfsync) as server:
        result = SystemResult(
            system=f"Redis Streams {server.version}", durability=REDIS_DURABILITY[appendfsync]
        )
        client = Redis.from_url(server.url)
        try:
            progress(f"{label}: publish throughput, {workload.publish_messages:,} messages")
            watch = await _redis_throughput(client, server.pid, workload, label, progress)
            result.publish_per_s = workload.publish_messages / watch.elapsed
            result.notes.append(watch.note("Redis publish"))
            progress(
                f"{label}: latency, {workload.latency_messages:,} messages at "
                f"{workload.latency_rate:,} msg/s"
            )
            await _redis_latency(client, server, workload, result)
            progress(f"{label}: consume throughput, {workload.consume_messages:,} messages")
            watch = await _redis_consume(client, server.pid, workload, label, progress)
            result.consume_per_s = workload.consume_messages / watch.elapsed
            result.notes.append(watch.note("Redis consume"))
        finally:
            await client.aclose()
    progress(f"{label}: memory with {workload.idle_topics:,} idle topics")
    with redis_server(appendfsync) as server:
        result.base_rss_mib = rss_mib(server.pid)
        client = Redis.from_url(server.url)
        try:
            tick = Ticker(progress, f"{label}: idle streams", workload.idle_topics)
            await _redis_publish(
                client, lambda index: f"idle:{index}", workload.idle_topics, b"x", tick
            )
            result.idle_rss_mib = rss_mib(server.pid)
        finally:
            await client.aclose()
    result.notes += [
        f"Redis publish: XADD pipelined {PIPELINE} at a time (transaction=False) on one "
        "connection, the next pipeline sent once the previous one's replies are in",
        "Redis latency: XADDs written on schedule to one connection whose replies another task "
        "reads (redis-py's Connection, not its client, which would wait for each reply); the "
        "consumer is XREAD BLOCK from the last id on a separate connection",
        f"Redis consume: XREADGROUP COUNT {BATCH:,}, each batch's XACK pipelined with the next "
        "XREADGROUP",
        "Redis idle topics: one stream key each, holding one 1-byte message, on a fresh server",
    ]
    return result


async def _redis_publish(
    client: Redis, key: Callable[[int], str], count: int, payload: bytes, tick: Ticker
) -> None:
    for first in range(0, count, PIPELINE):
        pipeline = client.pipeline(transaction=False)
        for index in range(first, min(first + PIPELINE, count)):
            pipeline.xadd(key(index), {"d": payload})
        await pipeline.execute()
        tick(min(first + PIPELINE, count))


async def _redis_throughput(
    client: Redis,
    server_pid: int,
    workload: Workload,
    label: str,
    progress: Callable[[str], None],
) -> Stopwatch:
    count = workload.publish_messages
    tick = Ticker(progress, f"{label}: published", count)
    payload = os.urandom(workload.message_bytes)
    watch = Stopwatch(server_pid)
    await _redis_publish(client, lambda _: "bench:pub", count, payload, tick)
    watch.stop()
    await client.delete("bench:pub")
    return watch


async def _redis_latency(
    client: Redis, server: PeerServer, workload: Workload, result: SystemResult
) -> None:
    count, rate = workload.latency_messages, workload.latency_rate
    sent = [0.0] * count
    acked: list[float] = []
    received: dict[int, float] = {}
    # The producer's own connection, written and read by separate tasks: redis-py's client
    # waits for each reply before a connection is reused, which would make the load closed-loop
    # (or open a connection per XADD in flight), while Redis answers a connection in order.
    producer = Connection(host=server.host, port=server.port)
    await producer.connect()
    reader_client = Redis.from_url(server.url)
    await reader_client.ping()  # connected before the clock starts

    async def consume() -> None:
        last = b"0-0"
        while len(received) < count:
            reply = await reader_client.xread({"bench:lat": last}, count=BATCH, block=1000)
            now = time.perf_counter()
            for _stream, entries in reply:
                for entry_id, fields in entries:
                    received[stamped_index(fields[b"d"])] = now
                    last = entry_id

    async def answers() -> None:
        for index in range(count):
            await producer.read_response()
            acked.append(time.perf_counter() - sent[index])

    reader = asyncio.ensure_future(consume())
    answered = asyncio.ensure_future(answers())
    padding = os.urandom(workload.message_bytes - 8)
    try:
        start = time.perf_counter()
        for index in range(count):
            await until(start + index / rate)
            sent[index] = time.perf_counter()
            payload = index.to_bytes(8, "little") + padding
            await producer.send_command("XADD", "bench:lat", "*", "d", payload)
        await within(answered, "Redis latency replies")
        result.latency_achieved_per_s = count / (time.perf_counter() - start)
        await within(reader, "Redis latency consumer")
    finally:
        reader.cancel()
        answered.cancel()
        await reader_client.aclose()
        await producer.disconnect()
    await client.delete("bench:lat")
    record_latencies(result, sent, acked, received)


async def _redis_consume(
    client: Redis,
    server_pid: int,
    workload: Workload,
    label: str,
    progress: Callable[[str], None],
) -> Stopwatch:
    count = workload.consume_messages
    payload = os.urandom(workload.message_bytes)
    filled = Ticker(progress, f"{label}: filled", count)
    await _redis_publish(client, lambda _: "bench:con", count, payload, filled)
    await client.xgroup_create("bench:con", "reader", id="0")
    tick = Ticker(progress, f"{label}: consumed", count)
    got = 0
    ids: list[bytes] = []
    watch = Stopwatch(server_pid)
    while got < count:
        pipeline = client.pipeline(transaction=False)
        if ids:
            pipeline.xack("bench:con", "reader", *ids)
        pipeline.xreadgroup("reader", "one", {"bench:con": ">"}, count=BATCH)
        reply = (await pipeline.execute())[-1]
        if not reply:
            raise RuntimeError(f"Redis stream ran dry after {got:,} of {count:,} messages")
        ids = [entry_id for entry_id, _fields in reply[0][1]]
        got += len(ids)
        tick(got)
    watch.stop()
    await client.xack("bench:con", "reader", *ids)
    await client.delete("bench:con")
    return watch
