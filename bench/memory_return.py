"""How much RSS giving memory back returns (issue 28 point 3; spec/memory.md, "Giving memory
back"): a standalone broker under `--memory-budget`, `--streams` receive and batch streams
opened on one connection and closed again (as a load's 3,000 streams close at its end), and
the broker's RSS before, with the streams, after they closed, and after the broker gave memory
back (its `event=memory_returned` line: `gc.collect()` and glibc's `malloc_trim(0)`, decided
by the pure `MemoryReturn` once the state pool's charge for the streams fell).

    PYTHONPATH=src:. python -m bench.memory_return --streams 3000 --budget 256MiB

`--dump` also has the broker write its memory dump (`danube.runtime.memory_dump`: live objects
by type, pymalloc's arenas, glibc's heap) at each phase, and prints them side by side: a leak
is objects still alive after the close, fragmentation the objects gone and the RSS not.
`--trace N` adds tracemalloc's allocation sites (N frames each).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from bench.stream_memory import BATCHES, RECEIVE, _channel, _open_streams
from bench.workload import rss_mib
from danube.cli.admin_brokers import memory_of
from danube.localcluster.broker_process import BrokerProcess
from danube.runtime.memory_dump import DUMP_ENV, REFERRERS_ENV, TRACE_ENV


def _state_mib(broker: BrokerProcess) -> float:
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=30) as answer:
        pools = memory_of(answer.read().decode())
    return round(pools.get("danube_memory_pool_used_bytes:state", 0) / 2**20, 1)


async def _settled(pid: int, seconds: float = 1.5) -> float:
    await asyncio.sleep(seconds)  # the loop runs meanwhile: a close reaches the socket
    return rss_mib(pid)


async def _dump(broker: BrokerProcess, where: Path, count: int) -> dict[str, Any]:
    """Has the broker write its memory dump number `count` and reads it."""
    os.kill(broker.pid, signal.SIGUSR2)
    path = where / f"dump-{count}.json"
    for _ in range(600):
        if path.exists():
            return dict(json.loads(path.read_text()))
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the broker wrote no {path}")


def _summary(dump: dict[str, Any]) -> dict[str, Any]:
    heap = dump["mallinfo2"] or {}
    small = dump["pymalloc"]
    out = {
        "rss_mib": round(dump["rss"] / 2**20, 1),
        "gc_objects": dump["gc_objects"],
        "allocated_blocks": dump["allocated_blocks"],
        "pymalloc_arenas": small.get("arenas allocated current"),
        "pymalloc_used_mib": round(small.get("bytes in allocated blocks", 0) / 2**20, 1),
        "pymalloc_arenas_mib": round(small.get("arenas bytes", 0) / 2**20, 1),
        "pymalloc_unused_pools_mib": round(small.get("unused pools bytes", 0) / 2**20, 1),
        "heap_mib": round(heap.get("arena", 0) / 2**20, 1),
        "heap_used_mib": round(heap.get("uordblks", 0) / 2**20, 1),
        "heap_free_mib": round(heap.get("fordblks", 0) / 2**20, 1),
        "heap_top_free_mib": round(heap.get("keepcost", 0) / 2**20, 1),
        "mmapped_mib": round(heap.get("hblkhd", 0) / 2**20, 1),
    }  # fmt: skip
    if "traced_bytes" in dump:
        out["traced_mib"] = round(dump["traced_bytes"] / 2**20, 1)
    return out


def _grown(before: dict[str, Any], after: dict[str, Any], key: str, top: int = 15) -> list[str]:
    """The `key` entries (types, or traced sites) that grew most from `before` to `after`."""
    if key == "types":
        old, new = before["types"], after["types"]
        grew = {name: count - old.get(name, 0) for name, count in new.items()}
        ranked = sorted(grew.items(), key=lambda kv: -kv[1])[:top]
        return [f"{count:+d} {name}" for name, count in ranked if count]
    old_sites = {s["where"]: s["bytes"] for s in before.get("traced_top", [])}
    ranked_sites = sorted(
        ((s["bytes"] - old_sites.get(s["where"], 0), s["where"]) for s in after.get(key, [])),
        reverse=True,
    )[:top]
    return [f"{grew / 1024:+.0f} KiB {where}" for grew, where in ranked_sites if grew]


async def run(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="danube-return-"))
    config = work / "broker.yaml"
    config.write_text("broker:\n  grpc:\n    max_concurrent_streams: 16384\n")
    log = work / "broker.log"
    env = {DUMP_ENV: str(work / "dumps")} if args.dump or args.trace or args.referrers else {}
    if args.trace:
        env[TRACE_ENV] = str(args.trace)
    if args.referrers:
        env[REFERRERS_ENV] = args.referrers
    broker = BrokerProcess(
        work / "data", config_file=config, log_file=log, env=env,
        extra_args=("--memory-budget", args.budget),
    )  # fmt: skip
    broker.start()
    out: dict[str, object] = {}
    dumps: list[dict[str, Any]] = []

    async def dump() -> None:
        if env:
            dumps.append(await _dump(broker, work / "dumps", len(dumps) + 1))

    try:
        out["fresh_mib"] = await _settled(broker.pid)
        await dump()
        channel = _channel(broker)
        async with contextlib.AsyncExitStack() as stack:
            await _open_streams(channel, BATCHES, args.streams // 2, stack)
            await _open_streams(channel, RECEIVE, args.streams - args.streams // 2, stack)
            out["with_streams_mib"] = await _settled(broker.pid)
            out["state_with_streams_mib"] = _state_mib(broker)
            await dump()
            channel.close()
            stack.pop_all()
        out["closed_mib"] = await _settled(broker.pid, args.wait)
        out["state_closed_mib"] = _state_mib(broker)
        await dump()
        if dumps:
            out["dumps"] = dict(zip(("fresh", "with_streams", "closed"),
                                    map(_summary, dumps), strict=False))  # fmt: skip
            out["types_grown_with_streams"] = _grown(dumps[0], dumps[1], "types")
            out["types_left_after_close"] = _grown(dumps[0], dumps[2], "types")
            if args.referrers:
                out["referrers_after_close"] = dumps[2].get("referrers")
            if args.trace:
                out["sites_left_after_close"] = _grown(dumps[0], dumps[2], "traced_top")
        returns = re.findall(
            r"event=memory_returned accounted_fell=(\d+) collected=(\d+) rss_before=(\d+) "
            r"rss_after=(\d+) ms=([\d.]+)(?: gc_ms=([\d.]+) trim_ms=([\d.]+) stall_ms=([\d.]+))?",
            log.read_text(errors="replace"),
        )
        out["returns"] = [
            {
                "accounted_fell_mib": round(int(fell) / 2**20, 1),
                "collected": int(collected),
                "rss_before_mib": round(int(before) / 2**20, 1),
                "rss_after_mib": round(int(after) / 2**20, 1),
                "ms": float(ms),
                "gc_ms": float(gc_ms or "nan"),
                "trim_ms": float(trim_ms or "nan"),
                "stall_ms": float(stall_ms or "nan"),
            }
            for fell, collected, before, after, ms, gc_ms, trim_ms, stall_ms in returns
        ]
    finally:
        broker.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=3_000)
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--wait", type=float, default=10, help="seconds after the close")
    parser.add_argument("--dump", action="store_true", help="the broker's memory dump per phase")
    parser.add_argument(
        "--referrers", default="", help="module.qualname,...: what holds them after the close"
    )
    parser.add_argument("--trace", type=int, default=0, help="tracemalloc frames (0: off)")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
