"""Scenario 5: HealthCheck answers for an official producer and consumer before and after the
test deletes their topic, and the official consumer's resubscription afterwards.

Usage: health.py BROKER_URL TOPIC

Steps, with the pytest side in between:
1. official producer + Exclusive consumer on TOPIC, one message through; HealthCheck (the
   client's own generated stubs, separate channel) for both ids; emit `ready` with the ids,
   statuses and `subscribed_at` (when the client's consumer health loop made its first check:
   it checks every 5 s from then on, which lets the test time its deletion).
2. wait for `deleted`: HealthCheck both ids again, emit `after_delete`.
3. recreate the topic by creating a second official producer (auto-create), try the OLD
   producer once (its id died with the topic), then wait for the consumer to resubscribe
   (its health loop sees CLOSE, §16.4) and publish probes until one arrives; then a batch.

Result: everything above plus `resubscribed_after_s`, `probes_sent`, `batch_received`.
A consumer that never comes back is reported as `resubscribed: false`, not as a crash, so
the test can say exactly what happened.
"""

from __future__ import annotations

import asyncio
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
from danube.proto import DanubeApi_pb2, DanubeApi_pb2_grpc

BATCH = 10


async def health(stub: DanubeApi_pb2_grpc.HealthCheckStub, client_type: int, client_id: int) -> str:
    """One HealthCheck through the official generated stub; the status name."""
    request = DanubeApi_pb2.HealthCheckRequest(request_id=1, client=client_type, id=client_id)
    response = await stub.HealthCheck(request, timeout=5.0)
    return DanubeApi_pb2.HealthCheckResponse.ClientStatus.Name(response.status)


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
        .with_subscription("conf-health")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    subscribed_at = time.time()
    queue = await consumer.receive()
    await producer.send(b"before-delete", None)
    await receive_n(queue, 1, 5.0, "message before the deletion")

    partition = consumer._consumers[topic]
    producer_id = producer._producers[0].producer_id
    consumer_id = partition.consumer_id
    channel = grpc.aio.insecure_channel(url.removeprefix("http://"))
    stub = DanubeApi_pb2_grpc.HealthCheckStub(channel)
    producer_type = DanubeApi_pb2.HealthCheckRequest.Producer
    consumer_type = DanubeApi_pb2.HealthCheckRequest.Consumer
    report["producer_id"], report["consumer_id"] = producer_id, consumer_id
    report["before"] = {
        "producer": await health(stub, producer_type, producer_id),
        "consumer": await health(stub, consumer_type, consumer_id),
    }
    emit("ready", subscribed_at=subscribed_at, **report)

    await commands.expect("deleted", timeout=20.0)
    deleted_at = time.monotonic()
    report["after_delete"] = {
        "producer": await health(stub, producer_type, producer_id),
        "consumer": await health(stub, consumer_type, consumer_id),
    }
    emit("after_delete", **report["after_delete"])

    recreator = client.new_producer().with_topic(topic).with_name("conf-producer-2").build()
    await recreator.create()
    report["recreated_after_s"] = round(time.monotonic() - deleted_at, 3)
    try:
        await producer.send(b"old-producer", None)
        report["old_producer_send"] = "OK"
    except grpc.aio.AioRpcError as error:
        report["old_producer_send"] = f"{error.code().name}: {error.details()}"

    # The client's health loop checks every 5 s; allow two rounds.
    try:
        async with asyncio.timeout(12.0):
            while partition.consumer_id == consumer_id:
                await asyncio.sleep(0.05)
    except TimeoutError:
        report["resubscribed"] = False
        report["receive_task_done"] = [task.done() for task in consumer._tasks]
        return
    report["resubscribed"] = True
    report["new_consumer_id"] = partition.consumer_id
    report["resubscribed_after_s"] = round(time.monotonic() - deleted_at, 3)

    report["probes_sent"] = 0
    first: list[Any] = []
    deadline = time.monotonic() + 5.0
    while not first and time.monotonic() < deadline:
        await recreator.send(b"probe", None)
        report["probes_sent"] += 1
        first = await receive_for(queue, 0.2)
    report["probe_received"] = bool(first)
    if first:
        for i in range(BATCH):
            await recreator.send(f"after-{i}".encode(), None)
        batch = await receive_for(queue, 1.0)
        report["batch_received"] = [m.payload.decode() for m in batch if m.payload != b"probe"]
    report["health_new_consumer"] = await health(stub, consumer_type, partition.consumer_id)
    await channel.close()
    await consumer.close()
    await producer.close()
    await recreator.close()


if __name__ == "__main__":
    main(scenario, timeout=45.0)
