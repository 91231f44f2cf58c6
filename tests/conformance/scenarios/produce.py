"""Sends COUNT messages `<PREFIX>-<i>` with the official producer, then exits.

Usage: produce.py BROKER_URL TOPIC PRODUCER_NAME PREFIX COUNT

Result: `producer_id` and `sent` (payload texts). The producer name is idempotent on our
broker, so running this twice with the same name reuses the same producer.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_harness import build_client, main, report


async def scenario(argv: list[str]) -> None:
    url, topic, name, prefix, count = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    client = await build_client(url)
    producer = client.new_producer().with_topic(topic).with_name(name).build()
    await producer.create()
    report["producer_id"] = producer._producers[0].producer_id
    report["sent"] = []
    for i in range(count):
        await producer.send(f"{prefix}-{i}".encode(), {"index": str(i)})
        report["sent"].append(f"{prefix}-{i}")
    await producer.close()


if __name__ == "__main__":
    main(scenario, timeout=20.0)
