"""Scenario 7: one official producer object and one official consumer object stay in use
across a broker restart (SIGTERM, then a new process on the same ports and data directory).

Usage: restart.py BROKER_URL TOPIC

Steps, with the pytest side in between:
1. producer + Exclusive consumer, a batch `before-i` through; emit `ready` with the ids.
2. wait for `restarted` (the broker is stopped and started again meanwhile; the client's
   receive loop keeps retrying on its own).
3. with the SAME producer object, send probes until the SAME consumer object receives one
   (its receive stream has reconnected: on a non-reliable topic anything sent earlier is
   lost by design), then a batch `after-i`.

Result: ids before and after, `send_errors` (errors the producer's send raised to us, each
retried with the same object), `probes_sent`, `reconnected_after_s`, `batch_received`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from official_harness import (
    Commands,
    build_client,
    emit,
    main,
    receive_for,
    receive_n,
    report,
)

from danube import SubType

BATCH = 10
RECONNECT_DEADLINE_S = 20.0


async def scenario(argv: list[str]) -> None:
    url, topic = argv[0], argv[1]
    commands = Commands()
    client = await build_client(url)
    producer = client.new_producer().with_topic(topic).with_name("conf-producer").build()
    await producer.create()
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("conf-consumer")
        .with_subscription("conf-restart")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    queue = await consumer.receive()
    for i in range(BATCH):
        await producer.send(f"before-{i}".encode(), None)
    before = await receive_n(queue, BATCH, 10.0, "batch before the restart")
    report["before_received"] = [m.payload.decode() for m in before]
    report["producer_id"] = producer._producers[0].producer_id
    report["consumer_id"] = consumer._consumers[topic].consumer_id
    emit("ready", producer_id=report["producer_id"], consumer_id=report["consumer_id"])

    await commands.expect("restarted", timeout=40.0)
    restarted_at = time.monotonic()
    report["send_errors"] = []
    report["probes_sent"] = 0
    first: list[Any] = []
    while not first and time.monotonic() - restarted_at < RECONNECT_DEADLINE_S:
        try:
            await producer.send(b"probe", None)
            report["probes_sent"] += 1
        except grpc.aio.AioRpcError as error:
            report["send_errors"].append(f"{error.code().name}: {error.details()}"[:200])
        first = await receive_for(queue, 0.25)
    report["reconnected"] = bool(first)
    report["reconnected_after_s"] = round(time.monotonic() - restarted_at, 3)
    report["producer_id_after"] = producer._producers[0].producer_id
    report["consumer_id_after"] = consumer._consumers[topic].consumer_id
    if first:
        for i in range(BATCH):
            await producer.send(f"after-{i}".encode(), None)
        batch = await receive_for(queue, 1.0)
        report["batch_received"] = [m.payload.decode() for m in batch if m.payload != b"probe"]
    await consumer.close()
    await producer.close()


if __name__ == "__main__":
    main(scenario, timeout=70.0)
