"""What one idle reliable topic holds in a broker, by owner (issue 23 point 3, under 8 KiB a
topic): tracemalloc's allocations and the live objects by type, the difference between two
dumps of a real `danube-broker` (`DANUBE_MEMORY_DUMP`, `DANUBE_MEMORY_TRACE`,
`runtime/memory_dump.py`), taken after a warm-up of `--warm` topics and after `--topics` more,
divided by `--topics`. Each topic is made as `bench/topic_scale.py` makes them: a reliable
producer, one 1-byte message, the producer closed (`--keep` keeps it open instead).

    PYTHONPATH=src:. python -m bench.idle_topic_memory --warm 500 --topics 2000

Prints bytes per topic by source file (the owner), by allocation site, and objects per topic by
type; tracemalloc itself costs memory, so RSS is reported from the same run for scale only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.topic_scale import CONFIG
from bench.workload import rss_mib
from danube.client import DanubeClient, DispatchStrategy, Producer
from danube.localcluster.broker_process import BrokerProcess


async def _topics(client: DanubeClient, span: range, concurrency: int, keep: bool) -> None:
    queue = iter(span)
    kept: list[Producer] = []

    async def worker() -> None:
        for index in queue:
            producer = client.producer(
                f"/default/idle-{index}", "idle", dispatch=DispatchStrategy.RELIABLE,
                batching=None,
            )  # fmt: skip
            await producer.create()
            await producer.send(b"x")
            if keep:
                kept.append(producer)
            else:
                await producer.__aexit__()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _dump(broker: BrokerProcess, where: Path, number: int) -> dict[str, Any]:
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGUSR2)
    path = where / f"dump-{number}.json"
    trace = path.with_suffix(".trace")
    deadline = time.monotonic() + 600
    while not (path.exists() and trace.exists()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path}")
        time.sleep(0.5)
    time.sleep(1)  # the trace file is written after the json's rename
    return json.loads(path.read_text())


def _owner(filename: str) -> str:
    for marker in ("/src/danube/", "/site-packages/", "/lib/python3.11/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="danube-idle-memory-", dir=args.dir))
    (root / "broker.yaml").write_text(CONFIG)
    dumps = root / "dumps"
    env = {"DANUBE_MEMORY_DUMP": str(dumps), "DANUBE_MEMORY_TRACE": str(args.frames)}
    broker = BrokerProcess(
        root / "data", config_file=root / "broker.yaml", metrics_port=None, env=env
    ).start()
    try:
        async with DanubeClient(broker.url) as client:
            await _topics(client, range(args.warm), args.concurrency, args.keep)
            await asyncio.sleep(2)
            before = _dump(broker, dumps, 1)
            await _topics(client, range(args.warm, args.warm + args.topics), args.concurrency,
                          args.keep)  # fmt: skip
            await asyncio.sleep(2)
            after = _dump(broker, dumps, 2)
            rss = rss_mib(broker.pid)  # type: ignore[arg-type]
    finally:
        broker.kill()
    n = args.topics
    old = tracemalloc.Snapshot.load(str(dumps / "dump-1.trace"))
    new = tracemalloc.Snapshot.load(str(dumps / "dump-2.trace"))
    by_file: collections.Counter[str] = collections.Counter()
    for stat in new.compare_to(old, "filename"):
        by_file[_owner(stat.traceback[0].filename)] += stat.size_diff
    by_line = [
        (f"{_owner(s.traceback[0].filename)}:{s.traceback[0].lineno}", s.size_diff, s.count_diff)
        for s in new.compare_to(old, "lineno")[: args.top]
    ]
    types = collections.Counter(after["types"])
    types.subtract(before["types"])
    return {
        "topics": n,
        "rss_delta_per_topic_b": round((after["rss"] - before["rss"]) / n)
        if isinstance(after.get("rss"), (int, float))
        else None,
        "rss_end_mib": round(rss, 1),
        "traced_per_topic_b": round((after["traced_bytes"] - before["traced_bytes"]) / n),
        "allocated_blocks_per_topic": round(
            (after["allocated_blocks"] - before["allocated_blocks"]) / n, 2
        ),
        "by_file_b": {k: round(v / n) for k, v in by_file.most_common(args.top)},
        "by_line_b": [(at, round(size / n), round(count / n, 2)) for at, size, count in by_line],
        "objects_per_topic": {k: round(v / n, 2) for k, v in types.most_common(args.top) if v > 0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=500)
    parser.add_argument("--topics", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--frames", type=int, default=1)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help="keep the producers open")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
