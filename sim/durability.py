"""`python -m sim.durability`: how many acknowledged messages each durability mode loses
when the machine loses power (spec/durability.md predicts none for `fsync`, some for
`flush`). Every run injects power failures only; the table goes to sim/README.md."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from sim.faults import Faults
from sim.run import Simulation, Workload

POWER_ONLY = Faults(power_failure=0.05)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    durability: str
    seeds: int
    power_failures: int
    acknowledged: int
    lost: int
    runs_losing: int
    violations: int


def measure(durability: str, seeds: int, duration_s: float, first_seed: int = 1) -> Row:
    power = acknowledged = lost = losing = violations = 0
    for seed in range(first_seed, first_seed + seeds):
        # The load before issue 22's sustainable default (100 messages a second a producer),
        # so the table compares with the earlier ones: more unsynced bytes at each failure.
        workload = Workload(
            durability=durability, subscriptions=("exclusive",), consumers=1, rate=100.0
        )
        result = Simulation(seed, workload, POWER_ONLY).run(duration_s)
        power += result.injected["power_failure"]
        acknowledged += result.acknowledged
        run_lost = sum(result.lost.values())
        lost += run_lost
        losing += run_lost > 0
        violations += len(result.violations)
    return Row(durability, seeds, power, acknowledged, lost, losing, violations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.durability", description=__doc__)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--duration", type=float, default=10.0, help="simulated seconds")
    args = parser.parse_args(argv)
    print(
        "| durability | seeds | power failures | acknowledged | acknowledged but lost | "
        "runs losing | violations |"
    )
    print("|---|---|---|---|---|---|---|")
    for durability in ("fsync", "flush"):
        row = measure(durability, args.seeds, args.duration)
        print(
            f"| `{row.durability}` | {row.seeds} | {row.power_failures} | {row.acknowledged} | "
            f"{row.lost} | {row.runs_losing} | {row.violations} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
