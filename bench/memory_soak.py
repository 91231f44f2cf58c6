"""The memory soak (issue 28, point 3; spec/memory.md): a standalone broker under a
`--memory-budget`, many active reliable topics with producers and consumers for minutes,
a hot topic with a slow consumer, the broker's RSS and accounted pools sampled every few
seconds from start to after the load, and a chart of them.

    PYTHONPATH=src:. python -m bench.memory_soak --budget 256MiB --topics 1000 \\
        --minutes 10 --rate 300 --hot-rate 50 --after 120 --chart bench/results/memory_soak.png

Phases: `fresh` (the broker alone), `setup` (short `danube-cli load`s over the same topics,
the hot one included, create them and the very subscriptions the load will use, named with
`--subscription-prefix soak`, and the slow consumer's subscription is made; `--no-setup`
skips it), `idle` (the pre-load level: every topic and every subscription the load uses
exists, nothing flows, and the broker gave back what the set-up's closed streams freed
(`--settle`): the honest starting point of the load, against which "memory back
after the load" is judged by default; before the subscriptions were named, the load's own
1,000 subscriptions were made by the load and outlived it, 13.7 MiB accounted that the
pre-load level did not hold: bench/RESULTS.md, issue 28 part 6), `load` (`danube-cli load`, `--rate`
messages a second in all for `--minutes`, every message delivered and acknowledged, then its
drain; meanwhile a second generator sends `--hot-rate` messages a second to one hot topic,
`/default/soak-hot-0`, read at once by its own consumer, and one more subscription on the hot
topic acknowledges `--slow-rate` messages a second: a slow consumer whose backlog grows),
then `after` (the loads are over, the slow consumer gone). The generators stop sending at
`--minutes` (`danube-cli load --duration`) and drain; they are killed only if they are still
running `--grace` seconds later.

Prints, per criterion of issue 28 point 3: the peak RSS against the budget, RSS after the
load against the pre-load level (within 10 %), the rate reached against the rate asked, and
for the slow consumer the bytes its subscription held (bounded: the last third of the load no
higher than the middle third) and the other topics' share of the consumer and cache pools
(consumer pool less the slow subscription's records, cache pool less the hot topic's: not
rising while the backlog grows). Writes the samples as CSV and the chart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from danube.cli.admin_brokers import memory_of
from danube.client import DanubeClient
from danube.client.consumer import SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.values.sizes import parse_size

CLI = Path(sys.executable).parent / "danube-cli"
PREFIX = "/default/soak"
HOT_PREFIX = "/default/soak-hot"
HOT = f"{HOT_PREFIX}-0"
SLOW = "slow"
SUBSCRIPTIONS = "soak"
"""`--subscription-prefix` of every load: the set-up makes the subscriptions the load uses."""
HEAD = ("t_s", "phase", "rss_mib", "accounted_mib", "cache_mib", "publish_mib", "consumer_mib",
        "state_mib", "paused_s", "refused", "slow_held_mib", "others_consumer_mib",
        "hot_cache_mib", "others_cache_mib", "squeeze_mib", "unaccounted_mib")  # fmt: skip


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

    used = "danube_memory_pool_used_bytes:"
    accounted = sum(v for k, v in pools.items() if k.startswith(used))
    slow = pools.get(f"danube_memory_subscription_held_bytes:{HOT}:{SLOW}", 0)
    hot = pools.get(f"danube_memory_topic_cached_bytes:{HOT}", 0)
    return (
        round(time.monotonic() - started, 1), phase, round(_rss_mib(broker.pid), 1),
        round(accounted / 2**20, 1), mib("cache"), mib("publish"), mib("consumer"), mib("state"),
        pools.get("danube_memory_publish_paused_seconds_total", 0),
        pools.get("danube_memory_publish_refused_total", 0),
        round(slow / 2**20, 2), round((pools.get(f"{used}consumer", 0) - slow) / 2**20, 2),
        round(hot / 2**20, 2), round((pools.get(f"{used}cache", 0) - hot) / 2**20, 2),
        round(pools.get("danube_memory_rss_squeeze_bytes", 0) / 2**20, 1),
        round(pools.get("danube_memory_unaccounted_bytes", 0) / 2**20, 1),
    )  # fmt: skip


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="danube-soak-"))
        config = self.work / "broker.yaml"
        # A generator's connection holds 3 streams per topic it serves (100 by default): more
        # than the default cap of 500 concurrent streams (spec/hardening.md). --summed-metrics
        # sums the broker's series per broker: with 1,000 topics a scrape is 54,000 lines, and
        # scraping it every 5 s took a fifth of the broker's main thread (bench/RESULTS.md,
        # issue 28 part 5); but summed, the memory metrics by owner are summed too, and the
        # slow consumer's share of the pools is not measured.
        per_topic = "false" if args.summed_metrics else "true"
        config.write_text(
            "broker:\n  grpc:\n    max_concurrent_streams: 8192\n"
            f"metrics:\n  per_topic: {per_topic}\n"
        )
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

    async def load(
        self,
        prefix: str,
        topics: int,
        rate: float,
        seconds: float,
        drain: int,
        name: str,
        messages: int | None = None,
        producers: int = 1,
    ) -> LoadOutcome:
        """A `danube-cli load` sending `rate` messages a second for `seconds` (from its start,
        set-up included; `messages` instead: that many, however long it takes), then
        draining; killed only `--grace` seconds after that."""
        load = await asyncio.create_subprocess_exec(
            str(CLI), "load", "-s", self.broker.url, "--logs", str(self.work / f"logs-{name}"),
            "--topic-prefix", prefix, "--topics", str(topics), "--producers", str(producers),
            "--messages", str(messages or int(rate * seconds) + topics), "--rate", str(rate),
            "--duration", str(0 if messages else seconds),
            "--payload-bytes", str(self.args.payload_bytes), "--subscriptions", "exclusive",
            "--subscription-prefix", SUBSCRIPTIONS,
            "--drain", str(drain),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        outcome = LoadOutcome(name, time.monotonic())
        assert load.stderr is not None and load.stdout is not None

        async def progress() -> None:
            assert load.stderr is not None
            async for line in load.stderr:
                text = line.decode(errors="replace").rstrip()
                if text.startswith("[load") and outcome.sending_from is None:
                    # its set-up is over: the first progress line comes a second after it
                    outcome.sending_from = time.monotonic() - 1.0
                outcome.last_lines = [*outcome.last_lines[-4:], text]

        reading = asyncio.ensure_future(progress())
        try:
            await asyncio.wait_for(load.wait(), seconds + drain + self.args.grace)
        except TimeoutError:
            load.kill()
            await load.wait()
            outcome.killed = True
            print(f"load {name} killed {self.args.grace:.0f} s after its drain", file=sys.stderr)
        await reading
        outcome.summary = (await load.stdout.read()).decode(errors="replace")
        outcome.code = load.returncode or 0
        outcome.ended = time.monotonic()
        outcome.sending_until = min(outcome.ended, outcome.started + seconds)
        if outcome.code:
            tail = "\n".join(outcome.last_lines)
            print(f"load {name} exited {outcome.code}: {tail}", file=sys.stderr)
        return outcome

    def _returns(self) -> int:
        log = self.work / "broker.log"
        return log.read_text(errors="replace").count("event=memory_returned") if log.exists() else 0

    async def given_back(self, before: int, seconds: float) -> None:
        """Until the broker gave memory back since it had done so `before` times (at the
        set-up's start: its streams' close is a large drop of accounted memory, which decides
        a return), at most `seconds` more: the pre-load level is the broker with its topics
        and subscriptions once that is done, not the set-up's garbage waiting for the next
        return (part 6's first soak judged against that: 162 MiB, 146 after it)."""
        for _ in range(int(seconds)):
            if self._returns() > before:
                await asyncio.sleep(2)  # the trim's worker logs after the collection
                return
            await asyncio.sleep(1)

    async def slow_consumer(self, subscribe_only: bool = False) -> None:
        """One more subscription on the hot topic, acknowledging `--slow-rate` messages a
        second: its backlog grows by the hot rate less that. `subscribe_only`: the set-up's,
        which makes the subscription and leaves."""
        async with DanubeClient(self.broker.url) as client:
            while True:  # the hot load creates the topic: until then it is refused
                consumer = client.consumer(
                    HOT, SLOW, SLOW, sub_type=SubType.EXCLUSIVE, start="earliest"
                )
                try:
                    await consumer.subscribe()
                    break
                except Exception:
                    await asyncio.sleep(1)
            if subscribe_only:
                await consumer.close()
                return
            while True:
                message = await consumer.receive()
                await asyncio.sleep(1.0 / self.args.slow_rate)
                await consumer.ack(message)
                self.slow_acked += 1

    async def run(self) -> tuple[LoadOutcome | None, LoadOutcome | None]:
        args = self.args
        self.broker.start()
        sampler = asyncio.ensure_future(self.sampler())
        main = hot_outcome = None
        try:
            await asyncio.sleep(args.idle)
            if args.setup:
                self.phase = "setup"
                returns = self._returns()
                await self.load(PREFIX, args.topics, 1_000, 600, 5, "setup", args.topics)
                if args.hot_rate:
                    await self.load(HOT_PREFIX, 1, 10, 60, 5, "setup-hot", 1)
                    await self.slow_consumer(subscribe_only=True)
                self.phase = "idle"
                await self.given_back(returns, args.settle)
                await asyncio.sleep(args.idle)
            self.phase = "load"
            slow = asyncio.ensure_future(self.slow_consumer())
            seconds = args.minutes * 60
            loads = [self.load(PREFIX, args.topics, args.rate, seconds, 60, "main")]
            if args.hot_rate:
                # a producer per message a second: each sends one at a time, awaiting its
                # acknowledgement, which takes far more than 20 ms on a busy broker
                producers = max(1, int(args.hot_rate))
                hot = self.load(HOT_PREFIX, 1, args.hot_rate, seconds, 60, "hot", None, producers)
                loads.append(hot)
            outcomes = await asyncio.gather(*loads)
            main, hot_outcome = outcomes[0], outcomes[1] if len(outcomes) > 1 else None
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
        return main, hot_outcome


@dataclass
class LoadOutcome:
    name: str
    started: float
    sending_from: float | None = None
    """When its first progress line came: its producers and consumers were all up."""
    sending_until: float = 0.0
    ended: float = 0.0
    code: int = 0
    killed: bool = False
    summary: str = ""
    last_lines: list[str] = field(default_factory=list)

    @property
    def acknowledged(self) -> int:
        match = re.search(r"acknowledged (\d+) messages", self.summary)
        return int(match.group(1)) if match else 0

    @property
    def rate(self) -> float:
        """Messages acknowledged a second of sending (its set-up left out)."""
        sending = self.sending_until - (self.sending_from or self.started)
        return self.acknowledged / sending if sending > 0 else 0.0


def _level(samples: list[tuple[object, ...]], phase: str, last: int = 3) -> float:
    rows = [float(row[2]) for row in samples if row[1] == phase][-last:]  # type: ignore[arg-type]
    return sum(rows) / len(rows)


def _column(samples: list[tuple[object, ...]], index: int, phase: str | None = None) -> list[float]:
    return [float(row[index]) for row in samples if phase is None or row[1] == phase]  # type: ignore[arg-type]


def _thirds(values: list[float]) -> tuple[list[float], list[float], list[float]]:
    third = max(1, len(values) // 3)
    return values[:third], values[third : 2 * third], values[2 * third :]


def _chart(samples: list[tuple[object, ...]], budget_mib: float, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 7))
    FigureCanvasAgg(figure)
    axes, detail = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    t = _column(samples, 0)
    axes.plot(t, _column(samples, 2), label="broker RSS")
    axes.plot(t, _column(samples, 3), label="accounted (all pools)")
    axes.plot(t, _column(samples, 4), label="cache pool used", linewidth=0.8)
    axes.plot(t, _column(samples, 7),
              label="state (topics, subscriptions, consumers, streams)", linewidth=0.8)  # fmt: skip
    axes.axhline(budget_mib, color="red", linestyle="--", label="--memory-budget")
    for phase in ("setup", "idle", "load", "after"):
        starts = [float(row[0]) for row in samples if row[1] == phase]  # type: ignore[arg-type]
        if starts:
            for each in (axes, detail):
                each.axvline(starts[0], color="grey", linewidth=0.5)
            axes.text(starts[0], budget_mib * 1.02, phase, fontsize=8)
    axes.set_ylabel("MiB")
    axes.set_title("memory soak: broker RSS and accounted pools")
    axes.legend(loc="center right", fontsize=8)
    detail.plot(t, _column(samples, 10), label="slow subscription's held records")
    detail.plot(t, _column(samples, 11), label="consumer pool, other subscriptions")
    detail.plot(t, _column(samples, 12), label="hot topic's cache")
    detail.plot(t, _column(samples, 13), label="cache pool, other topics")
    detail.set_xlabel("seconds")
    detail.set_ylabel("MiB")
    detail.legend(loc="upper left", fontsize=8)
    figure.savefig(path, dpi=100)


def _verdicts(
    args: argparse.Namespace, soak: Soak, main: LoadOutcome | None, hot: LoadOutcome | None
) -> None:
    samples = soak.samples
    budget = parse_size(args.budget, "--budget") / 2**20
    rss, loaded = _column(samples, 2), _column(samples, 2, "load")
    start, end = _level(samples, "idle" if args.setup else "fresh"), _level(samples, "after")
    print(f"budget {args.budget}, {args.topics} topics, {args.rate}/s for {args.minutes} min, "
          f"hot topic {args.hot_rate}/s, slow consumer {args.slow_rate}/s")  # fmt: skip
    peak = max(rss)
    print(f"1. under the budget: peak RSS {peak:.1f} MiB "
          f"{'PASS (under)' if peak <= budget else 'FAIL (over)'} {budget:.0f} MiB; "
          f"accounted peak {max(_column(samples, 3)):.1f} MiB")  # fmt: skip
    change = 100 * (end - start) / start
    print(f"2. back after the load: fresh {rss[0]}, "
          f"{'pre-load' if args.setup else 'fresh'} {start:.1f}, peak under load "
          f"{max(loaded):.1f}, after {end:.1f} MiB ({change:+.1f} %): "
          f"{'PASS' if abs(change) <= 10 else 'FAIL'} (within 10 %)")  # fmt: skip
    for outcome in (main, hot):
        if outcome is None:
            continue
        asked = args.rate if outcome.name == "main" else args.hot_rate
        print(f"3. rate ({outcome.name}): {outcome.acknowledged} acknowledged, "
              f"{outcome.rate:.1f} msg/s while sending against {asked} asked: "
              f"{'PASS' if outcome.rate >= 0.95 * asked else 'FAIL'}; exit {outcome.code}"
              f"{', killed' if outcome.killed else ''}")  # fmt: skip
        for line in outcome.summary.splitlines()[:3]:
            print(f"   {line}")
    slow = _column(samples, 10, "load")
    others, other_cache = _column(samples, 11, "load"), _column(samples, 13, "load")
    if args.summed_metrics:
        # summed per broker, the memory metrics by owner cannot tell the slow one apart
        print(f"4. slow consumer: acknowledged {soak.slow_acked}; its share of the pools not "
              "measured (--summed-metrics)")  # fmt: skip
    elif slow:
        _, middle, last = _thirds(slow)
        bounded = max(last) <= max(middle) * 1.1 + 0.05
        print(f"4. slow consumer: acknowledged {soak.slow_acked}; its subscription held at most "
              f"{max(slow):.2f} MiB (middle third {max(middle):.2f}, last third {max(last):.2f}):"
              f" {'PASS (bounded)' if bounded else 'FAIL (still rising)'}")  # fmt: skip
        first, _, last_others = _thirds(others)
        first_cache, _, last_cache = _thirds(other_cache)
        mean = statistics.fmean
        rose = mean(last_others) > mean(first) * 1.2 + 0.5
        print(f"   the other subscriptions' consumer pool: mean {mean(first):.2f} MiB in the "
              f"first third of the load, {mean(last_others):.2f} in the last; their topics' "
              f"cache {mean(first_cache):.2f} -> {mean(last_cache):.2f} MiB: "
              f"{'FAIL (rose)' if rose else 'PASS (did not rise)'}")  # fmt: skip
    print(f"publishes paused {samples[-1][8]} s, refused {samples[-1][9]}")
    returns = re.findall(
        r"event=memory_returned .*rss_before=(\d+) rss_after=(\d+) ms=([\d.]+)"
        r"(?: gc_ms=([\d.]+) trim_ms=([\d.]+) stall_ms=([\d.]+))?",
        (soak.work / "broker.log").read_text(errors="replace"),
    )
    print(f"memory given back {len(returns)} times: " + ", ".join(
        f"{(int(before) - int(after)) / 2**20:.1f} MiB in {ms} ms"
        + (f" (collection {gc_ms}, trim {trim_ms}, loop held {stall} ms)" if stall else "")
        for before, after, ms, gc_ms, trim_ms, stall in returns
    ))  # fmt: skip
    print(f"broker log {soak.work / 'broker.log'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--topics", type=int, default=1_000)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=300)
    parser.add_argument("--hot-rate", type=float, default=50, help="messages/s to the hot topic")
    parser.add_argument(
        "--slow-rate", type=float, default=1, help="acknowledgements/s of the slow consumer"
    )
    parser.add_argument("--payload-bytes", type=int, default=128)
    parser.add_argument("--sample", type=float, default=5, help="seconds between samples")
    parser.add_argument("--idle", type=float, default=30, help="seconds idle before the load")
    parser.add_argument(
        "--settle", type=float, default=75,
        help="after the set-up, seconds to wait at most for the broker to give memory back "
        "before the idle (pre-load) samples",
    )  # fmt: skip
    parser.add_argument(
        "--no-setup", dest="setup", action="store_false",
        help="no set-up load: judge the memory after the load against the fresh broker",
    )  # fmt: skip
    parser.add_argument(
        "--grace", type=float, default=180,
        help="seconds a load may run past its --minutes and drain before it is killed",
    )  # fmt: skip
    parser.add_argument("--after", type=float, default=120, help="seconds sampled after the load")
    parser.add_argument(
        "--summed-metrics", action="store_true",
        help="the broker's series summed per broker (cheaper to scrape with many topics; the "
        "slow consumer's share of the pools is then not measured)",
    )  # fmt: skip
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--chart", type=Path)
    args = parser.parse_args()
    if args.csv:
        args.csv.write_text(",".join(HEAD) + "\n")
    soak = Soak(args)
    main_load, hot = asyncio.run(soak.run())
    if args.chart:
        _chart(soak.samples, parse_size(args.budget, "--budget") / 2**20, args.chart)
    _verdicts(args, soak, main_load, hot)


if __name__ == "__main__":
    main()
