"""What `python -m sim`, `--cluster` and `--schemas` share: the arguments that choose seeds,
workload and output, the loop over seeds with its progress bar, the end of a failing run's
report with its replay command, the exit status, and the methods of their results."""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sim.swarm import Draw, Tally

T = TypeVar("T")


class SeedResult(Protocol):
    @property
    def ok(self) -> bool: ...

    @property
    def trace(self) -> list[str] | None: ...

    def summary(self) -> dict[str, Any]: ...


class ResultMethods:
    """`ok` and `summary` of a result dataclass with `violations`, `injected`, `trace_tail`
    and `trace` fields (a mixin: it adds no fields)."""

    __slots__ = ()
    violations: list[Any]
    injected: Any

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> dict[str, Any]:
        data = asdict(self)  # type: ignore[call-overload]
        data.pop("trace_tail")
        data.pop("trace")
        data["injected"] = dict(self.injected)
        data["violations"] = [asdict(v) for v in self.violations]
        return data


def changed_flags(chosen: Any, base: Any, skip: Iterable[str] = ()) -> list[str]:
    """The command-line flags that turn dataclass `base` into `chosen`, for a replay command:
    `--no-x` for a switched-off boolean, comma-joined tuples."""
    flags = []
    for item in dataclasses.fields(chosen):
        value = getattr(chosen, item.name)
        if item.name in skip or value == getattr(base, item.name):
            continue
        flag = item.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        elif isinstance(value, tuple):
            flags.append(f"--{flag} {','.join(value)}")
        else:
            flags.append(f"--{flag} {value}")
    return flags


def violation_lines(violations: list[Any], replay: str, trace_tail: list[str]) -> list[str]:
    """The end of a failing run's report: each violation, the replay command, the trace."""
    lines = [f"  VIOLATION of invariant {v.invariant}: {v.detail}" for v in violations]
    if violations:
        lines.append(f"  replay: {replay}")
        lines.append("  trace before the violation:")
        lines.extend(f"    {line}" for line in trace_tail[-40:])
    return lines


def add_run_arguments(
    parser: argparse.ArgumentParser, profiles: Iterable[str], duration_s: float, what: str
) -> None:
    """--seed, --seeds, --duration (simulated seconds of `what`), --profile, --trace, --json."""
    parser.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds to run (default 1)")
    parser.add_argument(
        "--duration", type=float, default=duration_s,
        help=f"simulated seconds of {what} (default {duration_s:g})",
    )  # fmt: skip
    parser.add_argument(
        "--profile", choices=sorted(profiles), default="default",
        help="fault probabilities to start from (default: default); knobs below override",
    )  # fmt: skip
    parser.add_argument("--trace", type=Path, help="write the whole trace of the run here")
    parser.add_argument("--json", action="store_true", help="print one JSON summary per run")
    parser.add_argument(
        "--jobs", type=int, default=None,
        help="worker processes for a multi-seed run (default: one per CPU this process may "
        "use); each seed's outcome is the same whatever the number, reports stay in seed order",
    )  # fmt: skip
    parser.add_argument(
        "--swarm", action="store_true",
        help="swarm testing: each seed also draws, from its own RNG, which of the profile's "
        "faults are on (each half the time, at the profile's probability or half or twice "
        "it) and the workload's features; knobs given on the command line are kept. The "
        "report says what was on and its replay command spells it out (sim/README.md)",
    )  # fmt: skip


def add_workload_arguments(
    parser: argparse.ArgumentParser, workload: type[Any], helps: Mapping[str, str]
) -> None:
    """One `--<knob>` per field of the workload dataclass (`--no-<knob>` for a boolean), with
    its default; `helps` says what a knob means, ending in a space."""
    group = parser.add_argument_group("workload")
    defaults = workload()
    for item in dataclasses.fields(workload):
        value = getattr(defaults, item.name)
        flag = f"--{item.name.replace('_', '-')}"
        what = helps.get(item.name, "")
        if isinstance(value, bool):
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=value,
                help=f"{what}(default {'on' if value else 'off'})",
            )  # fmt: skip
        else:
            group.add_argument(
                flag, type=type(value), default=value, help=f"{what}(default {value})"
            )


def chosen_workload(args: argparse.Namespace, workload: type[T]) -> T:
    """The workload `add_workload_arguments` read."""
    names = [item.name for item in dataclasses.fields(workload)]  # type: ignore[arg-type]
    return workload(**{name: getattr(args, name) for name in names})


def add_fault_arguments(parser: argparse.ArgumentParser, faults: type[Any]) -> None:
    """One `--<knob>` per field of the fault dataclass; unset knobs keep the profile's."""
    group = parser.add_argument_group("faults (probabilities per opportunity; see sim/README.md)")
    for item in dataclasses.fields(faults):
        group.add_argument(
            f"--{item.name.replace('_', '-')}", type=type(getattr(faults(), item.name)),
            default=None,
        )  # fmt: skip


def chosen_faults(args: argparse.Namespace, profiles: Mapping[str, T]) -> T:
    """The `--profile`, with every knob given on the command line in its place."""
    chosen = profiles[args.profile]
    overrides = {
        item.name: getattr(args, item.name)
        for item in dataclasses.fields(chosen)  # type: ignore[arg-type]
        if getattr(args, item.name) is not None
    }
    return dataclasses.replace(chosen, **overrides)  # type: ignore[type-var]


@dataclasses.dataclass(frozen=True, slots=True)
class SeedOutcome:
    """What the seed loop needs of one seed's run, in plain data, so that a worker process can
    hand it back: whether it kept every invariant, its JSON summary (`--json`), its report
    (a single seed or a failing one) and its whole trace (`--trace`)."""

    seed: int
    ok: bool
    summary: dict[str, Any] | None
    report: str | None
    trace: list[str] | None


_OUTCOME: Callable[[int], SeedOutcome] | None = None
"""The running loop's `outcome` function, which forked workers inherit: it is a closure over
the parsed arguments, which cannot be pickled to a worker, but a fork copies it."""


def _outcome_in_worker(seed: int) -> SeedOutcome:
    assert _OUTCOME is not None
    return _OUTCOME(seed)


def _outcomes(
    seeds: range, outcome: Callable[[int], SeedOutcome], jobs: int
) -> Iterator[SeedOutcome]:
    """Each seed's outcome, in seed order, from `jobs` forked workers (each seed is its own
    deterministic world, so the outcomes are the same whatever `jobs` is: only the wall time
    changes)."""
    if jobs <= 1 or len(seeds) <= 1:
        yield from map(outcome, seeds)
        return
    global _OUTCOME
    _OUTCOME = outcome
    context = multiprocessing.get_context("fork")
    try:
        with context.Pool(min(jobs, len(seeds))) as pool:
            yield from pool.imap(_outcome_in_worker, seeds, chunksize=1)
    finally:
        _OUTCOME = None


def default_jobs() -> int:
    """Worker processes for a multi-seed run when `--jobs` is not given: the CPUs this
    process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_seeds(
    args: argparse.Namespace,
    run: Callable[[int], SeedResult],
    report: Callable[[Any], str],
    swarm: Callable[[int], Draw[Any, Any]] | None = None,
) -> int:
    """Runs `args.seeds` seeds from `args.seed` in `args.jobs` worker processes: JSON lines
    with `--json`, else the report of a single seed or of each failing one, in seed order,
    and a progress bar on stderr. Exit status 1 when any seed failed. `swarm`: each seed's
    draw (`--swarm`), added to its JSON summary and counted for the closing line (which
    features the failing seeds had on)."""
    failures = 0
    started = time.perf_counter()
    tally = Tally()

    def outcome(seed: int) -> SeedOutcome:
        result = run(seed)
        summary = None
        if args.json:
            summary = result.summary()
            if swarm is not None:
                summary["swarm"] = swarm(seed).summary()
        shown = args.seeds == 1 or not result.ok
        return SeedOutcome(
            seed, result.ok, summary, report(result) if shown and not args.json else None,
            result.trace if args.trace is not None else None,
        )  # fmt: skip

    jobs = args.jobs if getattr(args, "jobs", None) is not None else default_jobs()
    seeds = range(args.seed, args.seed + args.seeds)
    for done, result in enumerate(_outcomes(seeds, outcome, jobs), start=1):
        if args.trace is not None and result.trace is not None:
            args.trace.write_text("\n".join(result.trace) + "\n")
        failures += not result.ok
        if swarm is not None:
            tally.add(swarm(result.seed), result.ok)
        if result.summary is not None:
            print(json.dumps(result.summary, sort_keys=True))
        elif result.report is not None:
            print(result.report, flush=True)
        else:
            filled = 30 * done // args.seeds
            print(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{args.seeds} seeds, "
                f"{failures} failing, {time.perf_counter() - started:.0f} s",
                end="", file=sys.stderr, flush=True,
            )  # fmt: skip
    if args.seeds > 1:
        print(f"\n{args.seeds} seeds, {failures} failing", file=sys.stderr)
        if swarm is not None:
            print(tally.line(), file=sys.stderr)
    return 1 if failures else 0
