"""Reliable traffic through the official client on a cluster while the pytest side kills,
adds and rebalances brokers.

Usage: cluster_traffic.py SERVICE_URLS TOPIC   (SERVICE_URLS comma-separated)

A reliable producer sends `o-0, o-1, ...` (one at a time, as the official producer does) and
an Exclusive consumer acknowledges everything it receives, until the test says `stop`; then
the scenario waits until every message whose send returned has been received.

The official client follows Redirects and UNAVAILABLE by itself, which is all a topic move
needs. It cannot survive the death of the broker it talks to: its re-lookups go to that dead
broker (its `connect_url`), and its consumer reopens streams to it forever without backoff
(danube-reference §16.3 and §16.4). So this application does what one must do with that
client: when a send raises, or nothing has arrived for a while although sends succeed, it
builds a new client on the next service URL and creates the producer (or subscribes) again.
The result counts those recoveries. An ack can fail too, when the topic moved between the
delivery and the ack (the old broker answers UNAVAILABLE): the message is not lost, the new
owner delivers it again, so the application counts the failure and goes on receiving.

Events: `ready` once 20 messages made the round trip. Result: `acked` (payloads whose send
returned), `received` (distinct payloads), `missing`, `duplicates`, `producer_recoveries`,
`consumer_recoveries`, `ack_errors`, `errors` (the first ones raised to the application),
`consumer_failure` (what ended the consuming task early, if anything).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import Commands, build_client, emit, main, report

from danube import DispatchStrategy, SubType

STALL_S = 6.0
"""No message for this long while sends succeed: the consumer's broker is gone."""
DRAIN_S = 60.0
PACE_S = 0.01


class Endpoints:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._next = 0

    def next(self) -> str:
        url = self.urls[self._next % len(self.urls)]
        self._next += 1
        return url


async def scenario(argv: list[str]) -> None:
    endpoints, topic = Endpoints(argv[0].split(",")), argv[1]
    commands = Commands()
    acked: list[str] = []
    received: list[str] = []
    errors: list[str] = []
    state: dict[str, Any] = {"stop": False, "last_received": time.monotonic()}
    report.update(producer_recoveries=0, consumer_recoveries=0, ack_errors=0)

    async def new_producer() -> Any:
        while True:
            try:
                client = await build_client(endpoints.next())
                producer = (
                    client.new_producer()
                    .with_topic(topic)
                    .with_name("official-producer")
                    .with_dispatch_strategy(DispatchStrategy.RELIABLE)
                    .build()
                )
                await producer.create()
                return producer
            except Exception as error:
                errors.append(f"create producer: {error!r}"[:200])
                await asyncio.sleep(0.5)

    async def new_consumer() -> tuple[Any, asyncio.Queue[Any]]:
        while True:
            try:
                client = await build_client(endpoints.next())
                consumer = (
                    client.new_consumer()
                    .with_topic(topic)
                    .with_consumer_name("official-consumer")
                    .with_subscription("official-sub")
                    .with_subscription_type(SubType.EXCLUSIVE)
                    .build()
                )
                await consumer.subscribe()
                return consumer, await consumer.receive()
            except Exception as error:
                errors.append(f"subscribe: {error!r}"[:200])
                await asyncio.sleep(0.5)

    async def produce(producer: Any) -> None:
        index = 0
        while not state["stop"]:
            payload = f"o-{index}"
            try:
                await producer.send(payload.encode(), None)
            except Exception as error:
                errors.append(f"send {payload}: {error!r}"[:200])
                report["producer_recoveries"] += 1
                producer = await new_producer()
                continue
            acked.append(payload)
            index += 1
            await asyncio.sleep(PACE_S)

    async def consume(consumer: Any, queue: asyncio.Queue[Any]) -> None:
        while True:
            try:
                message = await asyncio.wait_for(queue.get(), 1.0)
            except TimeoutError:
                stalled = time.monotonic() - state["last_received"] > STALL_S
                if stalled and len(acked) > len(set(received)):
                    report["consumer_recoveries"] += 1
                    errors.append(f"consumer stalled at {len(set(received))} of {len(acked)}")
                    await consumer.close()
                    consumer, queue = await new_consumer()
                    state["last_received"] = time.monotonic()
                continue
            state["last_received"] = time.monotonic()
            received.append(message.payload.decode())
            try:
                await consumer.ack(message)
            except Exception as error:
                report["ack_errors"] += 1
                errors.append(f"ack {message.payload.decode()}: {error!r}"[:200])

    # The producer creates the topic; the consumer subscribes before the first send (a new
    # subscription starts at the latest message).
    producer = await new_producer()
    consuming = asyncio.create_task(consume(*await new_consumer()))
    producing = asyncio.create_task(produce(producer))
    while len(set(received)) < 20:
        await asyncio.sleep(0.05)
    emit("ready")
    await commands.expect("stop", timeout=400.0)
    state["stop"] = True
    await producing
    deadline = time.monotonic() + DRAIN_S
    while not set(acked) <= set(received) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    if consuming.done():
        report["consumer_failure"] = repr(consuming.exception())
    consuming.cancel()
    report["acked"] = len(acked)
    report["received"] = len(set(received))
    report["missing"] = sorted(set(acked) - set(received))[:50]
    report["duplicates"] = len(received) - len(set(received))
    report["errors"] = errors[:10]


if __name__ == "__main__":
    main(scenario, timeout=600.0)
