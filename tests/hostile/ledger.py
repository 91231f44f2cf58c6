"""What the hostile suite saw, for its assertions and its report: every input's outcome by
category, the worst HealthCheck stall and the broker's memory per broker run."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

UNCLEAN = frozenset({"INTERNAL", "UNKNOWN", "DROPPED", "TIMEOUT"})
"""Outcomes that are no clean refusal: a server error, a connection dropped instead of a
status, or no answer at all to a unary call within its deadline."""


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


HEALTH_LIMIT_MS = env_float("HOSTILE_HEALTH_MS", 100.0)
"""Every HealthCheck must be answered within this (issue 20, deliver 8)."""
RSS_GROWTH_LIMIT_MB = env_float("HOSTILE_RSS_MB", 200.0)
"""How much the broker's resident memory may grow over one broker run."""


@dataclass
class Offender:
    category: str
    method: str
    outcome: str
    size: int
    head: str
    """The input's first 48 bytes in hex, enough to reproduce a crafted case by hand."""

    def __str__(self) -> str:
        return f"{self.category} {self.method} -> {self.outcome} ({self.size} B: {self.head})"


@dataclass
class BrokerRun:
    """One broker process's health over its part of the suite."""

    name: str
    worst_health_ms: float = 0.0
    slow_checks: int = 0
    health_checks: int = 0
    rss_before_mb: float = 0.0
    rss_after_mb: float = 0.0
    rss_peak_mb: float = 0.0
    tracebacks: int = 0
    alive: bool = True
    acknowledged_intact: bool | None = None
    acknowledged_outcome: str | None = None
    """How acknowledged data came through when not simply intact (e.g. the damaged topic
    refused with its corruption error): printed instead of "intact False"."""


@dataclass
class Ledger:
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    offenders: list[Offender] = field(default_factory=list)
    runs: dict[str, BrokerRun] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Findings that are no status: an OK that should have been a refusal."""
    windows: dict[str, float] = field(default_factory=dict)
    """The worst HealthCheck latency (ms) seen during each named step of the suite."""

    def record(self, category: str, method: str, outcome: str, data: bytes = b"") -> None:
        self.outcomes.setdefault(category, Counter())[outcome] += 1
        if outcome in UNCLEAN:
            self.offenders.append(Offender(category, method, outcome, len(data), data[:48].hex()))

    def offenders_in(self, category: str, method: str | None = None) -> list[Offender]:
        return [
            o
            for o in self.offenders
            if o.category == category and (method is None or o.method == method)
        ]

    def inputs_tried(self) -> int:
        return sum(sum(c.values()) for c in self.outcomes.values())

    def statuses(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.outcomes.values():
            total.update(counts)
        return total

    def report(self) -> dict[str, object]:
        runs = list(self.runs.values())
        return {
            "inputs_tried": self.inputs_tried(),
            "worst_health_ms": max((r.worst_health_ms for r in runs), default=0.0),
            "health_checks": sum(r.health_checks for r in runs),
            "slow_health_checks": sum(r.slow_checks for r in runs),
            "health_limit_ms": HEALTH_LIMIT_MS,
            "statuses": dict(sorted(self.statuses().items())),
            "by_category": {k: dict(sorted(v.items())) for k, v in sorted(self.outcomes.items())},
            "unclean": len(self.offenders),
            "offenders": [str(o) for o in self.offenders[:400]],
            "notes": self.notes,
            "worst_health_ms_by_step": [
                [step, round(ms, 1)]
                for step, ms in sorted(self.windows.items(), key=lambda kv: -kv[1])[:25]
            ],
            "brokers": [vars(r) for r in runs],
        }

    def summary_lines(self) -> list[str]:
        report = self.report()
        lines = [
            f"inputs tried: {report['inputs_tried']}; HealthCheck calls: "
            f"{report['health_checks']}, worst {report['worst_health_ms']:.1f} ms, "
            f"{report['slow_health_checks']} over {HEALTH_LIMIT_MS:.0f} ms",
            f"statuses: {report['statuses']}",
            f"unclean outcomes: {report['unclean']}",
        ]
        for run in self.runs.values():
            lines.append(
                f"broker {run.name}: RSS {run.rss_before_mb:.0f} -> {run.rss_after_mb:.0f} MB "
                f"(peak {run.rss_peak_mb:.0f}), worst HealthCheck {run.worst_health_ms:.1f} ms, "
                f"tracebacks {run.tracebacks}, alive {run.alive}, "
                + (
                    f"acknowledged {run.acknowledged_outcome}"
                    if run.acknowledged_outcome
                    else f"acknowledged intact {run.acknowledged_intact}"
                )
            )
        worst = report["worst_health_ms_by_step"]
        assert isinstance(worst, list)
        for step, ms in worst[:10]:
            lines.append(f"  worst HealthCheck during {step}: {ms:.1f} ms")
        lines += [f"  {note}" for note in self.notes]
        return lines

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.report(), indent=2, sort_keys=True) + "\n")


LEDGER = Ledger()
"""One ledger for the whole pytest session (the suite's report covers every module)."""
