"""The publish hot path of one broker, in process: core, interpreter and production port on
a real WAL directory with fsync before acknowledgement, without gRPC or a client.

Issue 23, point 1. `bench.e2e_reliable` measures what a user sees, but on a shared 2-core
machine its latencies follow the other processes' load, and its CPU per message mixes the
gRPC stack in. This isolates what the runtime's plumbing costs per group commit: the hand-off
of the WAL write from the asyncio loop to a thread and back, and what runs around it.

- `--in-flight 1`: one publish at a time, so every publish is its own group commit: wall
  time per publish (p50/p99: the disk's fdatasync plus the plumbing) and this process's CPU
  time per publish (all threads: `time.process_time`);
- `--in-flight N`: N publishes at once, again and again: CPU per message and per group
  commit (`acknowledged` events counted).

With the WAL writer threads (issue 23) it also prints the three legs of the file effects
outside the loop (`wal_writer.Timings`, the newest 4,096): hand-off to the thread, the I/O,
the way back to the loop.

It uses only `BrokerRuntime`, `BrokerCore` and the port, so the same file runs against an
older tree (`PYTHONPATH=<tree>/src:<tree>`) for a before/after comparison.

    PYTHONPATH=src:. .venv/bin/python -m bench.hot_path --publishes 3000 --in-flight 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
import trio_asyncio

from danube.machines.wal.machine import WalConfig
from danube.metadata import MemoryStore
from danube.runtime.broker import BrokerRuntime
from danube.runtime.metrics import BrokerMetrics
from danube.testing import make_core
from danube.values.config import DispatchStrategy

try:
    from danube.runtime.event_loop import open_loop
except ImportError:  # a tree from before issue 23's batched loop
    open_loop = trio_asyncio.open_loop

TOPIC = "/default/hot"
PAYLOAD = b"x" * 1024


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _measure(runtime: BrokerRuntime, publishes: int, in_flight: int) -> dict[str, Any]:
    core = runtime.core
    created = core.create_producer(TOPIC, "p", access_mode=0, strategy=DispatchStrategy.RELIABLE)
    await runtime.run(created)
    producer = created.value
    commits = [0]
    event = runtime.port.event

    def counted(name: str, **fields: Any) -> None:
        if name == "acknowledged":
            commits[0] += 1
        event(name, **fields)

    runtime.port.event = counted  # type: ignore[method-assign]

    async def one() -> float:
        started = time.perf_counter()
        step = core.publish(
            producer, TOPIC, PAYLOAD, len(PAYLOAD), None, encode=lambda _o: PAYLOAD, now_ms=1
        )
        await runtime.publish(TOPIC, step)
        return time.perf_counter() - started

    for _ in range(50):  # warm up: the segment exists, the threads run
        await one()
    commits[0] = 0
    latencies: list[float] = []
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(publishes // in_flight):
        latencies.extend(await asyncio.gather(*(one() for _ in range(in_flight))))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done = len(latencies)
    writers = getattr(runtime.port, "wal_writers", None)
    legs = writers.timings.summary() if hasattr(writers, "timings") else {}
    return legs | {
        "publishes": done,
        "in_flight": in_flight,
        "group_commits": commits[0],
        "publish_p50_ms": round(1000 * statistics.median(latencies), 3),
        "publish_p99_ms": round(1000 * _percentile(latencies, 0.99), 3),
        "publishes_per_s": round(done / wall),
        "cpu_ms_per_publish": round(1000 * cpu / done, 4),
        "cpu_ms_per_group_commit": round(1000 * cpu / max(commits[0], 1), 4),
    }


async def _run(root: Path, publishes: int, in_flight: int, plain: bool) -> None:
    core = make_core(wal_config=WalConfig(synced_writes=True))  # as the broker runs fsync
    metrics = BrokerMetrics(core, "b1", "standalone")
    opened = trio_asyncio.open_loop() if plain else open_loop()
    async with opened as loop, trio.open_nursery() as nursery:
        runtime = BrokerRuntime(core, MemoryStore(), root, nursery, loop, metrics=metrics)
        await trio_asyncio.aio_as_trio(runtime.run)(core.bootstrap(["default"]))
        result = await trio_asyncio.aio_as_trio(_measure)(runtime, publishes, in_flight)
        result["loop"] = (
            "trio-asyncio" if plain or open_loop is trio_asyncio.open_loop else "batched"
        )
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(result), flush=True)
        await runtime.quiesce(5.0)
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument(
        "--plain-loop", action="store_true", help="trio-asyncio's loop as it comes (unbatched)"
    )
    parser.add_argument(
        "--switch-interval", type=float, default=None, help="sys.setswitchinterval (seconds)"
    )
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    with tempfile.TemporaryDirectory(prefix="danube-hot-path-") as root:
        trio.run(_run, Path(root), args.publishes, args.in_flight, args.plain_loop)


if __name__ == "__main__":
    main()
