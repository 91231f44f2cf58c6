"""Reliable topics with the official client: producers built with
`with_dispatch_strategy(DispatchStrategy.RELIABLE)` (ProducerRequest.dispatch_strategy = 1),
consumers that ack (AckRequest{request_id, msg_id, subscription_name}, matched by
`msg_id.topic_offset`).

Usage: reliable.py MODE BROKER_URL TOPIC ARGS...

- `roundtrip TOPIC COUNT SUBTYPE`: a reliable producer creates the topic, a consumer subscribes,
  COUNT binary messages are sent while the consumer receives and acks each as it arrives.
  Result: `sent`, `received` (see `describe`), `send_replies`, `ack_sent`, `ack_echo`, `extra`
  (anything after COUNT), `after_takeover` (what a new consumer object with the same name gets
  once everything was acked: nothing), and `mismatch` (errors for a non-reliable producer on
  this topic and a reliable producer on a non-reliable topic).
- `redeliver TOPIC COUNT UNACK_EVERY`: an Exclusive consumer receives COUNT messages and acks
  all but every UNACK_EVERY-th, then closes; a new consumer object with the same name on the
  same subscription must get exactly the unacked ones again (at-least-once), then new ones.
  Result: `acked`, `unacked`, `first_offsets`, `redelivered`, `consumer_ids`, `more`, `extra`.
- `hold TOPIC SUBSCRIPTION SUBTYPE NAME COUNT UNACK_EVERY` (interactive): like the first half of
  `redeliver`, then emits `holding` and waits to be SIGKILLed (a crashed application).
- `resume TOPIC SUBSCRIPTION SUBTYPE NAME EXPECTED MORE`: subscribes to what `hold` left,
  receives and acks EXPECTED messages, then sends MORE new ones through a reliable producer
  with `hold`'s producer name and receives them. Result: `redelivered`, `more`, `extra`.

Received messages are reported as `{"payload": text, "offset": msg_id.topic_offset}` except in
`roundtrip`, which reports `describe()`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from official_harness import (
    Commands,
    Message,
    ScenarioFailure,
    build_client,
    describe,
    emit,
    main,
    receive_for,
    receive_n,
    report,
)

from danube import DanubeClient, DispatchStrategy, SubType

PRODUCER = "conf-reliable-producer"
QUIET_S = 1.5
"""How long to listen for messages that must not come (redeliveries of acked ones)."""


def payload(index: int, count: int) -> bytes:
    """Binary payloads of varying length covering every byte value, one empty, and one of
    1 MiB in the middle, so the WAL round trip is byte-exact and crosses record sizes."""
    if index == count // 2:
        return bytes(j % 251 for j in range(1 << 20))
    return bytes((index * 31 + j) % 256 for j in range((index * 37) % 700))


def brief(message: Message) -> dict[str, Any]:
    return {"payload": message.payload.decode(), "offset": message.msg_id.topic_offset}


def reliable_producer(client: DanubeClient, topic: str, name: str = PRODUCER) -> Any:
    return (
        client.new_producer()
        .with_topic(topic)
        .with_name(name)
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )


async def subscribed(
    client: DanubeClient, topic: str, subscription: str, sub_type: SubType, name: str
) -> tuple[Any, asyncio.Queue[Message]]:
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(subscription)
        .with_subscription_type(sub_type)
        .build()
    )
    await consumer.subscribe()
    return consumer, await consumer.receive()


async def create_error(producer: Any) -> str:
    """The status a producer's create() fails with ("created" if it does not fail)."""
    try:
        await producer.create()
    except grpc.aio.AioRpcError as error:
        return f"{error.code().name}: {error.details()}"[:300]
    return "created"


async def roundtrip(client: DanubeClient, argv: list[str]) -> None:
    topic, count, sub_type = argv[0], int(argv[1]), SubType[argv[2].upper()]
    producer = reliable_producer(client, topic)
    await producer.create()  # auto-creates the topic as a reliable one
    report["producer_id"] = producer._producers[0].producer_id
    consumer, queue = await subscribed(client, topic, "conf-reliable", sub_type, "conf-consumer")

    report["received"] = []
    report["ack_sent"] = []

    async def receive_and_ack() -> list[Message]:
        messages = []
        for _ in range(count):
            message = (await receive_n(queue, 1, 20.0, f"message {len(messages)} of {count}"))[0]
            messages.append(message)
            report["received"].append(describe(message))
            await consumer.ack(message)  # raises on any error status
            report["ack_sent"].append(message.msg_id.topic_name in consumer._consumers)
        return messages

    receiving = asyncio.create_task(receive_and_ack())
    report["sent"] = []
    report["send_replies"] = []
    for i in range(count):
        attributes = {"index": str(i), "text": "grüße ✓"}
        data = payload(i, count)
        report["send_replies"].append(await producer.send(data, attributes))
        report["sent"].append({"payload": data.hex(), "attributes": attributes})
    messages = await receiving
    report["extra"] = [describe(m) for m in await receive_for(queue, QUIET_S)]

    first = messages[0]
    partition = consumer._consumers[first.msg_id.topic_name]
    response = await partition.send_ack(first.request_id, first.msg_id, "conf-reliable")
    report["ack_echo"] = {"sent": first.request_id, "answered": response.request_id}
    await consumer.close()

    # Everything was acked: a takeover must not bring any of it back.
    takeover, takeover_queue = await subscribed(
        client, topic, "conf-reliable", sub_type, "conf-consumer"
    )
    report["after_takeover"] = [describe(m) for m in await receive_for(takeover_queue, QUIET_S)]
    await takeover.close()

    plain_topic = f"{topic}-plain"
    plain = client.new_producer().with_topic(plain_topic).with_name("conf-plain").build()
    await plain.create()  # a non-reliable topic
    report["mismatch"] = {
        "non_reliable_on_reliable": await create_error(
            client.new_producer().with_topic(topic).with_name("conf-plain").build()
        ),
        "reliable_on_non_reliable": await create_error(
            reliable_producer(client, plain_topic, "conf-reliable-2")
        ),
    }
    await plain.close()
    await producer.close()


async def receive_partially_acked(
    client: DanubeClient, argv: list[str]
) -> tuple[Any, Any, list[Message]]:
    """`hold`'s first half: subscribe, send COUNT, receive them, ack all but every n-th."""
    topic, subscription, sub_type, name = argv[0], argv[1], SubType[argv[2].upper()], argv[3]
    count, unack_every = int(argv[4]), int(argv[5])
    producer = reliable_producer(client, topic)
    await producer.create()
    consumer, queue = await subscribed(client, topic, subscription, sub_type, name)
    for i in range(count):
        await producer.send(f"m-{i}".encode(), None)
    # Acks go out as messages arrive: the broker's window (`max_unacked_messages`, default 10)
    # holds back whatever lies beyond the unacked ones, so the unacked must stay below it.
    messages: list[Message] = []
    report["acked"], report["unacked"] = [], []
    for _ in range(count):
        message = (await receive_n(queue, 1, 15.0, f"first consumer, message {len(messages)}"))[0]
        messages.append(message)
        if int(message.payload.decode().removeprefix("m-")) % unack_every == 0:
            report["unacked"].append(message.payload.decode())
        else:
            await consumer.ack(message)
            report["acked"].append(message.payload.decode())
    report["first_offsets"] = [m.msg_id.topic_offset for m in messages]
    report["consumer_ids"] = [consumer._consumers[topic].consumer_id]
    return producer, consumer, messages


async def receive_all_acking(
    consumer: Any, queue: asyncio.Queue[Message], count: int, what: str
) -> list[dict[str, Any]]:
    """`count` messages, each acked on arrival (so the broker's window never holds them up)."""
    received: list[dict[str, Any]] = []
    while len(received) < count:
        message = (await receive_n(queue, 1, 15.0, f"{what}, message {len(received)}"))[0]
        received.append(brief(message))
        await consumer.ack(message)
    return received


async def redeliver(client: DanubeClient, argv: list[str]) -> None:
    topic, count, unack_every = argv[0], int(argv[1]), int(argv[2])
    subscription = "conf-redeliver"
    producer, first, _ = await receive_partially_acked(
        client, [topic, subscription, "exclusive", "conf-consumer", str(count), str(unack_every)]
    )
    await first.close()  # cancels its receive stream; no RPC says goodbye

    second, queue = await subscribed(
        client, topic, subscription, SubType.EXCLUSIVE, "conf-consumer"
    )
    report["consumer_ids"].append(second._consumers[topic].consumer_id)
    report["redelivered"] = await receive_all_acking(
        second, queue, len(report["unacked"]), "second consumer (redeliveries)"
    )
    for i in range(5):
        await producer.send(f"more-{i}".encode(), None)
    report["more"] = await receive_all_acking(second, queue, 5, "second consumer (new ones)")
    report["extra"] = [brief(m) for m in await receive_for(queue, QUIET_S)]
    await second.close()
    await producer.close()


async def hold(client: DanubeClient, argv: list[str]) -> None:
    commands = Commands()
    await receive_partially_acked(client, argv)
    emit("holding", **report)
    await commands.expect("stop", timeout=60.0)
    raise ScenarioFailure("hold is meant to be killed, not stopped")


async def resume(client: DanubeClient, argv: list[str]) -> None:
    topic, subscription, sub_type, name = argv[0], argv[1], SubType[argv[2].upper()], argv[3]
    expected, more = int(argv[4]), int(argv[5])
    consumer, queue = await subscribed(client, topic, subscription, sub_type, name)
    report["consumer_id"] = consumer._consumers[topic].consumer_id
    report["redelivered"] = await receive_all_acking(consumer, queue, expected, "redeliveries")
    producer = reliable_producer(client, topic)
    await producer.create()
    for i in range(more):
        await producer.send(f"more-{i}".encode(), None)
    report["more"] = await receive_all_acking(consumer, queue, more, "new messages")
    report["extra"] = [brief(m) for m in await receive_for(queue, QUIET_S)]
    await consumer.close()
    await producer.close()


MODES = {"roundtrip": roundtrip, "redeliver": redeliver, "hold": hold, "resume": resume}


async def scenario(argv: list[str]) -> None:
    mode, url = argv[0], argv[1]
    if mode not in MODES:
        raise ScenarioFailure(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")
    client = await build_client(url)
    await MODES[mode](client, argv[2:])


if __name__ == "__main__":
    main(scenario, timeout=75.0)
