"""What one piece of schema work may cost: parsing, comparing two schemas, validating a
payload. The algorithms pay for every step they take from a `Budget`; when it runs out they
stop with `LimitExceeded`, which names the limit, so a client's hostile schema or payload is
refused with RESOURCE_EXHAUSTED instead of running for minutes.

Steps are counted, not timed, so the same input gets the same answer on every machine and in
the simulator. The broker adds two things pure code cannot have: a CPU clock (the thread's
own CPU time, a second line of defence for work a step does not see, such as a regular
expression) and a cancel flag, which a graceful stop sets so that a check running in a
worker thread ends at its next step instead of keeping the broker alive."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

from danube.machines.schema.limits import PATTERN_SECONDS, SCHEMA_WORK_CPU_SECONDS

CHECK_EVERY = 1024
"""Steps between looks at the cancel flag and the CPU clock (both cost more than a step)."""


class CancelFlag(Protocol):
    """What a budget looks at to learn that its caller gave up (a `threading.Event` in the
    broker); a protocol, so this module stays pure."""

    def is_set(self) -> bool: ...


class LimitExceeded(Exception):
    """The work would pass one of its limits. `limit` names it as the spec's Limits section
    does (e.g. `compatibility steps`), `detail` says what was being done and the bound."""

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(f"{detail} (limit: {limit})")
        self.limit = limit
        self.detail = detail


class WorkCancelled(Exception):
    """The caller stopped waiting (the broker is stopping): the work ends at its next step."""


@dataclass(slots=True)
class Budget:
    """Steps (and optionally CPU seconds) one piece of work may spend. `what` names the work
    and `limit` the budget in errors. A budget is used by one thread at a time."""

    steps: int
    what: str
    limit: str
    cpu_seconds: float | None = None
    clock: Callable[[], float] | None = None
    """The calling thread's CPU time (`time.thread_time`); None (pure code): steps only."""
    cancel: CancelFlag | None = None
    pattern_seconds: float = PATTERN_SECONDS
    """How long one regular-expression search may take (`danube.machines.schema.patterns`)."""
    work_deadline: float | None = None
    """On `clock`: when the whole piece of work this budget is part of (one request's
    comparisons with every version, say) has used its CPU time (`Runtime.work_cpu_seconds`)."""
    work_cpu_seconds: float = SCHEMA_WORK_CPU_SECONDS
    spent: int = 0
    _check_at: int = CHECK_EVERY
    _cpu_start: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.clock is not None:
            self._cpu_start = self.clock()

    def spend(self, count: int = 1) -> None:
        self.spent += count
        if self.spent > self.steps:
            raise LimitExceeded(self.limit, f"the {self.what} needs more than {self.steps:,} steps")
        if self.spent >= self._check_at:
            self._check_at = self.spent + CHECK_EVERY
            self.check()

    def check(self) -> None:
        """The cancel flag and the CPU clock, without spending a step."""
        if self.cancel is not None and self.cancel.is_set():
            raise WorkCancelled(f"the {self.what} was cancelled")
        if self.clock is not None and self.cpu_seconds is not None:
            assert self._cpu_start is not None
            used = self.clock() - self._cpu_start
            if used > self.cpu_seconds:
                raise LimitExceeded(
                    "schema CPU seconds",
                    f"the {self.what} used more than {self.cpu_seconds:g} s of CPU time",
                )
        deadline = self.work_deadline
        if self.clock is not None and deadline is not None and self.clock() > deadline:
            raise LimitExceeded(
                "schema CPU seconds",
                f"the schema work of one request used more than {self.work_cpu_seconds:g} s "
                "of CPU time",
            )

    def remaining_seconds(self, default: float) -> float:
        """CPU seconds left, for work that is timed rather than counted (a regex search),
        capped at `default`."""
        if self.clock is None or self.cpu_seconds is None or self._cpu_start is None:
            return default
        return max(0.001, min(default, self.cpu_seconds - (self.clock() - self._cpu_start)))


_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "danube_schema_budget", default=None
)


def current() -> Budget | None:
    """The budget of the work running in this context, for code called back from a library
    (jsonschema's keyword functions) that cannot be handed one."""
    return _CURRENT.get()


@contextmanager
def using(budget: Budget) -> Iterator[Budget]:
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the broker lends pure schema code: a CPU clock for budgets and a cancel flag.
    The simulator and the unit tests use `PURE` (steps only, never cancelled)."""

    clock: Callable[[], float] | None = None
    cancel: CancelFlag | None = None
    work_cpu_seconds: float | None = None
    """CPU time of one piece of work (one `run_with`) across all the budgets it makes."""
    work_started: float | None = None

    def budget(
        self,
        steps: int,
        what: str,
        limit: str,
        cpu_seconds: float | None = None,
        pattern_seconds: float = PATTERN_SECONDS,
    ) -> Budget:
        deadline = None
        if self.work_started is not None and self.work_cpu_seconds is not None:
            deadline = self.work_started + self.work_cpu_seconds
        return Budget(
            steps,
            what,
            limit,
            cpu_seconds,
            self.clock,
            self.cancel,
            pattern_seconds,
            deadline,
            self.work_cpu_seconds or SCHEMA_WORK_CPU_SECONDS,
        )


PURE = Runtime()

_RUNTIME: contextvars.ContextVar[Runtime] = contextvars.ContextVar(
    "danube_schema_runtime", default=PURE
)


def runtime() -> Runtime:
    """The runtime of the work running in this context (`PURE` unless the broker set one)."""
    return _RUNTIME.get()


def run_with(runtime_: Runtime, work: Callable[[], object]) -> object:
    """Runs `work` with `runtime_` in force: the broker's worker threads call this so that
    every budget made inside sees the thread's CPU clock and the caller's cancel flag."""
    if runtime_.clock is not None and runtime_.work_cpu_seconds is not None:
        runtime_ = replace(runtime_, work_started=runtime_.clock())
    token = _RUNTIME.set(runtime_)
    try:
        return work()
    finally:
        _RUNTIME.reset(token)
