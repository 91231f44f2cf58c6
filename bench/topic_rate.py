"""The broker's CPU per message at the same total rate over 4, 100 or 1,000 topics.

Issue 28 point 3 / issue 23: the 1,000-topic soak asks 300 msg/s and the broker reached 53-56,
its main thread busy. This measures, without the soak, what grows with the topic count: a fresh
broker under `--memory-budget` per topic count, one `danube-cli load` (one Exclusive
subscription a topic, `--topics-per-connection 100`) at `--rate` messages a second in all for
`--seconds`, and the broker's CPU (/proc utime + stime) from the load's first progress line (its
producers and consumers are up) to its exit, over the messages it acknowledged. `--profile`
also records the broker with py-spy during the sending (raw folded stacks).

    PYTHONPATH=src:. python -m bench.topic_rate --topics 4,100,1000 --rate 300 --seconds 60
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from danube.localcluster.broker_process import BrokerProcess

CLI = Path(sys.executable).parent / "danube-cli"
PY_SPY = Path(sys.executable).parent / "py-spy"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def run(topics: int, args: argparse.Namespace) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="danube-rate-"))
    config = work / "broker.yaml"
    config.write_text(
        "broker:\n  grpc:\n    max_concurrent_streams: 8192\n"
        f"metrics:\n  per_topic: {'true' if args.per_topic_metrics else 'false'}\n"
    )
    broker = BrokerProcess(
        work / "data",
        config_file=config,
        extra_args=("--memory-budget", args.budget),
        log_file=work / "broker.log",
    )
    broker.start()
    try:
        load = subprocess.Popen(
            [str(CLI), "load", "-s", broker.url, "--logs", str(work / "logs"),
             "--topic-prefix", f"/default/rate{topics}", "--topics", str(topics),
             "--messages", str(int(args.rate * args.seconds) + topics), "--rate", str(args.rate),
             "--duration", str(args.seconds), "--subscriptions", "exclusive",
             "--topics-per-connection", "100", "--drain", "10"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert load.stderr is not None and load.stdout is not None
        started = cpu0 = 0.0
        spy = None
        load_start = load_average()
        for line in load.stderr:
            if line.startswith("[load") and not started:
                started, cpu0 = time.monotonic() - 1.0, cpu_seconds(broker.pid)
                if args.profile:
                    spy = subprocess.Popen(
                        [str(PY_SPY), "record", "-r", "50", "-f", "raw", "-d",
                         str(min(args.seconds - 5, 30)), "-p", str(broker.pid), "-o",
                         str(args.profile.with_suffix(f".{topics}.txt"))],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
        summary = load.stdout.read()
        load.wait()
        ended, cpu1 = time.monotonic(), cpu_seconds(broker.pid)
        if spy is not None:
            spy.wait()
        match = re.search(r"acknowledged (\d+) messages", summary)
        acked = int(match.group(1)) if match else 0
        sending = min(ended, started + args.seconds) - started if started else 0.0
        result = {
            "topics": topics,
            "acked": acked,
            "rate": acked / sending if sending > 0 else 0.0,
            "cpu_s": cpu1 - cpu0,
            "wall_s": ended - started,
            "cpu_ms_per_msg": 1000 * (cpu1 - cpu0) / acked if acked else float("nan"),
            "busy": (cpu1 - cpu0) / (ended - started) if started else 0.0,
        }
        print(
            f"topics {topics}: {acked} acknowledged, {result['rate']:.1f} msg/s while sending "
            f"(asked {args.rate}), broker CPU {result['cpu_s']:.1f} s over "
            f"{result['wall_s']:.0f} s "
            f"({100 * result['busy']:.0f} % of a core), {result['cpu_ms_per_msg']:.2f} ms a "
            f"message; load average {load_start} -> {load_average()}",
            flush=True,
        )
        if load.returncode:
            print(f"  load exited {load.returncode}: {summary[-500:]}", file=sys.stderr)
        return result
    finally:
        broker.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default="4,100,1000")
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--per-topic-metrics", action="store_true")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output prefix")
    args = parser.parse_args()
    for count in args.topics.split(","):
        run(int(count), args)


if __name__ == "__main__":
    main()
