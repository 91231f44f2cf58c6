"""A shortened memory soak (issue 28, point 3; spec/memory.md): a standalone broker under a
`--memory-budget`, `danube-cli load` over many reliable topics, the broker's RSS and its
accounted pools sampled every second during the load and for a while after it.

    PYTHONPATH=src:. python -m bench.memory_soak --budget 64MiB --topics 100 \\
        --messages 15000 --rate 250 --after 30

Prints the RSS at the start, its peak and where it ends, the accounted pools' peak, and a
CSV of the samples (--csv) for a chart. Not the issue's soak (1,000 topics, 256 MiB, ten
minutes, a slow consumer): a shortened try of it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from danube.cli.admin_brokers import memory_of
from danube.localcluster.broker_process import BrokerProcess

CLI = Path(sys.executable).parent / "danube-cli"


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _pools(broker: BrokerProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=5) as answer:
        return memory_of(answer.read().decode())


def _sample(broker: BrokerProcess, started: float, phase: str) -> tuple[object, ...]:
    pools = _pools(broker)
    accounted = sum(v for k, v in pools.items() if k.startswith("danube_memory_pool_used_bytes"))
    return (
        round(time.monotonic() - started, 1),
        phase,
        round(_rss_mib(broker.pid), 1),
        round(accounted / 2**20, 1),
        round(pools.get("danube_memory_pool_used_bytes:cache", 0) / 2**20, 1),
        round(pools.get("danube_memory_pool_used_bytes:publish", 0) / 2**20, 1),
        pools.get("danube_memory_publish_paused_seconds_total", 0),
        pools.get("danube_memory_publish_refused_total", 0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="64MiB")
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--messages", type=int, default=15_000)
    parser.add_argument("--rate", type=float, default=250)
    parser.add_argument("--payload-bytes", type=int, default=128)
    parser.add_argument("--after", type=float, default=30, help="seconds sampled after the load")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="danube-soak-"))
    broker = BrokerProcess(work / "data", extra_args=("--memory-budget", args.budget)).start()
    samples = []
    started = time.monotonic()
    try:
        time.sleep(2)
        samples.append(_sample(broker, started, "idle"))
        load = subprocess.Popen(
            [
                str(CLI), "load", "-s", broker.url, "--logs", str(work / "logs"),
                "--topics", str(args.topics), "--messages", str(args.messages),
                "--rate", str(args.rate), "--payload-bytes", str(args.payload_bytes),
                "--subscriptions", "exclusive", "--drain", "10",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        while load.poll() is None:
            time.sleep(1)
            samples.append(_sample(broker, started, "load"))
        stderr = load.stderr.read() if load.stderr else ""
        if load.returncode:
            print(f"load exited {load.returncode}: {stderr[-2000:]}", file=sys.stderr)
        end = time.monotonic() + args.after
        while time.monotonic() < end:
            time.sleep(1)
            samples.append(_sample(broker, started, "after"))
    finally:
        broker.kill()
    head = ("t_s", "phase", "rss_mib", "accounted_mib", "cache_mib", "publish_mib",
            "paused_s", "refused")  # fmt: skip
    if args.csv:
        args.csv.write_text(
            "\n".join(",".join(str(v) for v in row) for row in [head, *samples]) + "\n"
        )
    rss = [row[2] for row in samples]
    accounted = [row[3] for row in samples]
    print(f"budget {args.budget}, {args.topics} topics, {args.messages} messages at {args.rate}/s")
    print(f"RSS MiB: start {rss[0]}, peak {max(rss)}, end {rss[-1]}")  # type: ignore[type-var]
    print(f"accounted MiB: peak {max(accounted)}, end {accounted[-1]}")  # type: ignore[type-var]
    print(f"publishes paused {samples[-1][6]} s, refused {samples[-1][7]}")
    print(f"load exit {load.returncode}")


if __name__ == "__main__":
    main()
