"""The memory soak (issue 28, point 3; spec/memory.md): a standalone broker under a
`--memory-budget`, many active reliable topics with producers and consumers for minutes,
a slow consumer on one topic, the broker's RSS and accounted pools sampled every few
seconds from start to after the load, and a chart of them.

    PYTHONPATH=src:. python -m bench.memory_soak --budget 256MiB --topics 1000 \\
        --minutes 10 --rate 300 --after 60 --chart bench/results/memory_soak.png

Phases: `fresh` (the broker alone), `setup` (a short `danube-cli load` over the same topics
creates them, their producers' topics and their subscriptions), `idle` (the pre-load level:
every topic exists, nothing flows), `load` (`danube-cli load`, `--rate` messages a second in
all for `--minutes`, every message delivered and acknowledged; meanwhile one more
subscription on the first topic acknowledges one message a second: a slow consumer), then
`after` (the load is over, the slow consumer gone). Prints the levels, whether RSS stayed
under the budget and came back within 10 % of the idle level, and writes the samples as CSV
and the chart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from danube.cli.admin_brokers import memory_of
from danube.client import DanubeClient
from danube.client.consumer import SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.values.sizes import parse_size

CLI = Path(sys.executable).parent / "danube-cli"
PREFIX = "/default/soak"
HEAD = ("t_s", "phase", "rss_mib", "accounted_mib", "cache_mib", "publish_mib", "consumer_mib",
        "state_mib", "paused_s", "refused")  # fmt: skip


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

    def mib(pool: str) -> float:
        return round(pools.get(f"danube_memory_pool_used_bytes:{pool}", 0) / 2**20, 1)

    accounted = sum(v for k, v in pools.items() if k.startswith("danube_memory_pool_used_bytes"))
    return (
        round(time.monotonic() - started, 1), phase, round(_rss_mib(broker.pid), 1),
        round(accounted / 2**20, 1), mib("cache"), mib("publish"), mib("consumer"), mib("state"),
        pools.get("danube_memory_publish_paused_seconds_total", 0),
        pools.get("danube_memory_publish_refused_total", 0),
    )  # fmt: skip


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="danube-soak-"))
        config = self.work / "broker.yaml"
        # `danube-cli load` holds every consumer on one connection: a receive stream each,
        # more than the default cap of 500 concurrent streams (spec/hardening.md).
        config.write_text("broker:\n  grpc:\n    max_concurrent_streams: 8192\n")
        self.broker = BrokerProcess(
            self.work / "data",
            config_file=config,
            extra_args=("--memory-budget", args.budget),
            log_file=self.work / "broker.log",
        )
        self.samples: list[tuple[object, ...]] = []
        self.phase = "fresh"
        self.started = time.monotonic()
        self.slow_acked = 0

    async def sampler(self) -> None:
        while True:
            try:
                self.samples.append(
                    await asyncio.to_thread(_sample, self.broker, self.started, self.phase)
                )
            except Exception as error:  # one scrape that failed: the next one counts
                print(f"sample failed: {error!r}", file=sys.stderr)
                continue
            if self.args.csv:  # written as it goes: a run cut short keeps its samples
                with self.args.csv.open("a") as out:
                    out.write(",".join(str(v) for v in self.samples[-1]) + "\n")
            await asyncio.sleep(self.args.sample)

    async def load(self, messages: int, rate: float, drain: int, deadline: float) -> int:
        load = await asyncio.create_subprocess_exec(
            str(CLI), "load", "-s", self.broker.url, "--logs", str(self.work / "logs"),
            "--topic-prefix", PREFIX, "--topics", str(self.args.topics),
            "--messages", str(messages), "--rate", str(rate),
            "--payload-bytes", str(self.args.payload_bytes), "--subscriptions", "exclusive",
            "--drain", str(drain),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            _, stderr = await asyncio.wait_for(load.communicate(), deadline)
        except TimeoutError:  # the machine could not keep the rate: the load ends here
            load.kill()
            _, stderr = await load.communicate()
            print(f"load stopped after {deadline:.0f} s", file=sys.stderr)
        if load.returncode:
            print(f"load exited {load.returncode}: {stderr.decode()[-2000:]}", file=sys.stderr)
        return load.returncode or 0

    async def slow_consumer(self) -> None:
        """One more subscription on the first topic, acknowledging a message a second."""
        async with DanubeClient(self.broker.url) as client:
            while True:  # the load creates the topic: until then the subscription is refused
                consumer = client.consumer(
                    f"{PREFIX}-0", "slow", "slow", sub_type=SubType.EXCLUSIVE, start="earliest"
                )
                try:
                    await consumer.subscribe()
                    break
                except Exception:
                    await asyncio.sleep(1)
            while True:
                message = await consumer.receive()
                await asyncio.sleep(1.0)
                await consumer.ack(message)
                self.slow_acked += 1

    async def run(self) -> int:
        args = self.args
        self.broker.start()
        sampler = asyncio.ensure_future(self.sampler())
        try:
            await asyncio.sleep(args.idle)
            if args.setup:
                self.phase = "setup"
                await self.load(args.topics * 2, 1_000, 5, 600)
                self.phase = "idle"
                await asyncio.sleep(args.idle)
            self.phase = "load"
            slow = asyncio.ensure_future(self.slow_consumer())
            seconds = args.minutes * 60
            code = await self.load(int(args.rate * seconds), args.rate, 30, seconds)
            slow.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await slow
            self.phase = "after"
            await asyncio.sleep(args.after)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampler
            self.broker.kill()
        return code


def _level(samples: list[tuple[object, ...]], phase: str, last: int = 3) -> float:
    rows = [float(row[2]) for row in samples if row[1] == phase][-last:]  # type: ignore[arg-type]
    return sum(rows) / len(rows)


def _chart(samples: list[tuple[object, ...]], budget_mib: float, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    t = [float(row[0]) for row in samples]  # type: ignore[arg-type]
    axes.plot(t, [row[2] for row in samples], label="broker RSS")
    axes.plot(t, [row[3] for row in samples], label="accounted (all pools)")
    axes.plot(t, [row[4] for row in samples], label="cache pool used", linewidth=0.8)
    axes.plot(t, [row[7] for row in samples],
              label="state (topics, subscriptions, consumers, streams)", linewidth=0.8)  # fmt: skip
    axes.axhline(budget_mib, color="red", linestyle="--", label="--memory-budget")
    for phase in ("setup", "idle", "load", "after"):
        starts = [float(row[0]) for row in samples if row[1] == phase]  # type: ignore[arg-type]
        if starts:
            axes.axvline(starts[0], color="grey", linewidth=0.5)
            axes.text(starts[0], budget_mib * 1.02, phase, fontsize=8)
    axes.set_xlabel("seconds")
    axes.set_ylabel("MiB")
    axes.set_title("memory soak: broker RSS and accounted pools")
    axes.legend(loc="center right", fontsize=8)
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--topics", type=int, default=1_000)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=300)
    parser.add_argument("--payload-bytes", type=int, default=128)
    parser.add_argument("--sample", type=float, default=5, help="seconds between samples")
    parser.add_argument("--idle", type=float, default=30, help="seconds idle before the load")
    parser.add_argument(
        "--setup", action="store_true", help="create the topics with a short load first"
    )
    parser.add_argument("--after", type=float, default=60, help="seconds sampled after the load")
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--chart", type=Path)
    args = parser.parse_args()
    if args.csv:
        args.csv.write_text(",".join(HEAD) + "\n")
    soak = Soak(args)
    code = asyncio.run(soak.run())
    samples = soak.samples
    budget = parse_size(args.budget, "--budget") / 2**20
    if args.chart:
        _chart(samples, budget, args.chart)
    rss = [float(row[2]) for row in samples]  # type: ignore[arg-type]
    loaded = [float(row[2]) for row in samples if row[1] == "load"]  # type: ignore[arg-type]
    idle, end = _level(samples, "idle" if args.setup else "fresh"), _level(samples, "after")
    print(f"budget {args.budget}, {args.topics} topics, {args.rate}/s for {args.minutes} min")
    change = 100 * (end - idle) / idle
    print(f"RSS MiB: fresh {rss[0]}, pre-load {idle:.1f}, peak under load "
          f"{max(loaded):.1f}, after {end:.1f} ({change:+.1f} % of pre-load)")  # fmt: skip
    print(f"peak RSS {max(rss):.1f} MiB {'under' if max(rss) <= budget else 'OVER'} the budget")
    print(f"accounted MiB: peak {max(float(r[3]) for r in samples):.1f}")  # type: ignore[arg-type]
    print(f"publishes paused {samples[-1][8]} s, refused {samples[-1][9]}")
    print(f"slow consumer acknowledged {soak.slow_acked}; load exit {code}")
    print(f"broker log {soak.work / 'broker.log'}")


if __name__ == "__main__":
    main()
