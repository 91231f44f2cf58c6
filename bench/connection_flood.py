"""Idle connections against a broker under a 256 MiB budget (issue 28, the review's
connection finding; spec/memory.md "Connections"): N sockets that complete the HTTP/2
handshake and never make a call, then a producer that creates a topic and publishes. Prints
how many the broker closed, its RSS, the pools' use, the gate's metrics, whether the
producer got through, and the refusal log lines.

    PYTHONPATH=src:. python bench/connection_flood.py 2600

Run with `PYTHONPATH=<other tree>/src:.` to measure another tree's broker (bench/RESULTS.md
compares main before the gate)."""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from danube.client import DanubeClient
from danube.localcluster.broker_process import BrokerProcess
from tests.broker.h2_raw import RawH2


def metric(broker: BrokerProcess, name: str) -> dict[str, float]:
    """Every sample of `name`, by its labels."""
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    pattern = rf"^{name}\{{([^}}]*)\}} (\S+)$"
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


async def flood(count: int) -> None:
    data = Path(tempfile.mkdtemp()) / "data"
    broker = BrokerProcess(data, extra_args=("--memory-budget", "256MiB")).start()
    port = int(broker.broker_addr.rsplit(":", 1)[1])
    try:
        before = rss_mib(broker.pid)
        idle: list[RawH2] = []
        for i in range(count):
            idle.append(await RawH2.open(port))
            if i % 200 == 0:
                await asyncio.gather(*(raw.pump(0.01) for raw in idle[-200:]))
        await asyncio.gather(*(raw.pump(1.0) for raw in idle))
        await asyncio.sleep(0.5)  # a few ticks: the open connections are charged
        closed = sum(raw.closed for raw in idle)
        used = metric(broker, "danube_memory_pool_used_bytes")
        gate = metric(broker, "danube_broker_connections")
        refused = metric(broker, "danube_broker_connections_refused_total")
        started = time.monotonic()
        outcome = "ok"
        try:
            async with DanubeClient(broker.url) as client:
                producer = await client.producer("/default/measure", "p").create()
                await producer.send(b"x")
        except Exception as error:  # the outcome measured: printed, not raised
            outcome = repr(error)[:200]
        print(f"idle opened={count} closed by the broker={closed}")
        print(f"RSS {before:.1f} -> {rss_mib(broker.pid):.1f} MiB")
        print("pools used (MiB):", {k: round(v / 2**20, 2) for k, v in used.items()})
        print("gate:", gate, "refused:", refused)
        print(f"topic creation and a publish after: {outcome} ({time.monotonic() - started:.2f} s)")
        refusals = [line for line in broker.log_lines if "event=connections_refused" in line]
        tracebacks = broker.log_text().count("Traceback")
        print(f"refusal log lines: {len(refusals)}, tracebacks: {tracebacks}")
        for raw in idle:
            raw.close()
    finally:
        broker.kill()


if __name__ == "__main__":
    asyncio.run(flood(int(sys.argv[1]) if len(sys.argv) > 1 else 2600))
