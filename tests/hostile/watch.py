"""HealthCheck prober, run as its own process so its timings do not share a GIL with the
fuzzing client: every `interval` seconds it calls HealthCheck on a connection of its own and
appends `start_wall_s latency_ms outcome rss_kb` to a file (flushed per line), where the
suite reads the worst stall of any time window. SIGTERM ends it; a call still in flight then
is written with the time it has waited so far (outcome INFLIGHT), so a stall that outlasts
the suite is still counted.

Usage: python watch.py HOST:PORT BROKER_PID OUT_FILE [INTERVAL_S]
A secured broker: HOSTILE_WATCH_CA (a CA file: TLS) and HOSTILE_WATCH_TOKEN (a bearer token).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
import time
from pathlib import Path

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from danube.proto import danube as pb

CALL_TIMEOUT_S = 120.0


def rss_kb(pid: int) -> int:
    """VmRSS of `pid` in KiB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _channel(host: str, port: int) -> Channel:
    ca = os.environ.get("HOSTILE_WATCH_CA")
    if not ca:
        return Channel(host, port)
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    return Channel(host, port, ssl=context)


async def probe(host: str, port: int, pid: int, out_path: Path, interval: float) -> None:
    token = os.environ.get("HOSTILE_WATCH_TOKEN")
    metadata = {"authorization": f"Bearer {token}"} if token else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    stopping = asyncio.create_task(stop.wait())
    channel = _channel(host, port)
    request = pb.HealthCheckRequest(request_id=1, client=pb.HealthCheckRequestClientType.Producer)
    with out_path.open("a") as out:
        while not stop.is_set():
            stub = pb.HealthCheckStub(channel)
            started_wall, started = time.time(), time.perf_counter()
            call = asyncio.create_task(
                stub.health_check(request, timeout=CALL_TIMEOUT_S, metadata=metadata)
            )
            await asyncio.wait({call, stopping}, return_when=asyncio.FIRST_COMPLETED)
            elapsed_ms = (time.perf_counter() - started) * 1000
            if not call.done():
                call.cancel()
                outcome = "INFLIGHT"
            else:
                try:
                    call.result()
                    outcome = "OK"
                except GRPCError as error:
                    outcome = error.status.name
                except TimeoutError:
                    outcome = "TIMEOUT"
                except (StreamTerminatedError, ConnectionError, OSError):
                    outcome = "DROPPED"
                    channel.close()
                    channel = _channel(host, port)
            out.write(f"{started_wall:.6f} {elapsed_ms:.3f} {outcome} {rss_kb(pid)}\n")
            out.flush()
            if outcome == "INFLIGHT":
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
    channel.close()


def main() -> None:
    address, pid, out_file = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.02
    host, _, port = address.rpartition(":")
    asyncio.run(probe(host, int(port), pid, out_file, interval))


if __name__ == "__main__":
    main()
