"""A new user's first minutes, timed (issue 26): a broker's start on a fresh checkout (the
numba kernels compile, or load from numba's cache, before it reports ready), the first
`danube-cli produce` after ready, and `--help` of every tool.

    git clone -q <repo> /tmp/fresh && cd /tmp/fresh
    PYTHONPATH=/tmp/fresh/src:/tmp/fresh /work/main/.venv/bin/python -m bench.first_start

Runs the tools of the interpreter's environment (`<venv>/bin/danube-*`) with this PYTHONPATH,
so a clone's sources are what runs. `--check` exits 1 when the first produce takes 1 s or more
or a `--help` takes 0.3 s or more (the issue's bounds); the timed check lives here, not in the
test suite, since a loaded CI machine would make it flaky there."""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TOOLS = ("danube-cli", "danube-admin", "danube-broker", "danube-local-cluster")
READY = re.compile(r"event=broker_ready .*broker_addr=(\S+)")
WARMED = re.compile(r"event=kernels_ready seconds=(\S+) cache_dir=(\S+)")
FIRST_PRODUCE_BOUND_S = 1.0
HELP_BOUND_S = 0.3


def start_broker(data_dir: Path) -> tuple[subprocess.Popen[str], str, float, str]:
    """The broker process, its address, the seconds from exec to `broker_ready`, and its
    kernels_ready line's fields."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [
            str(BIN / "danube-broker"), "--data-dir", str(data_dir),
            "--broker-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
            "--prom-exporter", "off",
        ],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    warmed = ""
    for line in process.stderr:
        if found := WARMED.search(line):
            warmed = f"kernels {found.group(1)} s, cache {found.group(2)}"
        if found := READY.search(line):
            return process, found.group(1), time.perf_counter() - started, warmed
    raise RuntimeError("the broker exited before it was ready")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def timed(command: list[str]) -> float:
    return timed_cpu(command)[0]


def timed_cpu(command: list[str]) -> tuple[float, float]:
    """Wall seconds and the child's CPU seconds (user + system): on a machine shared with
    other work the CPU time is what the tool itself costs, the wall time what a user waits."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="--help runs per tool (median)")
    parser.add_argument("--check", action="store_true", help="exit 1 when over the bounds")
    args = parser.parse_args()
    over = []
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as scratch:
        for attempt in ("first start", "second start"):
            process, addr, ready_s, warmed = start_broker(Path(scratch) / attempt.replace(" ", "-"))
            try:
                produce_s, produce_cpu = timed_cpu(
                    [str(BIN / "danube-cli"), "produce", "-s", f"http://{addr}",
                     "-t", f"/default/first-{attempt[0]}", "-m", "hello"]
                )  # fmt: skip
            finally:
                stop(process)
            print(f"{attempt}: exec to broker_ready {ready_s:.2f} s ({warmed}); "
                  f"first danube-cli produce {produce_s:.2f} s wall, "
                  f"{produce_cpu:.2f} s CPU")  # fmt: skip
            if produce_s >= FIRST_PRODUCE_BOUND_S:
                over.append(f"{attempt} produce {produce_s:.2f} s")
    for tool in TOOLS:
        measured = [timed_cpu([str(BIN / tool), "--help"]) for _ in range(args.runs)]
        runs = [wall for wall, _ in measured]
        median = statistics.median(runs)
        cpu = statistics.median(cpu for _, cpu in measured)
        print(f"{tool} --help: wall median {median:.3f} s, min {min(runs):.3f} s; "
              f"CPU median {cpu:.3f} s (of {args.runs})")  # fmt: skip
        if median >= HELP_BOUND_S:
            over.append(f"{tool} --help {median:.3f} s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if over:
        print("over the bounds: " + "; ".join(over))
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
