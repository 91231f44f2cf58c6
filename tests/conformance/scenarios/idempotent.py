"""Scenario 6: creating the official producer again with the same name, and subscribing
again with the same consumer name, must return the existing ids (§16.7 item 2): the client
treats ALREADY_EXISTS as fatal and recreates producers itself after errors, so anything but
the old id breaks it.

Usage: idempotent.py BROKER_URL TOPIC

Result: `producer_ids` (first create, same object again, a second object, a second client),
`consumer_ids` (first subscribe, same object again, a second object: a takeover) and
`after_takeover` (payloads the second consumer object received).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import build_client, main, receive_for, receive_n, report

from danube import SubType


async def scenario(argv: list[str]) -> None:
    url, topic = argv[0], argv[1]
    client = await build_client(url)
    other_client = await build_client(url)

    def new_producer(owner: Any) -> Any:
        return owner.new_producer().with_topic(topic).with_name("conf-producer").build()

    def new_consumer() -> Any:
        return (
            client.new_consumer()
            .with_topic(topic)
            .with_consumer_name("conf-consumer")
            .with_subscription("conf-idempotent")
            .with_subscription_type(SubType.EXCLUSIVE)
            .build()
        )

    first = new_producer(client)
    await first.create()
    ids = {"first": first._producers[0].producer_id}
    await first.create()
    ids["same_object_again"] = first._producers[0].producer_id
    second = new_producer(client)
    await second.create()
    ids["second_object"] = second._producers[0].producer_id
    third = new_producer(other_client)
    await third.create()
    ids["second_client"] = third._producers[0].producer_id
    report["producer_ids"] = ids

    consumer = new_consumer()
    await consumer.subscribe()
    consumer_ids = {"first": consumer._consumers[topic].consumer_id}
    await consumer.subscribe()
    consumer_ids["same_object_again"] = consumer._consumers[topic].consumer_id
    takeover = new_consumer()
    await takeover.subscribe()
    consumer_ids["second_object"] = takeover._consumers[topic].consumer_id
    report["consumer_ids"] = consumer_ids

    queue = await takeover.receive()
    for i in range(5):
        await second.send(f"m-{i}".encode(), None)
    received = await receive_n(queue, 5, 10.0, "consumer after takeover")
    received += await receive_for(queue, 0.2)
    report["after_takeover"] = [m.payload.decode() for m in received]
    for producer in (first, second, third):
        await producer.close()
    await consumer.close()
    await takeover.close()


if __name__ == "__main__":
    main(scenario, timeout=30.0)
