"""Danube's plain data path (one message per unary call) against grpclib's floor: the rate of
`/danube.ProducerService/SendMessage` on a real broker process, next to a grpclib server on
trio-asyncio whose handler only answers (`bench.grpc_baseline`), at the same concurrency.

The client sends pre-encoded bytes through a pass-through codec, so every row pays the same
client cost and differs only in what the server does. Rows:
- raw: the baseline server, an empty HealthCheckRequest;
- raw 1 KiB: the same call carrying the payload as an unknown field (the server skips it);
- non-reliable / reliable fsync: SendMessage with a 1 KiB payload to a topic of that kind,
  no consumer (the reliable broker runs with `storage.wal.durability: fsync`).

Every server starts first and the rows take turns, `--rounds` times, so that a burst of other
work on the machine hits all of them alike; a row reports its best rate, that rate's ratio to
the raw row's best at the same concurrency, and the median CPU time per call of the server
and of this client (two cores here: a row can be bound by either side). The CPU times are
the steadier measure on a shared machine.

    .venv/bin/python -m bench.plain_path --calls 4000 --in-flight 1 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.encoding.base import CodecBase

from bench.grpc_baseline import _serve
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.wal import records
from danube.proto import danube as pb

PAYLOAD_SIZE = 1024
WARMUP_CALLS = 300
HEALTH_CHECK = "/danube.HealthCheck/HealthCheck"
SEND_MESSAGE = "/danube.ProducerService/SendMessage"
_UNKNOWN_FIELD = 15
FSYNC_CONFIG = "storage:\n  wal:\n    durability: fsync\n"


class _RawCodec(CodecBase):
    """Sends bytes as they are and returns replies undecoded."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return message  # type: ignore[no-any-return]

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


@dataclass(frozen=True, slots=True)
class _Target:
    """One row's server and call."""

    name: str
    port: int
    pid: int
    path: str
    body: bytes


@dataclass(frozen=True, slots=True)
class _Run:
    calls_per_s: float
    server_us_per_call: float
    client_us_per_call: float


def _cpu_s(pid: int) -> float:
    """User plus system CPU time of a process (all threads), from its stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _rate(target: _Target, calls: int, in_flight: int) -> _Run:
    channel = Channel("127.0.0.1", target.port, codec=_RawCodec())
    method: UnaryUnaryMethod[bytes, bytes] = UnaryUnaryMethod(channel, target.path, bytes, bytes)

    async def worker(count: int) -> None:
        for _ in range(count):
            await method(target.body)

    try:
        await asyncio.gather(*(worker(WARMUP_CALLS // in_flight + 1) for _ in range(in_flight)))
        per_worker = max(1, calls // in_flight)
        server_before, client_before = _cpu_s(target.pid), time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker(per_worker) for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
        server_cpu = _cpu_s(target.pid) - server_before
        client_cpu = time.process_time() - client_before
    finally:
        channel.close()
    done = per_worker * in_flight
    return _Run(done / elapsed, 1e6 * server_cpu / done, 1e6 * client_cpu / done)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_for(port: int) -> None:
    channel = Channel("127.0.0.1", port)
    try:
        for attempt in range(100):
            try:
                await pb.HealthCheckStub(channel).health_check(pb.HealthCheckRequest())
                return
            except OSError:
                await asyncio.sleep(0.05 * (attempt + 1))
    finally:
        channel.close()


def _length_delimited(number: int, data: bytes) -> bytes:
    out = bytearray([number << 3 | 2])
    size = len(data)
    while size > 0x7F:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out) + data


@contextlib.contextmanager
def _raw_server() -> Iterator[list[_Target]]:
    port = _free_port()
    server = multiprocessing.Process(target=_serve, args=("trio-asyncio", port, 3600.0))
    server.start()
    assert server.pid is not None
    try:
        asyncio.run(_wait_for(port))
        padded = _length_delimited(_UNKNOWN_FIELD, b"x" * PAYLOAD_SIZE)
        yield [
            _Target("raw", port, server.pid, HEALTH_CHECK, b""),
            _Target("raw 1 KiB", port, server.pid, HEALTH_CHECK, padded),
        ]
    finally:
        server.terminate()
        server.join()


async def _create_producer(port: int, topic: str, strategy: pb.DispatchStrategy) -> int:
    channel = Channel("127.0.0.1", port)
    try:
        response = await pb.ProducerServiceStub(channel).create_producer(
            pb.ProducerRequest(
                request_id=1,
                producer_name="bench",
                topic_name=topic,
                producer_access_mode=pb.ProducerAccessMode.Shared,
                dispatch_strategy=strategy,
            )
        )
    finally:
        channel.close()
    return response.producer_id


def _message(producer_id: int, topic: str, broker_addr: str) -> bytes:
    return records.encode(
        records.Record(
            request_id=7,
            producer_id=producer_id,
            topic_name=topic,
            broker_addr=broker_addr,
            payload=b"x" * PAYLOAD_SIZE,
            publish_time=time.time_ns() // 1_000_000,
            producer_name="bench",
        )
    )


@contextlib.contextmanager
def _broker(name: str, strategy: pb.DispatchStrategy, config: str | None) -> Iterator[_Target]:
    with tempfile.TemporaryDirectory(prefix="plain-path-") as scratch:
        config_file = None
        if config is not None:
            config_file = Path(scratch) / "broker.yaml"
            config_file.write_text(config)
        with BrokerProcess(Path(scratch) / "data", config_file=config_file) as broker:
            print(f"{name}: broker pid {broker.pid}", file=sys.stderr)
            topic = f"/default/plain-{strategy.name.lower()}-{time.monotonic_ns()}"
            producer_id = asyncio.run(_create_producer(broker.broker_port, topic, strategy))
            body = _message(producer_id, topic, broker.url)
            yield _Target(name, broker.broker_port, broker.pid, SEND_MESSAGE, body)


def _table(runs: dict[tuple[str, int], list[_Run]]) -> str:
    best = {key: max(run.calls_per_s for run in found) for key, found in runs.items()}
    lines = [
        f"{'path':<16}{'in flight':>10}{'calls/s':>10}{'vs raw':>8}"
        f"{'server µs/call':>16}{'client µs/call':>16}"
    ]
    for (name, in_flight), found in sorted(runs.items(), key=lambda item: item[0][1]):
        server = statistics.median(run.server_us_per_call for run in found)
        client = statistics.median(run.client_us_per_call for run in found)
        lines.append(
            f"{name:<16}{in_flight:>10}{best[name, in_flight]:>10.0f}"
            f"{best[name, in_flight] / best['raw', in_flight]:>8.2f}"
            f"{server:>16.0f}{client:>16.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000, help="measured calls per run")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each row, taking turns")
    args = parser.parse_args()
    with contextlib.ExitStack() as servers:
        targets = servers.enter_context(_raw_server())
        targets.append(
            servers.enter_context(_broker("non-reliable", pb.DispatchStrategy.NonReliable, None))
        )
        targets.append(
            servers.enter_context(
                _broker("reliable fsync", pb.DispatchStrategy.Reliable, FSYNC_CONFIG)
            )
        )
        runs: dict[tuple[str, int], list[_Run]] = {}
        for _ in range(args.rounds):
            for in_flight in args.in_flight:
                for target in targets:
                    run = asyncio.run(_rate(target, args.calls, in_flight))
                    runs.setdefault((target.name, in_flight), []).append(run)
    print(_table(runs))


if __name__ == "__main__":
    main()
