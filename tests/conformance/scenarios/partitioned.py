"""Scenario 3: the official partitioned producer (`with_partitions(N)`) creates
`<topic>-part-0..N-1`, sends COUNT round-robin messages and then one `send_with_key` message
per KEY; one official consumer on the base topic receives them all.

Usage: partitioned.py BROKER_URL TOPIC PARTITIONS COUNT KEY...

Result: `producers` (partition topic, producer name and id of each partition producer),
`subscribed` (the partitions the consumer resolved), `round_robin` and `keyed` (per message:
payload text and `msg_id.topic_name`), and `client_key_route` (the partition index the
official client's own router picks for each key).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import build_client, main, receive_for, receive_n, report

from danube import SubType


async def scenario(argv: list[str]) -> None:
    url, topic, partitions, count, keys = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4:]
    client = await build_client(url)
    producer = (
        client.new_producer()
        .with_topic(topic)
        .with_name("conf-producer")
        .with_partitions(partitions)
        .build()
    )
    await producer.create()  # creates the partition topics: the consumer can resolve them now
    report["producers"] = [
        {"topic": p.topic, "name": p.producer_name, "id": p.producer_id}
        for p in producer._producers
    ]
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("conf-consumer")
        .with_subscription("conf-partitioned")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    report["subscribed"] = sorted(consumer._consumers)
    queue = await consumer.receive()

    for i in range(count):
        await producer.send(f"rr-{i}".encode(), {"index": str(i)})
    messages = await receive_n(queue, count, 15.0, "round-robin messages")
    report["round_robin"] = [
        {"payload": m.payload.decode(), "topic": m.msg_id.topic_name} for m in messages
    ]
    for message in messages:
        await consumer.ack(message)

    report["client_key_route"] = {key: producer._message_router.key_route(key) for key in keys}
    for key in keys:
        await producer.send_with_key(key.encode(), {"key": key}, key)
    keyed = await receive_n(queue, len(keys), 15.0, "keyed messages")
    report["keyed"] = [
        {"payload": m.payload.decode(), "topic": m.msg_id.topic_name, "routing_key": m.routing_key}
        for m in keyed
    ]
    report["extra"] = [m.payload.decode() for m in await receive_for(queue, 0.3)]
    await consumer.close()
    await producer.close()


if __name__ == "__main__":
    main(scenario, timeout=30.0)
