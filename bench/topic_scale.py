"""Topics at scale (issue 23, point 3): how fast a standalone broker creates idle reliable topics
as their number grows, its resident memory per topic, and how long a restart with them takes.

`python -m bench.topic_scale --topics 20000 --concurrency 8 [--restart]` starts a fresh
`danube-broker` process, then creates `--topics` reliable topics, each with one producer (kept
open) and one stored message, `--concurrency` at a time; it prints topics/s and the broker's RSS
for every `--bucket` topics. `--restart` then stops the broker and times a new start on the same
data directory until it answers (`event=broker_ready`: since issue 23 point 3 the broker no
longer recovers every reliable topic first, it loads a topic's WAL on first use or by a sweep),
the first publish to the last topic, publishes to `--restart-sample` topics spread over all of
them (each a new producer and one message: every topic reachable, not only the last), and when
the sweep has loaded every topic (the broker's `event=wal_loaded` lines). A rate that falls as
buckets go by is a per-topic cost that grows with the topic count.

`--restart-only DIR` times only the restart, on a `--keep` run's directory or on one
`python -m bench.topic_synth --topics N` made in a minute (100,000 topics through a broker
take most of an hour here; `bench.topic_synth --check` shows the two kinds equivalent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.phases import cpu_seconds
from bench.workload import rss_mib
from danube.client import DanubeClient, DispatchStrategy, Producer
from danube.localcluster import broker_process
from danube.localcluster.broker_process import BrokerProcess

CONFIG = """storage:
  wal:
    durability: fsync
"""


@dataclass
class Bucket:
    upto: int
    topics_per_s: float
    rss_mib: float
    broker_cpu_ms_per_topic: float
    client_cpu_ms_per_topic: float = 0.0
    """This process's CPU (the Python client creating the topics) per topic: on a 2-core
    machine the client's share limits the rate as much as the broker's."""


@dataclass
class Result:
    topics: int
    concurrency: int
    fresh_rss_mib: float
    buckets: list[Bucket] = field(default_factory=list)
    restart_ready_s: float | None = None
    restart_first_publish_s: float | None = None
    restart_sample_publish_s: float | None = None
    restart_sample: int = 0
    restart_all_loaded_s: float | None = None
    restart_rss_mib: float | None = None

    def kib_per_topic(self) -> float:
        return (self.buckets[-1].rss_mib - self.fresh_rss_mib) * 1024 / self.topics


async def _create(client: DanubeClient, index: int, keep: list[Producer]) -> None:  # one idle topic
    producer = client.producer(
        f"/default/idle-{index}", "idle", dispatch=DispatchStrategy.RELIABLE, batching=None
    )
    await producer.create()
    await producer.send(b"x")
    keep.append(producer)


async def _fill(broker: BrokerProcess, args: argparse.Namespace, result: Result) -> None:
    keep: list[Producer] = []
    async with DanubeClient(broker.url) as client:
        started = time.perf_counter()
        cpu, client_cpu = cpu_seconds(broker.pid), time.process_time()
        next_index = 0
        for upto in range(args.bucket, args.topics + 1, args.bucket):
            queue = iter(range(next_index, upto))

            async def worker(queue=queue) -> None:
                for index in queue:
                    await _create(client, index, keep)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            next_index = upto
            now, now_cpu = time.perf_counter(), cpu_seconds(broker.pid)
            now_client_cpu = time.process_time()
            bucket = Bucket(
                upto=upto,
                topics_per_s=args.bucket / (now - started),
                rss_mib=rss_mib(broker.pid),
                broker_cpu_ms_per_topic=(now_cpu - cpu) * 1000 / args.bucket,
                client_cpu_ms_per_topic=(now_client_cpu - client_cpu) * 1000 / args.bucket,
            )
            result.buckets.append(bucket)
            print(
                f"{upto:>8,} topics: {bucket.topics_per_s:7.1f} topics/s, RSS "
                f"{bucket.rss_mib:7.1f} MiB, broker CPU {bucket.broker_cpu_ms_per_topic:.2f} "
                f"ms/topic, client CPU {bucket.client_cpu_ms_per_topic:.2f} ms/topic",
                flush=True,
            )
            started, cpu, client_cpu = now, now_cpu, now_client_cpu
        for producer in keep:
            await producer.__aexit__()


async def _restart(broker: BrokerProcess, args: argparse.Namespace, result: Result) -> None:
    stopping = time.perf_counter()
    broker.stop(timeout=args.start_timeout)  # a graceful stop seals every topic's WAL
    print(f"stop: {time.perf_counter() - stopping:.2f} s", flush=True)
    await _start_again(broker, args, result)


async def _start_again(broker: BrokerProcess, args: argparse.Namespace, result: Result) -> None:
    started = time.perf_counter()
    broker.start()
    result.restart_ready_s = time.perf_counter() - started
    async with DanubeClient(broker.url) as client:
        producer = client.producer(
            f"/default/idle-{args.topics - 1}", "again", dispatch=DispatchStrategy.RELIABLE,
            batching=None,
        )  # fmt: skip
        await producer.create()
        await producer.send(b"y")
        result.restart_first_publish_s = time.perf_counter() - started
        await producer.__aexit__()
        step = max(1, args.topics // max(1, args.restart_sample))
        sample = iter(range(0, args.topics, step))

        async def worker() -> None:
            for index in sample:
                again = client.producer(
                    f"/default/idle-{index}", "again", dispatch=DispatchStrategy.RELIABLE,
                    batching=None,
                )  # fmt: skip
                await again.create()
                await again.send(b"z")
                await again.__aexit__()
                result.restart_sample += 1

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        result.restart_sample_publish_s = time.perf_counter() - started
    while _stored_loads(broker) < args.topics:
        if time.perf_counter() - started > args.start_timeout:
            break
        await asyncio.sleep(0.2)
    else:
        result.restart_all_loaded_s = time.perf_counter() - started
    result.restart_rss_mib = rss_mib(broker.pid)
    print(
        f"restart: ready after {result.restart_ready_s:.2f} s, first publish to the last topic "
        f"after {result.restart_first_publish_s:.2f} s, {result.restart_sample} topics spread "
        f"over all published to after {result.restart_sample_publish_s:.2f} s, every topic "
        f"loaded after {result.restart_all_loaded_s or float('nan'):.2f} s, RSS "
        f"{result.restart_rss_mib:.1f} MiB",
        flush=True,
    )


def _stored_loads(broker: BrokerProcess) -> int:
    """WALs of stored topics the restarted broker has loaded (or found damaged) so far."""
    return sum(
        1
        for line in list(broker.log_lines)
        if ("event=wal_loaded" in line and "fresh=False" in line) or "event=wal_load_failed" in line
    )


async def run(args: argparse.Namespace) -> Result:
    # A restart with many topics may well take longer than the library's default wait.
    broker_process.START_TIMEOUT_S = args.start_timeout
    if args.restart_only is not None:  # the data of an earlier `--keep` run, started again
        root = args.restart_only
        broker = BrokerProcess(root / "data", config_file=root / "broker.yaml", metrics_port=None)
        result = Result(args.topics, args.concurrency, fresh_rss_mib=0.0)
        try:
            await _start_again(broker, args, result)
        finally:
            if broker.alive:
                broker.stop(timeout=args.start_timeout)
        return result
    with tempfile.TemporaryDirectory(prefix="danube-topic-scale-", dir=args.dir) as tmp:
        root = Path(tmp)
        if args.keep:
            root = Path(tempfile.mkdtemp(prefix="danube-topic-scale-kept-", dir=args.dir))
            print(f"data kept in {root} (--restart-only {root})", flush=True)
        (root / "broker.yaml").write_text(CONFIG)
        broker = BrokerProcess(
            root / "data", config_file=root / "broker.yaml", metrics_port=None
        ).start()
        try:
            result = Result(args.topics, args.concurrency, fresh_rss_mib=rss_mib(broker.pid))
            print(f"broker pid {broker.pid}, fresh RSS {result.fresh_rss_mib:.1f} MiB", flush=True)
            await _fill(broker, args, result)
            print(f"memory: {result.kib_per_topic():.2f} KiB per idle topic", flush=True)
            if args.restart:
                await _restart(broker, args, result)
        finally:
            if broker.alive:
                broker.stop(timeout=args.start_timeout)
    return result


def chart(runs: list[tuple[str, Path]], out: Path) -> None:
    """topics/s, broker CPU per topic and RSS against the topic count, one line per saved run
    (`--json`); on a shared machine the CPU per topic is the steadier of the first two."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 4), layout="constrained")
    rate, cpu, memory = figure.subplots(1, 3)
    for label, path in runs:
        buckets = json.loads(path.read_text())["buckets"]
        upto = [b["upto"] for b in buckets]
        rate.plot(upto, [b["topics_per_s"] for b in buckets], marker="o", label=label)
        cpu.plot(upto, [b["broker_cpu_ms_per_topic"] for b in buckets], marker="o", label=label)
        memory.plot(upto, [b["rss_mib"] for b in buckets], marker="o", label=label)
    rate.set(xlabel="topics", ylabel="topics created per second", ylim=(0, None))
    cpu.set(xlabel="topics", ylabel="broker CPU per topic created (ms)", ylim=(0, None))
    memory.set(xlabel="topics", ylabel="broker RSS (MiB)")
    rate.legend()
    for axes in (rate, cpu, memory):
        axes.grid(alpha=0.3)
    FigureCanvasAgg(figure).print_png(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--bucket", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--restart-sample", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--restart-only", type=Path, default=None, metavar="DIR",
        help="only start a broker on a --keep run's DIR (or one `bench.topic_synth` made, with the "
        "same --topics) and time it",
    )  # fmt: skip
    parser.add_argument("--dir", default=None, help="parent of the temporary data directory")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument(
        "--chart", nargs="+", metavar="LABEL=JSON", default=None,
        help="instead of a run: draw saved runs into --chart-out",
    )  # fmt: skip
    parser.add_argument("--chart-out", type=Path, default=Path("bench/topic_scale.png"))
    args = parser.parse_args()
    if args.chart:
        runs = [(spec.split("=", 1)[0], Path(spec.split("=", 1)[1])) for spec in args.chart]
        chart(runs, args.chart_out)
        return
    result = asyncio.run(run(args))
    if args.restart_only is not None:
        if args.json is not None:
            args.json.write_text(json.dumps(asdict(result), indent=2))
        return
    first, last = result.buckets[0].topics_per_s, result.buckets[-1].topics_per_s
    print(f"last bucket / first bucket: {last / first:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2))


if __name__ == "__main__":
    main()
