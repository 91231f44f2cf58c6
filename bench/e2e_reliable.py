"""End-to-end reliable-topic benchmark: a real broker process per durability mode, our client.

Like `bench/e2e_nonreliable.py`, but the topics are reliable (every publish goes through the
topic's WAL before it is acknowledged or delivered, spec/durability.md) and the consumer
acknowledges every message. One broker per `--durability` mode, configured by a YAML file
(`storage.wal.durability`), with its data (and WAL) in a temporary directory. Two phases:

- throughput: `--producers` concurrent producers send `--messages` 1 KiB messages as fast as
  acks return, one Exclusive consumer (`start="earliest"`) receives and acks them; reports
  publish and delivery msg/s;
- latency: one producer, open loop at `--rate` msg/s; each payload carries its send time
  (CLOCK_MONOTONIC, shared by processes on one machine); reports publish-ack and end-to-end
  (consumer receipt - send start) p50/p99.

Every phase checks that each message arrived exactly once (payloads carry producer and
sequence numbers) and fails loudly, with the tail of the broker's log, if one is missing,
duplicated, or the run stalls. The broker's write syscalls during a phase (`/proc/<pid>/io`)
are reported too: with one WAL `pwrite` per group commit, messages per write is roughly the
average group-commit size.

    .venv/bin/python -m bench.e2e_reliable --messages 10000 --producers 4 --rate 1000 \\
        --latency-messages 5000 --durability both
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import stage_breakdown
from bench.e2e_nonreliable import PAYLOAD_SIZE, _percentile
from danube.client import Consumer, DanubeClient, DispatchStrategy, Message, SubType
from danube.localcluster.broker_process import BrokerProcess

_HEAD = struct.Struct("<QII")
"""Send time (monotonic ns), producer index, sequence number: enough to time each message and
to prove every one arrived exactly once."""
STALL_S = 30.0
"""A phase fails when the consumer receives nothing for this long."""


class BenchFailure(RuntimeError):
    """The reliable path misbehaved (lost, duplicated or stalled messages)."""


def _payload(producer: int, sequence: int, padding: bytes) -> bytes:
    return _HEAD.pack(time.monotonic_ns(), producer, sequence) + padding


def _config_yaml(durability: str, max_unacked: int | None, shared: Path) -> str:
    text = f"storage:\n  wal:\n    durability: {durability}\n"
    if durability == "object":
        # `object` needs an object tier: a shared filesystem in the temporary directory.
        text += f"  mode: shared_fs\n  durable:\n    root: file://{shared}\n"
    if max_unacked is not None:
        text += f"dispatch:\n  max_unacked_messages: {max_unacked}\n"
    return text


def _broker_io(broker: BrokerProcess) -> dict[str, float]:
    """Cumulative counters to difference around a phase: the broker's I/O (all threads;
    `syscw` counts write syscalls: WAL `pwrite`s, but also its log lines on stderr, counted
    separately in `log_lines`; `write_bytes` the bytes sent to the block layer), the broker's
    CPU time and this client process's CPU time."""
    times = os.times()
    counters: dict[str, float] = {
        "log_lines": len(broker.log_lines),
        "cpu_ticks": _cpu_ticks(broker.pid),
        "client_cpu_s": times.user + times.system,
    }
    for line in Path(f"/proc/{broker.pid}/io").read_text().splitlines():
        key, value = line.split(":")
        counters[key] = int(value)
    return counters


def _cpu_ticks(pid: int) -> int:
    """User plus system CPU time of a process (all threads) in clock ticks, from its stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _io_report(
    before: dict[str, float], after: dict[str, float], messages: int
) -> dict[str, object]:
    """Write syscalls other than log lines, and messages per such write: roughly the
    average group-commit size (one `pwrite` per group; segment headers add a few). CPU time
    per message of the broker and of this client process tells which side bounds the rate."""
    log_lines = after["log_lines"] - before["log_lines"]
    ticks = os.sysconf("SC_CLK_TCK")
    broker_cpu = (after["cpu_ticks"] - before["cpu_ticks"]) / ticks
    client_cpu = after["client_cpu_s"] - before["client_cpu_s"]
    writes = after["syscw"] - before["syscw"] - log_lines
    return {
        "broker_write_syscalls_minus_log_lines": int(writes),
        "broker_log_lines": int(log_lines),
        "messages_per_write_syscall": round(messages / writes, 2) if writes > 0 else None,
        "broker_disk_write_mib": round((after["write_bytes"] - before["write_bytes"]) / 2**20, 2),
        "broker_cpu_s": round(broker_cpu, 2),
        "broker_cpu_ms_per_message": round(1000 * broker_cpu / messages, 3),
        "client_cpu_s": round(client_cpu, 2),
        "client_cpu_ms_per_message": round(1000 * client_cpu / messages, 3),
    }


class _Receiver:
    """Receives and acknowledges `expected` messages, recording end-to-end latency and which
    (producer, sequence) pairs arrived. Acks run concurrently (at most `ack_concurrency` in
    flight) so that the one-RPC-per-ack round trip does not serialise delivery behind it."""

    def __init__(self, consumer: Consumer, expected: int, ack_concurrency: int) -> None:
        self.consumer = consumer
        self.expected = expected
        self.seen: set[tuple[int, int]] = set()
        self.duplicates = 0
        self.received = 0
        self.e2e_ms: list[float] = []
        self.offsets: list[int] = []
        self.finished_at = 0.0
        self._acks = asyncio.Semaphore(ack_concurrency)
        self._pending: set[asyncio.Task[None]] = set()
        self.ack_errors: list[str] = []

    async def _ack(self, message: Message) -> None:
        try:
            await self.consumer.ack(message)
        except Exception as error:  # reported, not raised: the run must finish to show it
            self.ack_errors.append(repr(error))
        finally:
            self._acks.release()

    async def run(self) -> None:
        while self.received < self.expected:
            try:
                message = await asyncio.wait_for(self.consumer.receive(), STALL_S)
            except TimeoutError:
                raise BenchFailure(
                    f"consumer stalled: nothing received for {STALL_S:.0f} s after "
                    f"{self.received} of {self.expected} messages"
                ) from None
            now = time.monotonic_ns()
            sent, producer, sequence = _HEAD.unpack_from(message.payload)
            self.e2e_ms.append((now - sent) / 1e6)
            self.offsets.append(message.offset)
            if (producer, sequence) in self.seen:
                self.duplicates += 1
            else:
                self.seen.add((producer, sequence))
            self.received += 1
            await self._acks.acquire()
            task = asyncio.create_task(self._ack(message))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        self.finished_at = time.perf_counter()
        await asyncio.gather(*self._pending)

    def check(self, sent: set[tuple[int, int]]) -> dict[str, int]:
        missing = len(sent - self.seen)
        report = {
            "received": self.received,
            "unique": len(self.seen),
            "duplicates": self.duplicates,
            "missing": missing,
            "ack_errors": len(self.ack_errors),
            "offsets_in_order": int(self.offsets == sorted(self.offsets)),
        }
        if missing or self.duplicates or self.ack_errors:
            raise BenchFailure(f"delivery check failed: {report}; acks: {self.ack_errors[:3]}")
        return report


async def _throughput(
    broker: BrokerProcess, messages: int, producers: int, ack_concurrency: int
) -> dict[str, object]:
    topic = f"/default/bench-rtput-{time.monotonic_ns()}"
    padding = b"x" * (PAYLOAD_SIZE - _HEAD.size)
    per_producer = messages // producers
    total = per_producer * producers
    reliable = DispatchStrategy.RELIABLE
    async with DanubeClient(broker.url) as client:
        await client.producer(topic, "creator", dispatch=reliable).create()
        consumer = await client.consumer(
            topic, "c", "s", sub_type=SubType.EXCLUSIVE, start="earliest"
        ).subscribe()
        senders = [
            await client.producer(topic, f"p{i}", dispatch=reliable).create()
            for i in range(producers)
        ]
        receiver = _Receiver(consumer, total, ack_concurrency)
        sent: set[tuple[int, int]] = set()

        async def send_all(index: int) -> None:
            for sequence in range(per_producer):
                await senders[index].send(_payload(index, sequence, padding))
                sent.add((index, sequence))

        io_before = _broker_io(broker)
        receiving = asyncio.create_task(receiver.run())
        started = time.perf_counter()
        try:
            await asyncio.gather(*(send_all(i) for i in range(producers)))
            published = time.perf_counter()
            await receiving
        finally:
            receiving.cancel()
        io_after = _broker_io(broker)
        await consumer.close()
    return {
        "messages": total,
        "publish_msgs_per_s": total / (published - started),
        "delivery_msgs_per_s": total / (receiver.finished_at - started),
        **_io_report(io_before, io_after, total),
        "check": receiver.check(sent),
    }


async def _latency(
    broker: BrokerProcess, messages: int, rate: int, ack_concurrency: int, stages: bool = False
) -> dict[str, object]:
    topic = f"/default/bench-rlat-{time.monotonic_ns()}"
    padding = b"x" * (PAYLOAD_SIZE - _HEAD.size)
    ack_ms: list[float] = []
    reliable = DispatchStrategy.RELIABLE
    async with DanubeClient(broker.url) as client:
        await client.producer(topic, "creator", dispatch=reliable).create()
        consumer = await client.consumer(
            topic, "c", "s", sub_type=SubType.EXCLUSIVE, start="earliest"
        ).subscribe()
        producer = await client.producer(topic, "p", dispatch=reliable).create()
        receiver = _Receiver(consumer, messages, ack_concurrency)
        sent: set[tuple[int, int]] = set()

        async def send_one(sequence: int) -> None:
            before = time.monotonic_ns()
            await producer.send(_payload(0, sequence, padding))
            ack_ms.append((time.monotonic_ns() - before) / 1e6)
            sent.add((0, sequence))

        io_before = _broker_io(broker)
        stages_before = stage_breakdown.scrape(broker.metrics_url) if stages else None
        receiving = asyncio.create_task(receiver.run())
        # Open loop: sends start on schedule whether or not earlier ones were acknowledged,
        # so the offered rate is the one asked for and queueing shows up as latency.
        interval = 1.0 / rate
        started = time.monotonic()
        started_perf = time.perf_counter()
        sends = []
        try:
            for n in range(messages):
                delay = started + n * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                sends.append(asyncio.create_task(send_one(n)))
            await asyncio.gather(*sends)
            elapsed = time.monotonic() - started
            await receiving
        finally:
            receiving.cancel()
        io_after = _broker_io(broker)
        breakdown = None
        if stages_before is not None:
            after = stage_breakdown.scrape(broker.metrics_url)
            breakdown = stage_breakdown.table(stage_breakdown.difference(after, stages_before))
        await consumer.close()
    return {
        **({"stages": breakdown} if breakdown is not None else {}),
        "messages": messages,
        "offered_msgs_per_s": rate,
        "achieved_msgs_per_s": messages / elapsed,
        "delivery_msgs_per_s": messages / (receiver.finished_at - started_perf),
        "publish_ack_p50_ms": statistics.median(ack_ms),
        "publish_ack_p99_ms": _percentile(ack_ms, 0.99),
        "end_to_end_p50_ms": statistics.median(receiver.e2e_ms),
        "end_to_end_p99_ms": _percentile(receiver.e2e_ms, 0.99),
        **_io_report(io_before, io_after, messages),
        "check": receiver.check(sent),
    }


@contextmanager
def _broker(root: Path, durability: str, max_unacked: int | None) -> Iterator[BrokerProcess]:
    """A broker whose reliable topics use `durability`; on failure, shows its log's tail."""
    data = root / durability
    data.mkdir()
    config = root / f"{durability}.yaml"
    config.write_text(_config_yaml(durability, max_unacked, root / f"{durability}-objects"))
    broker = BrokerProcess(data, config_file=config)
    with broker:
        try:
            yield broker
        except BaseException:
            print(f"--- broker log tail ({durability}) ---", file=sys.stderr)
            print("\n".join(broker.log_lines[-40:]), file=sys.stderr)
            raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rate", type=int, default=1000, help="msg/s in the latency phase")
    parser.add_argument("--latency-messages", type=int, default=5000)
    parser.add_argument(
        "--durability", choices=("fsync", "flush", "object", "both"), default="both"
    )
    parser.add_argument(
        "--ack-concurrency", type=int, default=64, help="consumer acks in flight (1: in order)"
    )
    parser.add_argument(
        "--max-unacked",
        type=int,
        default=None,
        help="dispatch.max_unacked_messages for the broker (default: the broker's)",
    )
    parser.add_argument("--phase", choices=("throughput", "latency", "both"), default="both")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="latency phase: the broker's stage breakdown (bench.stage_breakdown) around it",
    )
    args = parser.parse_args()
    modes = ("fsync", "flush") if args.durability == "both" else (args.durability,)
    result: dict[str, object] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
        "args": vars(args),
    }
    with tempfile.TemporaryDirectory(prefix="danube-e2e-reliable-") as temporary:
        for mode in modes:
            with _broker(Path(temporary), mode, args.max_unacked) as broker:
                runs: dict[str, object] = {}
                if args.phase in ("throughput", "both"):
                    runs["throughput"] = asyncio.run(
                        _throughput(
                            broker,
                            args.messages,
                            args.producers,
                            args.ack_concurrency,
                        )
                    )
                if args.phase in ("latency", "both"):
                    runs["latency"] = asyncio.run(
                        _latency(
                            broker,
                            args.latency_messages,
                            args.rate,
                            args.ack_concurrency,
                            args.stages,
                        )
                    )
                    breakdown = runs["latency"].get("stages")  # type: ignore[attr-defined]
                    if breakdown:
                        print(stage_breakdown.render(breakdown), file=sys.stderr)
                result[mode] = runs
            print(json.dumps({mode: runs}, indent=2), file=sys.stderr, flush=True)
    result["load_average_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
