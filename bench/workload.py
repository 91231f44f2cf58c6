"""The workloads the peer benchmark runs against every system, and what each run reports.

Every system gets the same `Workload` in the same harness run (`python -m bench.peers_run`),
so their numbers can be put side by side; each result says how durable that system was while
it was measured, because throughput without the durability setting means nothing."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Workload:
    message_bytes: int = 1024
    publish_messages: int = 200_000
    """Durable publish throughput: messages one producer sends as fast as acks allow."""
    latency_rate: int = 1000
    """Offered rate (messages/s, open loop) of the latency phase."""
    latency_messages: int = 10_000
    consume_messages: int = 200_000
    """Consume throughput: messages published first, then read back by one consumer."""
    idle_topics: int = 10_000
    """Memory phase: this many topics (streams, keys), created and left idle."""


@dataclass(slots=True)
class SystemResult:
    system: str
    """Name and version, e.g. `NATS JetStream 2.9.10`."""
    durability: str
    """When the system acknowledges a publish, in words: `fsync before ack`, ..."""
    publish_per_s: float | None = None
    ack_p50_ms: float | None = None
    ack_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    latency_achieved_per_s: float | None = None
    consume_per_s: float | None = None
    idle_rss_mib: float | None = None
    """Server resident memory with `Workload.idle_topics` idle topics."""
    base_rss_mib: float | None = None
    """Server resident memory right after start, before any topic."""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0 < q < 1) by the inclusive method; samples must not be empty."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=1000, method="inclusive")[round(q * 1000) - 1]


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux), MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
