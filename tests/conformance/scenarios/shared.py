"""Scenario 2: two official consumer objects (different consumer names) on one Shared
subscription; the official producer sends COUNT messages.

Usage: shared.py BROKER_URL TOPIC COUNT

Result: `received`: consumer name -> payloads (as text) in arrival order, collected until
COUNT have arrived in total plus a short grace period, so duplicates would show up too.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import build_client, main, receive_for, report

from danube import SubType


async def scenario(argv: list[str]) -> None:
    url, topic, count = argv[0], argv[1], int(argv[2])
    client = await build_client(url)
    producer = client.new_producer().with_topic(topic).with_name("conf-producer").build()
    await producer.create()
    consumers = {}
    queues = {}
    for name in ("worker-a", "worker-b"):
        consumer = (
            client.new_consumer()
            .with_topic(topic)
            .with_consumer_name(name)
            .with_subscription("conf-shared")
            .with_subscription_type(SubType.SHARED)
            .build()
        )
        await consumer.subscribe()
        consumers[name] = consumer
        queues[name] = await consumer.receive()

    for i in range(count):
        await producer.send(f"{i}".encode(), {"index": str(i)})

    report["received"] = {name: [] for name in consumers}
    deadline = asyncio.get_running_loop().time() + 10.0
    while sum(map(len, report["received"].values())) < count:
        if asyncio.get_running_loop().time() > deadline:
            break
        for name, queue in queues.items():
            for message in await receive_for(queue, 0.05):
                await consumers[name].ack(message)
                report["received"][name].append(message.payload.decode())
    for name, queue in queues.items():  # grace period: anything more would be a duplicate
        report["received"][name] += [m.payload.decode() for m in await receive_for(queue, 0.3)]
    for consumer in consumers.values():
        await consumer.close()
    await producer.close()


if __name__ == "__main__":
    main(scenario, timeout=30.0)
