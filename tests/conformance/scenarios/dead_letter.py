"""The DeadLetter poison policy with the official client (issue 24, point 5): the test set
the subscription's failure policy (`max_redelivery_count` 2, dead-letter topic DLQ) and
created both topics reliable; here a consumer nacks the one message every time it comes
(three deliveries, then none), and a second consumer, on the dead-letter topic, receives it
with its attributes and Danube's `x-original-*` ones.

Usage: dead_letter.py BROKER_URL TOPIC SUBSCRIPTION DLQ
Result: `sent` (the producer's answer), `deliveries` (each delivery of the nacked message),
`after` (anything after the third), `dead_letters` (what the dead-letter consumer got).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import build_client, describe, main, receive_for, receive_n, report

from danube import DispatchStrategy, SubType

QUIET_S = 1.5
"""How long to listen for a fourth delivery that must not come."""


async def scenario(argv: list[str]) -> None:
    url, topic, subscription, dlq = argv
    client = await build_client(url)
    consumers = []
    queues = []
    for name, target, sub in (("conf-poisoned", topic, subscription), ("conf-dlq", dlq, "dlq")):
        consumer = (
            client.new_consumer()
            .with_topic(target)
            .with_consumer_name(name)
            .with_subscription(sub)
            .with_subscription_type(SubType.SHARED)
            .build()
        )
        await consumer.subscribe()
        consumers.append(consumer)
        queues.append(await consumer.receive())
    producer = (
        client.new_producer()
        .with_topic(topic)
        .with_name("conf-dlq-producer")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    report["sent"] = await producer.send(b"poison \x00\xff", {"kind": "poison", "text": "grüße"})
    report["deliveries"] = []
    for attempt in range(3):
        [message] = await receive_n(queues[0], 1, 10.0, f"delivery {attempt + 1}")
        report["deliveries"].append(describe(message))
        await consumers[0].nack(message, None, "cannot parse")
    report["after"] = [describe(m) for m in await receive_for(queues[0], QUIET_S)]
    dead = await receive_n(queues[1], 1, 10.0, "the dead letter")
    report["dead_letters"] = [describe(m) for m in dead]
    await consumers[1].ack(dead[0])
    for consumer in consumers:
        await consumer.close()
    await producer.close()


if __name__ == "__main__":
    main(scenario, timeout=40.0)
