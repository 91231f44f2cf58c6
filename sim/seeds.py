"""Running many seeds from the command line: one loop for `python -m sim` and
`python -m sim --cluster`, with the progress bar, the reports of failing seeds and the exit
status they share."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol


class SeedResult(Protocol):
    @property
    def ok(self) -> bool: ...

    @property
    def trace(self) -> list[str] | None: ...

    def summary(self) -> dict[str, Any]: ...


def run_seeds(
    args: argparse.Namespace,
    run: Callable[[int], SeedResult],
    report: Callable[[Any], str],
) -> int:
    """Runs `args.seeds` seeds from `args.seed`: JSON lines with `--json`, else the report of
    a single seed or of each failing one, and a progress bar on stderr. Exit status 1 when any
    seed failed."""
    failures = 0
    started = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        result = run(seed)
        if args.trace is not None and result.trace is not None:
            args.trace.write_text("\n".join(result.trace) + "\n")
        failures += not result.ok
        if args.json:
            print(json.dumps(result.summary(), sort_keys=True))
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
    return 1 if failures else 0
