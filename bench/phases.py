"""Measuring one benchmark phase, the same way for every system (`bench.peer_workloads`,
`bench.danube_workloads`): progress lines, CPU shares, open-loop timing, latency percentiles."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bench.workload import SystemResult, percentile

T = TypeVar("T")

DONE_TIMEOUT_S = 60.0
REPORT_EVERY_S = 5.0


class Ticker:
    """Reports a long phase's count every few seconds, so a user sees the run is alive."""

    def __init__(self, progress: Callable[[str], None], label: str, total: int) -> None:
        self._progress = progress
        self._label = label
        self._total = total
        self._last = time.perf_counter()

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if now - self._last >= REPORT_EVERY_S:
            self._last = now
            self._progress(f"{self._label}: {done:,} of {self._total:,}")


class Stopwatch:
    """Times one phase and the CPU this process and the server spent in it: on two vCPUs a
    throughput is often what the Python client can do, and the notes should say so."""

    def __init__(self, server_pid: int) -> None:
        self._server_pid = server_pid
        self._server_cpu = cpu_seconds(server_pid)
        self._own_cpu = time.process_time()
        self._started = time.perf_counter()
        self.elapsed = 0.0

    def stop(self) -> Stopwatch:
        self.elapsed = time.perf_counter() - self._started
        self._own_cpu = time.process_time() - self._own_cpu
        self._server_cpu = cpu_seconds(self._server_pid) - self._server_cpu
        return self

    def note(self, phase: str) -> str:
        return (
            f"{phase}: this Python process used {self._own_cpu / self.elapsed:.0%} of a core, "
            f"the server {self._server_cpu / self.elapsed:.0%}"
        )


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # utime and stime, fields 14 and 15 of proc(5), counted after the parenthesised name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def within(awaitable: Awaitable[T], what: str) -> T:
    try:
        return await asyncio.wait_for(awaitable, DONE_TIMEOUT_S)
    except TimeoutError:
        raise RuntimeError(f"{what} did not finish within {DONE_TIMEOUT_S:.0f} s") from None


async def until(due: float) -> None:
    """Sleeps until `due` (perf_counter time): open-loop sends start on schedule."""
    delay = due - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def stamped_index(payload: bytes) -> int:
    """The message number the latency phase writes into a payload's first 8 bytes."""
    return int.from_bytes(payload[:8], "little")


def record_latencies(
    result: SystemResult, sent: list[float], acked: list[float], received: dict[int, float]
) -> None:
    """p50 and p99 of publish-ack latency (`acked`) and of end to end (message i sent at
    `sent[i]`, received at `received[i]`), in ms."""
    end_to_end = [received[index] - at for index, at in enumerate(sent)]
    result.ack_p50_ms = percentile(acked, 0.5) * 1000
    result.ack_p99_ms = percentile(acked, 0.99) * 1000
    result.e2e_p50_ms = percentile(end_to_end, 0.5) * 1000
    result.e2e_p99_ms = percentile(end_to_end, 0.99) * 1000
