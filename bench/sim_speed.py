"""Simulator speed: simulated seconds per wall second and events per second for one broker
with ten clients (five producers at 200 msg/s each, five consumers on one Shared
subscription), no faults. `python -m bench.sim_speed [--duration 20] [--seed 1]`."""

from __future__ import annotations

import argparse

from sim.faults import Faults
from sim.run import Simulation, Workload

WORKLOAD = Workload(producers=5, rate=200.0, subscriptions=("shared",), consumers=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=20.0, help="simulated seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    result = Simulation(args.seed, WORKLOAD, Faults()).run(args.duration)
    assert result.ok, result.violations
    print(f"simulated {result.duration_s:g} s in {result.wall_s:.2f} s wall")
    print(f"speed: {result.duration_s / result.wall_s:.2f} simulated s per wall s")
    print(f"events: {result.events} ({result.events / result.wall_s:,.0f} per wall s)")
    print(f"messages: {result.acknowledged} acknowledged, {result.received} received")


if __name__ == "__main__":
    main()
