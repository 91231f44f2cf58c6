"""An official producer the broker removed for idleness (spec/memory.md, "Departed
clients") recovers on its own: its next send is told UNAVAILABLE, which the client retries,
then looks the topic up and creates the producer again (danube-client 0.5.0,
`Producer.send`'s `_lookup_and_recreate`).

Usage: idle_producer.py BROKER_URL TOPIC IDLE_S

Creates a producer, sends one message, stays silent for IDLE_S (the broker's timeout and its
sweep, and less than the client's 5 s health interval would need), then sends again.
Result: the producer ids before and after, the health check of the old id, how long the
second send took.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from official_harness import build_client, main, report

from danube.proto import DanubeApi_pb2, DanubeApi_pb2_grpc


async def scenario(argv: list[str]) -> None:
    url, topic, idle_s = argv[0], argv[1], float(argv[2])
    client = await build_client(url)
    producer = client.new_producer().with_topic(topic).with_name("conf-idle").build()
    await producer.create()
    await producer.send(b"before", None)
    old_id = producer._producers[0].producer_id
    report["old_id"] = old_id
    await asyncio.sleep(idle_s)
    channel = grpc.aio.insecure_channel(url.removeprefix("http://"))
    stub = DanubeApi_pb2_grpc.HealthCheckStub(channel)
    request = DanubeApi_pb2.HealthCheckRequest(
        request_id=1, client=DanubeApi_pb2.HealthCheckRequest.Producer, id=old_id
    )
    response = await stub.HealthCheck(request, timeout=5.0)
    report["old_health"] = DanubeApi_pb2.HealthCheckResponse.ClientStatus.Name(response.status)
    started = time.monotonic()
    try:
        await producer.send(b"after", None)
        report["send_after_idle"] = "OK"
    except grpc.aio.AioRpcError as error:
        report["send_after_idle"] = f"{error.code().name}: {error.details()}"
    report["send_s"] = round(time.monotonic() - started, 2)
    report["new_id"] = producer._producers[0].producer_id


if __name__ == "__main__":
    main(scenario, timeout=40.0)
