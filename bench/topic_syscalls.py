"""The kernel calls a new idle reliable topic costs the broker (issue 23, point 3): the same
topics as `bench.topic_scale` (a reliable producer and one 1-byte message each, `--concurrency`
at a time), counted by `strace -f -c` attached to a fresh `danube-broker`.

`python -m bench.topic_syscalls --topics 500` prints, per topic, the fsync-family calls
(fsync, fdatasync) and the other file calls. Unlike topics/s or CPU time, these counts do not
depend on how busy the machine is (group commits share more under load, so the metadata
store's fsyncs per topic can only fall as concurrency grows). Needs `strace` and ptrace
permission on the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.topic_scale import CONFIG, _create
from danube.client import DanubeClient, Producer
from danube.localcluster.broker_process import BrokerProcess

CALLS = "fsync,fdatasync,openat,rename,unlink,mkdir,pwrite64,write,read,futex,epoll_wait"
"""File calls, then the ones a hand-off between threads makes (a wake-up socket written and
read, a futex, an epoll wait): a hop to a worker thread and back shows in the second group."""


def _counts(summary: str) -> dict[str, int]:
    """`strace -c` table rows: calls per syscall name."""
    counts: dict[str, int] = {}
    for line in summary.splitlines():
        fields = line.split()
        if len(fields) >= 5 and re.fullmatch(r"[\d.]+", fields[0]) and fields[-1].isidentifier():
            counts[fields[-1]] = int(fields[3])
    return counts


async def _fill(url: str, topics: int, concurrency: int, offset: int) -> None:
    keep: list[Producer] = []
    async with DanubeClient(url) as client:
        queue = iter(range(offset, offset + topics))

        async def worker() -> None:
            for index in queue:
                await _create(client, index, keep)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        for producer in keep:
            await producer.__aexit__()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100, help="topics created before counting")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="danube-topic-syscalls-") as tmp:
        root = Path(tmp)
        (root / "broker.yaml").write_text(CONFIG)
        broker = BrokerProcess(
            root / "data", config_file=root / "broker.yaml", metrics_port=None
        ).start()
        try:
            asyncio.run(_fill(broker.url, args.warmup, args.concurrency, 0))
            out = root / "strace.txt"
            tracer = subprocess.Popen(
                [
                    "strace",
                    "-f",
                    "-c",
                    "-e",
                    f"trace={CALLS}",
                    "-o",
                    str(out),
                    "-p",
                    str(broker.pid),
                ]
            )
            time.sleep(1.0)  # attached to every thread
            asyncio.run(_fill(broker.url, args.topics, args.concurrency, args.warmup))
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=30)
            counts = _counts(out.read_text())
        finally:
            broker.stop()
    print(f"{args.topics} topics, concurrency {args.concurrency}; calls per topic:")
    for name in CALLS.split(","):
        print(f"  {name:10} {counts.get(name, 0) / args.topics:6.2f}")
    syncs = counts.get("fsync", 0) + counts.get("fdatasync", 0)
    print(f"  fsync + fdatasync: {syncs / args.topics:.2f}")


if __name__ == "__main__":
    main()
