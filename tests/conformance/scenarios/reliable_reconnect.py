"""One official reliable producer and one Exclusive consumer object stay in use across a broker
restart (graceful SIGTERM or SIGKILL, then a new process on the same ports and data directory).

Usage: reliable_reconnect.py BROKER_URL TOPIC BEFORE ACKED AFTER

Steps, with the pytest side in between:
1. a reliable producer creates the topic, the consumer subscribes; `before-0..BEFORE-1` are
   sent and received, only the first ACKED are acked (the rest stay in flight); emit `ready`.
2. wait for `restarted` (meanwhile the client's receive loop keeps reopening its stream).
3. a task receives and acks everything that arrives; the SAME producer object sends
   `after-0..AFTER-1`, retrying with the same object whatever error its send raises to us,
   until the consumer has seen every unacked `before-i` and every `after-i`, then listens a
   little longer for anything else.

Result: ids before and after, `before` / `after_restart` (received `{payload, offset}` in
arrival order), `sent_after` (payloads whose send returned), `send_errors`,
`first_after_restart_s` (restart → first message received again).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from official_harness import Commands, Message, build_client, emit, main, receive_n, report

from danube import DispatchStrategy, SubType

DEADLINE_S = 40.0
"""From `restarted` until every expected message must have arrived."""
QUIET_S = 1.5


def brief(message: Message) -> dict[str, Any]:
    return {"payload": message.payload.decode(), "offset": message.msg_id.topic_offset}


async def scenario(argv: list[str]) -> None:
    url, topic = argv[0], argv[1]
    before_count, acked_count, after_count = int(argv[2]), int(argv[3]), int(argv[4])
    commands = Commands()
    client = await build_client(url)
    producer = (
        client.new_producer()
        .with_topic(topic)
        .with_name("conf-producer")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("conf-consumer")
        .with_subscription("conf-reliable-restart")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    queue = await consumer.receive()
    for i in range(before_count):
        await producer.send(f"before-{i}".encode(), None)
    before: list[Message] = []
    while len(before) < before_count:  # acks as they come: the broker's window is 10 deep
        before += await receive_n(queue, 1, 15.0, f"message {len(before)} before the restart")
        if len(before) <= acked_count:
            await consumer.ack(before[-1])
    report["before"] = [brief(m) for m in before]
    report["producer_id"] = producer._producers[0].producer_id
    report["consumer_id"] = consumer._consumers[topic].consumer_id
    emit("ready", producer_id=report["producer_id"], consumer_id=report["consumer_id"])

    await commands.expect("restarted", timeout=60.0)
    restarted_at = time.monotonic()
    expected = {m.payload.decode() for m in before[acked_count:]}
    expected |= {f"after-{i}" for i in range(after_count)}
    after_restart: list[dict[str, Any]] = []
    report["after_restart"] = after_restart
    all_seen = asyncio.Event()

    async def receive_and_ack() -> None:
        while True:
            message = await queue.get()
            if not after_restart:
                report["first_after_restart_s"] = round(time.monotonic() - restarted_at, 3)
            after_restart.append(brief(message))
            await consumer.ack(message)
            if expected <= {m["payload"] for m in after_restart}:
                all_seen.set()

    receiving = asyncio.create_task(receive_and_ack())
    report["send_errors"] = []
    report["sent_after"] = []
    for i in range(after_count):
        while time.monotonic() - restarted_at < DEADLINE_S:
            try:
                await producer.send(f"after-{i}".encode(), None)
            except grpc.aio.AioRpcError as error:
                report["send_errors"].append(f"{error.code().name}: {error.details()}"[:200])
                await asyncio.sleep(0.2)
                continue
            report["sent_after"].append(f"after-{i}")
            break
    remaining = DEADLINE_S - (time.monotonic() - restarted_at)
    try:
        await asyncio.wait_for(all_seen.wait(), max(remaining, 0.0))
        report["all_seen"] = True
        await asyncio.sleep(QUIET_S)  # anything more would be a duplicate
    except TimeoutError:
        report["all_seen"] = False
    receiving.cancel()
    report["producer_id_after"] = producer._producers[0].producer_id
    report["consumer_id_after"] = consumer._consumers[topic].consumer_id
    await consumer.close()
    await producer.close()


if __name__ == "__main__":
    main(scenario, timeout=120.0)
