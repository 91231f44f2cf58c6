"""Scenario 1: the official producer sends COUNT messages with binary payloads and attributes;
an official Exclusive consumer receives and acks every one.

Usage: exclusive.py BROKER_URL TOPIC COUNT

Result: `sent` and `received` (payload hex, attributes, msg_id fields) in order; `ack_sent`
per message; `ack_echo`: the AckResponse request_id of one ack sent through the client's
partition consumer.

`Consumer.ack()` returns None and silently skips the RPC when `msg_id.topic_name` names no
subscribed partition, so "it did not raise" proves little on its own: `ack_sent` records
whether the client's own condition for sending held, and `ack_echo` shows one AckResponse.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import build_client, describe, main, receive_n, report

from danube import SubType


def payload(index: int) -> bytes:
    """Binary payloads of varying length, covering every byte value (and an empty one), so
    byte-exactness is really tested rather than ASCII round-tripping."""
    return bytes((index * 31 + j) % 256 for j in range((index * 37) % 700))


async def scenario(argv: list[str]) -> None:
    url, topic, count = argv[0], argv[1], int(argv[2])
    client = await build_client(url)
    producer = client.new_producer().with_topic(topic).with_name("conf-producer").build()
    await producer.create()  # auto-creates the topic, so the consumer can subscribe
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("conf-consumer")
        .with_subscription("conf-exclusive")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    queue = await consumer.receive()

    report["sent"] = []
    for i in range(count):
        attributes = {"index": str(i), "kind": "conformance", "text": "grüße ✓"}
        data = payload(i)
        await producer.send(data, attributes)
        report["sent"].append({"payload": data.hex(), "attributes": attributes})

    report["received"] = []
    report["ack_sent"] = []
    messages = await receive_n(queue, count, 15.0, "exclusive consumer")
    for message in messages:
        report["received"].append(describe(message))
        await consumer.ack(message)  # raises on any error status
        report["ack_sent"].append(message.msg_id.topic_name in consumer._consumers)
    if messages:
        first = messages[0]
        partition = consumer._consumers[first.msg_id.topic_name]
        response = await partition.send_ack(first.request_id, first.msg_id, "conf-exclusive")
        report["ack_echo"] = {"sent": first.request_id, "answered": response.request_id}
    await consumer.close()
    await producer.close()


if __name__ == "__main__":
    main(scenario, timeout=30.0)
