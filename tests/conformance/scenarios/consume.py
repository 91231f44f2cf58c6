"""A long-running official consumer for scenarios that span processes (Failover).

Usage: consume.py BROKER_URL TOPIC SUBSCRIPTION CONSUMER_NAME SUBSCRIPTION_TYPE

Emits `subscribed` (with the consumer id) once Subscribe returned and the receive loop runs,
then one `message` event per delivered message (acked at once), until stdin says `stop` (or
closes); the result holds the count. It runs as its own process so the test can SIGKILL it:
a killed client sends nothing, unlike a clean close.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import Commands, build_client, emit, main, report

from danube import SubType


async def scenario(argv: list[str]) -> None:
    url, topic, subscription, name, sub_type = argv[:5]
    commands = Commands()
    client = await build_client(url)
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(subscription)
        .with_subscription_type(SubType[sub_type.upper()])
        .build()
    )
    await consumer.subscribe()
    queue = await consumer.receive()
    emit("subscribed", consumer_ids={t: c.consumer_id for t, c in consumer._consumers.items()})

    async def forward() -> None:
        while True:
            message = await queue.get()
            await consumer.ack(message)
            report["received"] = report.get("received", 0) + 1
            emit("message", payload=message.payload.decode(), topic=message.msg_id.topic_name)

    forwarding = asyncio.create_task(forward())
    try:
        await commands.expect("stop", timeout=60.0)
    finally:
        forwarding.cancel()
        await consumer.close()


if __name__ == "__main__":
    main(scenario, timeout=90.0)
