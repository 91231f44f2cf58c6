"""What `python -m sim`, `--cluster` and `--schemas` share: the arguments that choose seeds,
workload and output, the loop over seeds with its progress bar, the end of a failing run's
report with its replay command, the exit status, and the methods of their results."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping
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


def run_seeds(
    args: argparse.Namespace,
    run: Callable[[int], SeedResult],
    report: Callable[[Any], str],
    swarm: Callable[[int], Draw[Any, Any]] | None = None,
) -> int:
    """Runs `args.seeds` seeds from `args.seed`: JSON lines with `--json`, else the report of
    a single seed or of each failing one, and a progress bar on stderr. Exit status 1 when any
    seed failed. `swarm`: each seed's draw (`--swarm`), added to its JSON summary and counted
    for the closing line (which features the failing seeds had on)."""
    failures = 0
    started = time.perf_counter()
    tally = Tally()
    for seed in range(args.seed, args.seed + args.seeds):
        result = run(seed)
        if args.trace is not None and result.trace is not None:
            args.trace.write_text("\n".join(result.trace) + "\n")
        failures += not result.ok
        if swarm is not None:
            tally.add(swarm(seed), result.ok)
        if args.json:
            summary = result.summary()
            if swarm is not None:
                summary["swarm"] = swarm(seed).summary()
            print(json.dumps(summary, sort_keys=True))
        elif args.seeds == 1 or not result.ok:
            print(report(result))
        else:
            done = seed - args.seed + 1
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
