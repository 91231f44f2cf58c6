"""Object-tier benchmark: uploads to, and historical replay from, an S3 server on loopback.

One broker process in `storage.mode: object_store` against moto's S3 server (its own process
on loopback, so its CPU is measured apart from the broker's and this client's, and it does
not share this client's GIL; wrapped in a WSGI middleware that counts requests and body bytes
per method, since socket traffic shows in no per-process counter). One reliable topic, three
measurements:

- uploads: `--producers` producers publish `--messages` reliable messages as fast as acks
  return, with no subscription. Every sealed segment (`storage.wal.rotation.max_bytes =
  --segment-bytes`) is uploaded by the broker, which logs `event=segment_uploaded ... bytes=...
  seconds=...`: MB/s is the sum of bytes over the sum of seconds (the uploader's own time,
  one upload at a time), and also over the wall clock from the first upload's start to the last
  upload's end (bounded by the publish rate when uploads keep up). Upload lag is the time
  from the acknowledgement of a segment's last message to its `segment_uploaded` line.
- replay: once every sealed segment is uploaded and local retention (`--retention-mb`) has
  pruned the WAL directory, an Exclusive consumer (`start="earliest"`) reads the whole topic
  and acknowledges every message. Offsets below the first local segment at that time are
  served from objects (spec/object-layout.md, "Handoff rule"); MB/s and msg/s are reported
  for that part and for the whole replay, with moto's GET count and bytes (how many range
  GETs the replay made, and how many bytes they fetched per byte of object served).
- handoff: the time between receiving the last object-served offset and the first
  WAL-served one, next to the median gap between consecutive receipts (and the gaps at each
  object boundary, where the broker issues a new range GET).

The replay proves every message arrived exactly once and in offset order (payloads carry
producer and sequence numbers, offsets must be 0..N-1, each producer's sequence numbers must
rise with the offset); the run fails loudly with the broker's log tail otherwise. MB here is
10^6 bytes; payload MB counts the messages' payloads, object MB the objects' bytes.

Before measuring it waits (up to `--max-wait-s`) for the 1-minute load average to fall to
`--max-load`: the machine is shared, and a busy neighbour distorts every number here.

    .venv/bin/python -m bench.tiered --messages 20000 --payload 1024 --segment-bytes 1048576
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.e2e_nonreliable import _percentile
from bench.e2e_reliable import _HEAD, STALL_S, BenchFailure, _cpu_ticks, _payload
from danube.client import DanubeClient, DispatchStrategy, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.wal.format import segment_base

BUCKET = "danube-bench"
UPLOADED = re.compile(
    r"^(\S+ \S+) .*event=segment_uploaded .*key=\S*?(\d{20})-(\d{20})\.wal "
    r"bytes=(\d+) seconds=([\d.]+)"
)
"""asctime, first offset, next offset, bytes, seconds of one upload (runtime.py's line)."""
TROUBLE = re.compile(r"level=(WARNING|ERROR|CRITICAL)|Traceback")
SETTLE_TIMEOUT_S = 180.0
"""How long uploads and local pruning may take after the last publish before the run fails."""


def _log_time(asctime: str) -> float:
    """Unix time of a broker log line (`%(asctime)s`: local time, millisecond resolution);
    compared with this process's `time.time()`, both on one machine and time zone."""
    return datetime.strptime(asctime, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_quiet_machine(max_load: float, max_wait_s: float) -> list[tuple[str, float]]:
    """Samples the 1-minute load every 60 s until it is at most `max_load` or `max_wait_s`
    passed; returns the samples so the report says what the machine was doing."""
    samples: list[tuple[str, float]] = []
    deadline = time.monotonic() + max_wait_s
    while True:
        load = os.getloadavg()[0]
        samples.append((time.strftime("%H:%M:%S"), load))
        print(f"load average (1 min) {load:.2f}", file=sys.stderr, flush=True)
        if load <= max_load or time.monotonic() + 60 > deadline:
            return samples
        time.sleep(60)


@contextmanager
def _moto_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """moto's S3 server as a process of its own on a free loopback port, with the bucket
    created; credentials go in the environment, which the broker inherits (never its config)."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-c", f"from bench.tiered import serve_moto; serve_moto({port})"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _moto_counts(endpoint)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)
        import s3fs

        s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}).mkdir(BUCKET)
        yield endpoint, process
    finally:
        process.terminate()
        process.wait(10)


def _config_yaml(args: argparse.Namespace, endpoint: str, prefix: str) -> str:
    lines = [
        "storage:",
        "  mode: object_store",
        "  durable:",
        f"    root: s3://{BUCKET}/{prefix}",
        f"    endpoint: {endpoint}",
        "  local_retention:",
        f"    size_mb: {args.retention_mb}",
        "  wal:",
        f"    durability: {args.durability}",
        "    rotation:",
        f"      max_bytes: {args.segment_bytes}",
    ]
    if args.max_unacked is not None:
        lines += ["dispatch:", f"  max_unacked_messages: {args.max_unacked}"]
    return "\n".join(lines) + "\n"


class _CountingApp:
    """WSGI middleware around moto's app: requests and body bytes per HTTP method, served as
    JSON at `/_bench/counts`. Socket traffic shows in no `/proc/<pid>/io` counter, and these
    counts are what tells how many range GETs a replay made and how many bytes they fetched."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.counts: dict[str, list[int]] = {}
        """method -> [requests, request body bytes, response body bytes]"""

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == "/_bench/counts":
            with self.lock:
                body = json.dumps(self.counts).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        method = environ.get("REQUEST_METHOD", "?")
        with self.lock:
            entry = self.counts.setdefault(method, [0, 0, 0])
            entry[0] += 1
            entry[1] += int(environ.get("CONTENT_LENGTH") or 0)
        return self._counted(method, self.app(environ, start_response))

    def _counted(self, method: str, body: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for chunk in body:
                with self.lock:
                    self.counts[method][2] += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


def serve_moto(port: int) -> None:
    """moto's S3 server (as `ThreadedMotoServer` builds it) with request counting; run in a
    process of its own by `_moto_server`."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = _CountingApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", port, app, True, request_handler=MotoRequestHandler)
    server.serve_forever()


def _moto_counts(endpoint: str) -> dict[str, list[int]]:
    with urllib.request.urlopen(f"{endpoint}/_bench/counts", timeout=10) as response:
        return json.loads(response.read())


class _Usage:
    """CPU seconds of the broker, moto's server and this client over one phase (which of the
    three processes on the two vCPUs bounds it), and moto's requests and bytes by method."""

    def __init__(self, broker: int, moto: int, endpoint: str) -> None:
        self.pids = {"broker": broker, "moto": moto}
        self.endpoint = endpoint
        self.start = self._sample()
        self.requests = _moto_counts(endpoint)

    def _sample(self) -> dict[str, float]:
        ticks = os.sysconf("SC_CLK_TCK")
        times = os.times()
        sample = {f"{name}_cpu_s": _cpu_ticks(pid) / ticks for name, pid in self.pids.items()}
        sample["client_cpu_s"] = times.user + times.system
        return sample

    def report(self) -> dict[str, object]:
        end = self._sample()
        report: dict[str, object] = {name: round(end[name] - self.start[name], 2) for name in end}
        counts = _moto_counts(self.endpoint)
        for method, (requests, received, sent) in sorted(counts.items()):
            before = self.requests.get(method, [0, 0, 0])
            report[f"moto_{method}"] = {
                "requests": requests - before[0],
                "request_mb": round((received - before[1]) / 1e6, 3),
                "response_mb": round((sent - before[2]) / 1e6, 3),
            }
        return report


def _uploads(broker: BrokerProcess) -> list[tuple[float, int, int, int, float]]:
    """(log time, first offset, next offset, bytes, seconds) of each upload so far."""
    found = []
    for line in list(broker.log_lines):
        match = UPLOADED.search(line)
        if match:
            stamp, first, end, size, seconds = match.groups()
            found.append((_log_time(stamp), int(first), int(end), int(size), float(seconds)))
    return found


def _local_bases(wal_dir: Path) -> list[int]:
    bases = (segment_base(entry.name) for entry in os.scandir(wal_dir))
    return sorted(base for base in bases if base is not None)


async def _publish(
    url: str, topic: str, messages: int, producers: int, payload: int
) -> tuple[dict[tuple[int, int], float], float, float]:
    """Sends everything; returns the wall-clock ack time of each (producer, sequence) and the
    wall-clock start and end of publishing."""
    padding = b"x" * (payload - _HEAD.size)
    per_producer = messages // producers
    acked: dict[tuple[int, int], float] = {}
    reliable = DispatchStrategy.RELIABLE
    async with DanubeClient(url) as client:
        senders = [
            await client.producer(topic, f"p{i}", dispatch=reliable).create()
            for i in range(producers)
        ]

        async def send_all(index: int) -> None:
            for sequence in range(per_producer):
                await senders[index].send(_payload(index, sequence, padding))
                acked[(index, sequence)] = time.time()

        started = time.time()
        await asyncio.gather(*(send_all(i) for i in range(producers)))
        return acked, started, time.time()


def _settle(broker: BrokerProcess, wal_dir: Path) -> tuple[list[int], float]:
    """Waits until every sealed segment (all local segments but the newest) is uploaded and
    the local listing has stopped changing for 3 s (retention done); returns that listing and
    the wall time the uploads were complete."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    uploaded_at = None
    stable: tuple[list[int], float] | None = None
    while time.monotonic() < deadline:
        bases = _local_bases(wal_dir)
        uploads = _uploads(broker)
        covered = max((end for _, _, end, _, _ in uploads), default=0)
        if bases and covered >= bases[-1]:
            uploaded_at = uploaded_at or time.time()
            if stable is None or stable[0] != bases:
                stable = (bases, time.monotonic())
            elif time.monotonic() - stable[1] >= 3.0:
                return bases, uploaded_at
        time.sleep(0.2)
    raise BenchFailure(
        f"uploads or pruning did not settle in {SETTLE_TIMEOUT_S:.0f} s: local segments "
        f"{_local_bases(wal_dir)}, uploaded up to "
        f"{max((e for _, _, e, _, _ in _uploads(broker)), default=0)}"
    )


async def _replay(
    url: str, topic: str, expected: int, ack_concurrency: int
) -> tuple[list[tuple[int, float, int, int]], float]:
    """Reads the topic from the earliest offset, acking each message (at most
    `ack_concurrency` acks in flight, so the one-RPC-per-ack round trip does not serialise
    delivery); returns (offset, receipt perf_counter, producer, sequence) per message and the
    perf_counter just before subscribing."""
    received: list[tuple[int, float, int, int]] = []
    acks = asyncio.Semaphore(ack_concurrency)
    pending: set[asyncio.Task[None]] = set()
    ack_errors: list[str] = []
    async with DanubeClient(url) as client:
        started = time.perf_counter()
        consumer = await client.consumer(
            topic, "replayer", "history", sub_type=SubType.EXCLUSIVE, start="earliest"
        ).subscribe()

        async def ack(message: object) -> None:
            try:
                await consumer.ack(message)  # type: ignore[arg-type]
            except Exception as error:  # reported after the run, which must finish to show it
                ack_errors.append(repr(error))
            finally:
                acks.release()

        while len(received) < expected:
            try:
                message = await asyncio.wait_for(consumer.receive(), STALL_S)
            except TimeoutError:
                raise BenchFailure(
                    f"replay stalled: nothing received for {STALL_S:.0f} s after "
                    f"{len(received)} of {expected} messages"
                ) from None
            now = time.perf_counter()
            _, producer, sequence = _HEAD.unpack_from(message.payload)
            received.append((message.offset, now, producer, sequence))
            await acks.acquire()
            task = asyncio.create_task(ack(message))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        await consumer.close()
    if ack_errors:
        raise BenchFailure(f"{len(ack_errors)} acks failed: {ack_errors[:3]}")
    return received, started


def _check(received: list[tuple[int, float, int, int]], sent: set[tuple[int, int]]) -> None:
    """Exactly once, in order: offsets 0..N-1 in receipt order, every sent message once, and
    each producer's sequence numbers rising with the offset (its sends were sequential)."""
    offsets = [offset for offset, _, _, _ in received]
    pairs = [(producer, sequence) for _, _, producer, sequence in received]
    problems = []
    if offsets != list(range(len(sent))):
        out_of_order = sum(1 for a, b in itertools.pairwise(offsets) if b != a + 1)
        problems.append(f"offsets are not 0..{len(sent) - 1} in order ({out_of_order} jumps)")
    if len(set(pairs)) != len(pairs):
        problems.append(f"{len(pairs) - len(set(pairs))} duplicates")
    if set(pairs) != sent:
        problems.append(f"{len(sent - set(pairs))} missing, {len(set(pairs) - sent)} unknown")
    last: dict[int, int] = {}
    for producer, sequence in pairs:
        if sequence <= last.get(producer, -1):
            problems.append(f"producer {producer} out of order at sequence {sequence}")
            break
        last[producer] = sequence
    if problems:
        raise BenchFailure("delivery check failed: " + "; ".join(problems))


def _gap_stats(times: list[float]) -> dict[str, float | None]:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if not gaps:
        return {"mean_ms": None, "median_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "mean_ms": round(1000 * statistics.fmean(gaps), 3),
        "median_ms": round(1000 * statistics.median(gaps), 3),
        "p99_ms": round(1000 * _percentile(gaps, 0.99), 3),
        "max_ms": round(1000 * max(gaps), 3),
    }


def _rate(count: float, seconds: float) -> float | None:
    return round(count / seconds, 2) if seconds > 0 else None


def _upload_report(
    uploads: list[tuple[float, int, int, int, float]],
    ack_of_offset: list[float],
    published: tuple[float, float],
) -> dict[str, object]:
    if not uploads:
        return {"segments": 0}
    sizes = sum(size for _, _, _, size, _ in uploads)
    busy = sum(seconds for _, _, _, _, seconds in uploads)
    first_start = min(stamp - seconds for stamp, _, _, _, seconds in uploads)
    last_end = max(stamp for stamp, _, _, _, _ in uploads)
    wall = last_end - first_start
    lags = [stamp - ack_of_offset[end - 1] for stamp, _, end, _, _ in uploads]
    per_upload = [seconds for _, _, _, _, seconds in uploads]
    return {
        "segments": len(uploads),
        "bytes": sizes,
        "mean_segment_bytes": round(sizes / len(uploads)),
        "sum_upload_seconds": round(busy, 3),
        "mb_per_s_busy": _rate(sizes / 1e6, busy),
        "segments_per_s_busy": _rate(len(uploads), busy),
        "upload_seconds_p50": round(statistics.median(per_upload), 3),
        "upload_seconds_max": round(max(per_upload), 3),
        "wall_first_start_to_last_end_s": round(wall, 3),
        "mb_per_s_wall": _rate(sizes / 1e6, wall),
        "segments_per_s_wall": _rate(len(uploads), wall),
        "lag_after_last_ack_ms_p50": round(1000 * statistics.median(lags), 1),
        "lag_after_last_ack_ms_max": round(1000 * max(lags), 1),
        "uploads_after_publishing_ended": sum(1 for u in uploads if u[0] > published[1]),
        "last_upload_end_minus_publish_end_s": round(last_end - published[1], 3),
    }


def _replay_report(
    received: list[tuple[int, float, int, int]],
    started: float,
    first_local: int,
    object_starts: list[int],
    object_bytes: int,
    payload: int,
) -> dict[str, object]:
    times = [at for _, at, _, _ in received]
    whole = times[-1] - started
    served = {
        "messages": len(received),
        "seconds": round(whole, 3),
        "msgs_per_s": _rate(len(received), whole),
        "payload_mb_per_s": _rate(len(received) * payload / 1e6, whole),
        "time_to_first_message_ms": round(1000 * (times[0] - started), 1),
        "gaps": _gap_stats(times),
    }
    report: dict[str, object] = {"whole": served, "first_local_offset": first_local}
    if 0 < first_local <= len(received):
        from_objects = times[first_local - 1] - started
        report["from_objects"] = {
            "messages": first_local,
            "seconds": round(from_objects, 3),
            "msgs_per_s": _rate(first_local, from_objects),
            "payload_mb_per_s": _rate(first_local * payload / 1e6, from_objects),
            "object_mb_per_s": _rate(object_bytes / 1e6, from_objects),
            "gaps": _gap_stats(times[:first_local]),
        }
        boundaries = [times[s] - times[s - 1] for s in object_starts if 0 < s < first_local]
        report["object_boundary_gaps_ms"] = {
            "count": len(boundaries),
            "median": round(1000 * statistics.median(boundaries), 3) if boundaries else None,
            "max": round(1000 * max(boundaries), 3) if boundaries else None,
        }
    if 0 < first_local < len(received):
        local = times[-1] - times[first_local - 1]
        report["from_local_wal"] = {
            "messages": len(received) - first_local,
            "seconds": round(local, 3),
            "msgs_per_s": _rate(len(received) - first_local, local),
            "gaps": _gap_stats(times[first_local:]),
        }
        handoff = times[first_local] - times[first_local - 1]
        median_gap = statistics.median(b - a for a, b in itertools.pairwise(times))
        report["handoff"] = {
            "gap_ms": round(1000 * handoff, 3),
            "median_gap_ms": round(1000 * median_gap, 3),
            "mean_gap_ms": round(1000 * (times[-1] - times[0]) / (len(times) - 1), 3),
            "gap_over_median": round(handoff / median_gap, 1) if median_gap > 0 else None,
        }
    return report


@contextmanager
def _broker(data: Path, config: Path) -> Iterator[BrokerProcess]:
    """The broker; on failure, shows its log's tail."""
    broker = BrokerProcess(data, config_file=config)
    with broker:
        try:
            yield broker
        except BaseException:
            print("--- broker log tail ---", file=sys.stderr)
            print("\n".join(broker.log_lines[-40:]), file=sys.stderr)
            raise


def _run(args: argparse.Namespace, root: Path, endpoint: str, moto_pid: int) -> dict[str, object]:
    name = f"bench-tiered-{time.monotonic_ns()}"
    topic = f"/default/{name}"
    config = root / "broker.yaml"
    config.write_text(_config_yaml(args, endpoint, name))
    data = root / "data"
    wal_dir = data / "wal" / "default" / name
    per_producer = args.messages // args.producers
    total = per_producer * args.producers
    with _broker(data, config) as broker:
        usage = _Usage(broker.pid, moto_pid, endpoint)
        acked, publish_start, publish_end = asyncio.run(
            _publish(broker.url, topic, total, args.producers, args.payload)
        )
        local, uploads_done = _settle(broker, wal_dir)
        publish_usage = usage.report()
        uploads = _uploads(broker)
        first_local = local[0]

        usage = _Usage(broker.pid, moto_pid, endpoint)
        received, started = asyncio.run(_replay(broker.url, topic, total, args.ack_concurrency))
        replay_usage = usage.report()
        local_after = _local_bases(wal_dir)
        _check(received, set(acked))
        trouble = [line for line in broker.log_lines if TROUBLE.search(line)]
        exit_code = broker.stop()
    ack_of_offset = [acked[(producer, sequence)] for _, _, producer, sequence in received]
    object_bytes = sum(size for _, _, end, size, _ in uploads if end <= first_local)
    gets = replay_usage.get("moto_GET", {"requests": 0, "response_mb": 0.0})
    assert isinstance(gets, dict)
    if gets["requests"]:
        # Each object read is one range GET; all of them are for offsets below first_local.
        replay_usage["messages_per_get"] = round(first_local / gets["requests"], 2)
        replay_usage["get_bytes_per_object_byte"] = round(
            gets["response_mb"] * 1e6 / object_bytes, 1
        )
    return {
        "topic": topic,
        "messages": total,
        "publish": {
            "seconds": round(publish_end - publish_start, 3),
            "msgs_per_s": _rate(total, publish_end - publish_start),
            "uploads_complete_after_publishing_s": round(uploads_done - publish_end, 3),
            **publish_usage,
        },
        "upload": _upload_report(uploads, ack_of_offset, (publish_start, publish_end)),
        "local_segments_at_replay": len(local),
        "local_bases_changed_during_replay": local_after != local,
        "replay": {
            **_replay_report(
                received,
                started,
                first_local,
                sorted(first for _, first, _, _, _ in uploads),
                object_bytes,
                args.payload,
            ),
            **replay_usage,
        },
        "check": "exactly once, offsets 0..N-1 in order",
        "broker_warnings": len(trouble),
        "broker_warning_lines": trouble[:5],
        "broker_exit_code": exit_code,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=1024, help="bytes per message")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument(
        "--segment-bytes", type=int, default=1 << 20, help="storage.wal.rotation.max_bytes"
    )
    parser.add_argument(
        "--retention-mb", type=int, default=1, help="storage.local_retention.size_mb"
    )
    parser.add_argument("--durability", choices=("fsync", "flush"), default="fsync")
    parser.add_argument(
        "--max-unacked",
        type=int,
        default=None,
        help="dispatch.max_unacked_messages (default: the broker's)",
    )
    parser.add_argument("--ack-concurrency", type=int, default=64, help="acks in flight")
    parser.add_argument("--max-load", type=float, default=1.0, help="1-minute load to wait for")
    parser.add_argument("--max-wait-s", type=float, default=1200.0, help="0: do not wait")
    args = parser.parse_args()
    if args.payload < _HEAD.size:
        parser.error(f"--payload must be at least {_HEAD.size} bytes")
    result: dict[str, object] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "args": vars(args),
        "load_samples": _wait_for_quiet_machine(args.max_load, args.max_wait_s),
        "load_average_at_start": os.getloadavg(),
    }
    with (
        tempfile.TemporaryDirectory(prefix="danube-tiered-") as temporary,
        _moto_server() as (endpoint, moto),
    ):
        result.update(_run(args, Path(temporary), endpoint, moto.pid))
    result["load_average_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
