"""The official client against a secured broker: TLS with a CA file and, when given, a
bearer token (`with_token`, which the official client sends on every call).

Usage: secured.py BROKER_URL CA_FILE TOKEN|- TOPIC

Result: `outcome` "ok" after a producer sent one message and a consumer received it, else
the gRPC status name the broker refused with (`status`) and its message (`details`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from official_harness import main, receive_n, report

from danube import DanubeClientBuilder


async def scenario(argv: list[str]) -> None:
    url, ca_file, token, topic = argv
    builder = DanubeClientBuilder().service_url(url).with_tls(ca_file)
    if token != "-":
        builder = builder.with_token(token)
    client = await builder.build()
    try:
        producer = client.new_producer().with_topic(topic).with_name("secured").build()
        await producer.create()
        consumer = (
            client.new_consumer().with_topic(topic).with_consumer_name("c")
            .with_subscription("s").build()
        )  # fmt: skip
        await consumer.subscribe()
        queue = await consumer.receive()
        await producer.send(b"over tls", {})
        (message,) = await receive_n(queue, 1, 10.0, "secured receive")
        await consumer.ack(message)
        report["outcome"] = "ok"
        report["payload"] = message.payload.decode()
    except grpc.aio.AioRpcError as error:
        report["outcome"] = "refused"
        report["status"] = error.code().name
        report["details"] = error.details()


if __name__ == "__main__":
    main(scenario, timeout=30.0)
