"""A broker process under watch: a HealthCheck prober in its own process, its memory before
and after, its log, and a set of acknowledged messages that must read back byte for byte."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from danube.client import ClientSecurity, DanubeClient, DispatchStrategy, SubType
from danube.localcluster.broker_process import BrokerProcess
from tests.hostile.ledger import HEALTH_LIMIT_MS, LEDGER, RSS_GROWTH_LIMIT_MB, BrokerRun
from tests.hostile.watch import rss_kb

WATCHER = Path(__file__).with_name("watch.py")
ACKED_MESSAGES = 24
SETTLE_S = 90.0
"""How long a window's end waits for the prober to finish a call in flight (a stall)."""
SETTLED_CALLS = 2
"""A step starts, and its window ends, once this many HealthChecks in a row were fast."""


@dataclass(frozen=True, slots=True)
class Sample:
    started: float
    latency_ms: float
    outcome: str
    rss_kb: int

    @property
    def failed(self) -> bool:
        """Slow, or not answered OK. A call the prober's stop interrupted (INFLIGHT) fails
        only when it had already waited too long: one cut short within the limit says
        nothing about the broker."""
        if self.latency_ms > HEALTH_LIMIT_MS:
            return True
        return self.outcome not in ("OK", "INFLIGHT")


def acked_payloads(seed: int) -> list[bytes]:
    """Payloads of every length class and byte value, the same in every run."""
    rng = random.Random(seed)
    sizes = [1, 2, 7, 64, 255, 256, 1000, 4096, 65_000]
    sizes += [rng.randrange(1, 3000) for _ in range(ACKED_MESSAGES - len(sizes))]
    return [rng.randbytes(size) for size in sizes]


class WatchedBroker:
    """Starts a broker, stores acknowledged messages, then watches it until `finish`."""

    def __init__(
        self,
        data_dir: Path,
        name: str,
        *,
        extra_args: tuple[str, ...] = (),
        process: BrokerProcess | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        """`process` and `security`: a secured broker (TLS, a token) and how our client, the
        prober and the re-read reach it (issue 25: the suite with authentication on)."""
        self.name = name
        self.process = process or BrokerProcess(data_dir, extra_args=extra_args)
        self.security = security
        self.samples_path = data_dir.parent / f"{name}-health.txt"
        self.topic = f"/default/hostile-acked-{name}"
        self.payloads = acked_payloads(zlib.crc32(name.encode()))
        self.offsets: dict[int, bytes] = {}
        self.run = BrokerRun(name)
        LEDGER.runs[name] = self.run
        self._watcher: subprocess.Popen[bytes] | None = None
        self._reads = 0
        self._watch_from = 0.0
        self._measured: dict[tuple[float, str], list[Sample]] = {}
        self._checkpoints = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> WatchedBroker:
        self.process.start()
        if not self.offsets:
            self.offsets = asyncio.run(asyncio.wait_for(self._store_acknowledged(), 60))
        self.run.rss_before_mb = self.rss_mb()
        self.start_watcher()
        return self

    def _client(self) -> DanubeClient:
        if self.security is None:
            return DanubeClient(self.process.url)
        url = f"https://{self.process.broker_addr}"
        return DanubeClient(url, security=self.security)

    def start_watcher(self) -> None:
        env = dict(os.environ)
        if self.security is not None:
            env["HOSTILE_WATCH_CA"] = self.security.ca_file or ""
            env["HOSTILE_WATCH_TOKEN"] = self.security.token or ""
        self._watcher = subprocess.Popen(
            [
                sys.executable,
                str(WATCHER),
                self.process.broker_addr,
                str(self.process.pid),
                str(self.samples_path),
            ],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        # The first call pays for the prober's connection: the watch starts after it.
        deadline = time.monotonic() + 20
        while not self.samples() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._watch_from = time.time()

    def stop_watcher(self) -> None:
        if self._watcher is not None and self._watcher.poll() is None:
            self._watcher.send_signal(signal.SIGTERM)
            try:
                self._watcher.wait(10)
            except subprocess.TimeoutExpired:
                self._watcher.kill()
                self._watcher.wait(5)
        self._watcher = None

    def close(self) -> None:
        self.stop_watcher()
        self.process.kill()

    @property
    def addr(self) -> str:
        return self.process.broker_addr

    @property
    def admin_addr(self) -> str:
        return self.process.admin_addr

    def rss_mb(self) -> float:
        return rss_kb(self.process.pid) / 1024

    # -- acknowledged data ----------------------------------------------------------------------

    async def _store_acknowledged(self) -> dict[int, bytes]:
        """Publishes reliably and has a subscription acknowledge every message: afterwards the
        broker owes these bytes under these offsets."""
        async with self._client() as client:
            producer = client.producer(
                self.topic, "hostile-seed", dispatch=DispatchStrategy.RELIABLE, batching=None
            )
            await producer.create()
            consumer = client.consumer(
                self.topic, "audit", "hostile-audit", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            await consumer.subscribe()
            for payload in self.payloads:
                await producer.send(payload)
            offsets: dict[int, bytes] = {}
            while len(offsets) < len(self.payloads):
                message = await consumer.receive()
                await consumer.ack(message)
                offsets[message.offset] = message.payload
            await consumer.close()
        assert sorted(offsets.values()) == sorted(self.payloads)
        return offsets

    async def read_acknowledged(self, timeout: float = 30.0) -> dict[int, bytes]:
        """Reads the topic from its first offset on a new subscription."""
        self._reads += 1
        found: dict[int, bytes] = {}
        async with self._client() as client:
            consumer = client.consumer(
                self.topic,
                "audit",
                f"hostile-reread-{self._reads}",
                sub_type=SubType.EXCLUSIVE,
                start="earliest",
            )
            await consumer.subscribe()
            async with asyncio.timeout(timeout):
                while len(found) < len(self.offsets):
                    message = await consumer.receive()
                    await consumer.ack(message)
                    found[message.offset] = message.payload
            await consumer.close()
        return found

    # -- health ---------------------------------------------------------------------------------

    def samples(self) -> list[Sample]:
        """The prober's calls since the watch started (all of them before that)."""
        if not self.samples_path.exists():
            return []
        samples = []
        for line in self.samples_path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and float(parts[0]) >= self._watch_from:
                samples.append(Sample(float(parts[0]), float(parts[1]), parts[2], int(parts[3])))
        return samples

    def mark(self) -> float:
        """The start of a step's window, once the broker answers fast (so what an earlier
        step left behind is not blamed on this one)."""
        self._settle()
        return time.time()

    def _settle(self) -> None:
        """Waits (up to SETTLE_S) until the broker answers fast again, so work an abuse left
        behind (a backlog of reset streams, a check still running) counts against the step
        that caused it rather than the next one."""
        since = time.time()
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            if self._watcher is None or self._watcher.poll() is not None:
                return
            recent = [s for s in self.samples() if s.started >= since]
            if len(recent) >= SETTLED_CALLS and all(
                s.latency_ms <= HEALTH_LIMIT_MS for s in recent[-SETTLED_CALLS:]
            ):
                return
            time.sleep(0.02)

    def window_health(self, started: float, label: str) -> list[Sample]:
        """The HealthCheck calls that overlapped [started, now] and the first one after it,
        once that one has completed (so a stall in progress is measured to its end). Records
        the worst."""
        self._settle()
        ended = time.time()
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            samples = self.samples()
            if any(s.started > ended for s in samples) or (
                self._watcher is None or self._watcher.poll() is not None
            ):
                break
            time.sleep(0.02)
        else:
            samples = self.samples()
        inside = [
            s for s in samples if s.started <= ended and s.started + s.latency_ms / 1000 >= started
        ]
        # A window shorter than the prober's pause may hold no call: the first call after it
        # then says how the broker was left.
        inside += [s for s in samples if s.started > ended][:1]
        worst = max((s.latency_ms for s in inside), default=0.0)
        LEDGER.windows[f"{self.name}: {label}"] = worst
        return inside

    def measure(self, started: float, label: str) -> None:
        """Takes the step's window now, before the step's other assertions, so its stall is
        recorded even when one of them fails first; `assert_healthy_since` then judges it."""
        self._measured[(started, label)] = self.window_health(started, label)

    def assert_healthy_since(self, started: float, label: str) -> None:
        """HealthCheck answered within the limit all through the window, and never failed."""
        inside = self._measured.pop((started, label), None)
        if inside is None:
            inside = self.window_health(started, label)
        assert inside, f"{label}: no HealthCheck completed in the window"
        slow = [s for s in inside if s.failed]
        worst = max(s.latency_ms for s in inside)
        assert not slow, (
            f"{label}: {len(slow)} of {len(inside)} HealthChecks slower than "
            f"{HEALTH_LIMIT_MS:.0f} ms or failed; worst {worst:.0f} ms; outcomes "
            f"{sorted({s.outcome for s in slow})}"
        )

    # -- the final word -------------------------------------------------------------------------

    def finish(self, *, reread: bool = True) -> list[str]:
        """Everything issue 20 demands of a broker after hostile input; returns the failures
        (empty when the broker came through). `reread=False` leaves the acknowledged messages
        to the caller (damaged storage may refuse them, which is then correct)."""
        problems: list[str] = []
        self.run.alive = self.process.alive
        if not self.run.alive:
            assert self.process.process is not None
            problems.append(f"the broker died (exit code {self.process.process.poll()})")
        self.run.rss_after_mb = self.rss_mb()
        if self.run.alive and reread:
            try:
                found = asyncio.run(self.read_acknowledged())
            except Exception as error:  # any failure to read back is the finding itself
                found = {}
                problems.append(f"acknowledged messages unreadable: {type(error).__name__}")
            self.run.acknowledged_intact = found == self.offsets
            if found and found != self.offsets:
                differing = [o for o in self.offsets if found.get(o) != self.offsets[o]]
                problems.append(f"acknowledged messages differ at offsets {differing[:10]}")
        self.stop_watcher()
        samples = self.samples()
        self.run.health_checks = len(samples)
        self.run.worst_health_ms = max((s.latency_ms for s in samples), default=0.0)
        self.run.slow_checks = sum(1 for s in samples if s.failed)
        self.run.rss_peak_mb = max((s.rss_kb for s in samples), default=0) / 1024
        if self.run.slow_checks:
            problems.append(
                f"{self.run.slow_checks} of {len(samples)} HealthChecks over "
                f"{HEALTH_LIMIT_MS:.0f} ms or failed (worst {self.run.worst_health_ms:.0f} ms)"
            )
        growth = self.run.rss_after_mb - self.run.rss_before_mb
        if growth > RSS_GROWTH_LIMIT_MB:
            problems.append(
                f"RSS grew {growth:.0f} MB ({self.run.rss_before_mb:.0f} -> "
                f"{self.run.rss_after_mb:.0f} MB, limit +{RSS_GROWTH_LIMIT_MB:.0f})"
            )
        tracebacks = [line for line in self.process.log_lines if "Traceback" in line]
        self.run.tracebacks = len(tracebacks)
        if tracebacks:
            problems.append(
                f"{len(tracebacks)} tracebacks in the broker log; the first:\n"
                + self._log_around(tracebacks[0])
            )
        return problems

    def _log_around(self, line: str, after: int = 60) -> str:
        """The broker's log from `line` on (a traceback and what it says), for the report:
        the broker's temporary directory is gone by the time anyone reads a CI log."""
        lines = self.process.log_lines
        start = lines.index(line)
        return "\n".join(lines[max(0, start - 3) : start + after])

    def checkpoint(self) -> list[str]:
        """`finish` for a broker shared by several modules (the secured one): judges what
        the broker went through so far, then watches it again, from its memory now, for the
        next module."""
        problems = self.finish()
        if self.process.alive:
            self._checkpoints += 1
            self.run = BrokerRun(f"{self.name} ({self._checkpoints + 1})")
            LEDGER.runs[self.run.name] = self.run
            self.run.rss_before_mb = self.rss_mb()
            self.start_watcher()
        return problems
