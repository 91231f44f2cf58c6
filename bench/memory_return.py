"""How much RSS giving memory back returns (issue 28 point 3; spec/memory.md, "Giving memory
back"): a standalone broker under `--memory-budget`, `--streams` receive and batch streams
opened on one connection and closed again (as a load's 3,000 streams close at its end), and
the broker's RSS before, with the streams, after they closed, and after the broker gave memory
back (its `event=memory_returned` line: `gc.collect()` and glibc's `malloc_trim(0)`, decided
by the pure `MemoryReturn` once the state pool's charge for the streams fell).

    PYTHONPATH=src:. python -m bench.memory_return --streams 3000 --budget 256MiB
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import tempfile
import urllib.request
from pathlib import Path

from bench.stream_memory import BATCHES, RECEIVE, _channel, _open_streams
from bench.workload import rss_mib
from danube.cli.admin_brokers import memory_of
from danube.localcluster.broker_process import BrokerProcess


def _state_mib(broker: BrokerProcess) -> float:
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=30) as answer:
        pools = memory_of(answer.read().decode())
    return round(pools.get("danube_memory_pool_used_bytes:state", 0) / 2**20, 1)


async def _settled(pid: int, seconds: float = 1.5) -> float:
    await asyncio.sleep(seconds)  # the loop runs meanwhile: a close reaches the socket
    return rss_mib(pid)


async def run(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="danube-return-"))
    config = work / "broker.yaml"
    config.write_text("broker:\n  grpc:\n    max_concurrent_streams: 16384\n")
    log = work / "broker.log"
    broker = BrokerProcess(
        work / "data", config_file=config, log_file=log,
        extra_args=("--memory-budget", args.budget),
    )  # fmt: skip
    broker.start()
    out: dict[str, object] = {}
    try:
        out["fresh_mib"] = await _settled(broker.pid)
        channel = _channel(broker)
        async with contextlib.AsyncExitStack() as stack:
            await _open_streams(channel, BATCHES, args.streams // 2, stack)
            await _open_streams(channel, RECEIVE, args.streams - args.streams // 2, stack)
            out["with_streams_mib"] = await _settled(broker.pid)
            out["state_with_streams_mib"] = _state_mib(broker)
            channel.close()
            stack.pop_all()
        out["closed_mib"] = await _settled(broker.pid, args.wait)
        out["state_closed_mib"] = _state_mib(broker)
        returns = re.findall(
            r"event=memory_returned accounted_fell=(\d+) collected=(\d+) rss_before=(\d+) "
            r"rss_after=(\d+) ms=([\d.]+)",
            log.read_text(errors="replace"),
        )
        out["returns"] = [
            {
                "accounted_fell_mib": round(int(fell) / 2**20, 1),
                "collected": int(collected),
                "rss_before_mib": round(int(before) / 2**20, 1),
                "rss_after_mib": round(int(after) / 2**20, 1),
                "ms": float(ms),
            }
            for fell, collected, before, after, ms in returns
        ]
    finally:
        broker.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=3_000)
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--wait", type=float, default=10, help="seconds after the close")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
