"""Our broker against NATS JetStream and Redis Streams, in one run, on this machine.

    python -m bench.peers_run            # the full workload; appends to bench/RESULTS.md
    python -m bench.peers_run --smoke    # a short run (CI): results in a temporary directory

Installs the peers' Debian packages when missing (`bench.peer_servers.ensure_installed`),
starts every server on free loopback ports, runs the same `Workload` against each, one
after the other, and writes a results section (markdown, with each system's durability next
to its numbers and the issue's targets checked against them), a JSON file and a PNG chart."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.chart import write_chart
from bench.danube_workloads import run_danube
from bench.peer_servers import ensure_installed
from bench.peer_workloads import run_nats, run_redis
from bench.workload import SystemResult, Workload

HERE = Path(__file__).parent
SMOKE = Workload(
    publish_messages=2_000,
    latency_rate=500,
    latency_messages=500,
    consume_messages=2_000,
    idle_topics=50,
)


def _progress(started: float) -> Callable[[str], None]:
    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

    return say


def machine() -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as info:
        memory_gib = int(info.readline().split()[1]) / 1024 / 1024
    return (
        f"{os.cpu_count()} vCPU {cpu}, {memory_gib:.0f} GiB, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=HERE,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _number(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def targets(results: list[SystemResult]) -> list[str]:
    """The issue's targets, each said to be met or missed, from this run's numbers."""
    by_name = {r.system.split()[0]: r for r in results}
    ours = next(r for r in results if r.system.startswith("Danube"))
    nats = by_name.get("NATS")
    everysec = next((r for r in results if "everysec" in r.durability), None)
    lines = []

    def check(ok: bool, text: str) -> None:
        lines.append(f"- {'met' if ok else 'MISSED'}: {text}")

    if nats and ours.publish_per_s and nats.publish_per_s:
        ratio = ours.publish_per_s / nats.publish_per_s
        check(ratio >= 2, f"durable publish at least 2x NATS JetStream's: {ratio:.2f}x")
    if everysec and ours.publish_per_s and everysec.publish_per_s:
        ratio = ours.publish_per_s / everysec.publish_per_s
        check(ratio > 1, f"durable publish above Redis Streams (fsync every second): {ratio:.2f}x")
    if ours.e2e_p50_ms is not None and ours.e2e_p99_ms is not None:
        p50, p99 = ours.e2e_p50_ms, ours.e2e_p99_ms
        check(p50 < 1, f"end-to-end p50 under 1 ms with fsync: {p50:.2f} ms")
        check(p99 < 5, f"end-to-end p99 under 5 ms with fsync: {p99:.2f} ms")
    return lines


def _label(result: SystemResult) -> str:
    words = result.durability.split()
    setting = next((w for w in words if w in ("everysec", "always")), "")
    return f"{result.system.split()[0]} {setting}".strip()


def section(results: list[SystemResult], workload: Workload, command: str, wall_s: float) -> str:
    rows = [
        "| system | durability | publish msg/s | ack p50 / p99 ms | e2e p50 / p99 ms "
        "| achieved msg/s | consume msg/s | RSS idle topics / fresh MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.system} | {r.durability} | {_number(r.publish_per_s)} "
            f"| {_number(r.ack_p50_ms, 2)} / {_number(r.ack_p99_ms, 2)} "
            f"| {_number(r.e2e_p50_ms, 2)} / {_number(r.e2e_p99_ms, 2)} "
            f"| {_number(r.latency_achieved_per_s)} | {_number(r.consume_per_s)} "
            f"| {_number(r.idle_rss_mib)} / {_number(r.base_rss_mib)} |"
        )
    notes = [f"- {_label(r)}: {note}" for r in results for note in r.notes]
    return "\n".join(
        [
            f"## {time.strftime('%Y-%m-%d')} — issue 9, against NATS JetStream and Redis Streams",
            "",
            f"Machine: {machine()}; every server and the one client process on the same "
            f"machine over loopback. Commit {commit()}. Command: `{command}` "
            f"({wall_s:.0f} s wall).",
            "",
            f"Workload: {workload.message_bytes}-byte payloads, one producer process; "
            f"publish throughput over {workload.publish_messages:,} messages; latency at "
            f"{workload.latency_rate:,} msg/s offered (open loop) over "
            f"{workload.latency_messages:,} messages; consume throughput over "
            f"{workload.consume_messages:,} messages published first; memory with "
            f"{workload.idle_topics:,} idle topics.",
            "",
            *rows,
            "",
            "Targets (issue 9):",
            "",
            *targets(results),
            "",
            "Notes:",
            "",
            *notes,
            "",
        ]
    )


async def run_all(workload: Workload, say: Callable[[str], None]) -> list[SystemResult]:
    runs: list[tuple[str, Callable[[], Coroutine[Any, Any, SystemResult]]]] = [
        ("danube", lambda: run_danube(workload, say)),
        ("nats", lambda: run_nats(workload, say)),
        ("redis everysec", lambda: run_redis(workload, "everysec", say)),
        ("redis always", lambda: run_redis(workload, "always", say)),
    ]
    results = []
    for name, run in runs:
        say(f"{name}: starting")
        results.append(await run())
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers_run",
        description="Benchmark our broker against NATS JetStream and Redis Streams on this "
        "machine (installs and starts them) and record the results.",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a short run (CI); writes only into --out"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="directory for results.json, results.md and peers.png (default: bench/, and "
        "the section is appended to bench/RESULTS.md; with --smoke a temporary directory)",
    )
    args = parser.parse_args(argv)
    workload = SMOKE if args.smoke else Workload()
    out = args.out
    if out is None and args.smoke:
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"danube-peers-{os.getpid()}"
    started = time.monotonic()
    say = _progress(started)
    try:
        ensure_installed()
        results = asyncio.run(run_all(workload, say))
    except (RuntimeError, OSError) as error:
        print(f"peers_run: {error}", file=sys.stderr)
        return 1
    command = "python -m bench.peers_run" + (" --smoke" if args.smoke else "")
    text = section(results, workload, command, time.monotonic() - started)
    directory = out or HERE
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(
        json.dumps([asdict(r) for r in results], indent=2) + "\n"
    )
    chart = directory / "peers.png"
    write_chart(
        results,
        chart,
        f"{workload.message_bytes} B messages, one producer process, {os.cpu_count()} vCPU, "
        "loopback",
    )
    if out is None:
        with (HERE / "RESULTS.md").open("a") as results_md:
            results_md.write("\n" + text + f"\n![peer benchmark]({chart.name})\n")
    else:
        (directory / "results.md").write_text(text)
    print(text)
    say(f"wrote {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
