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
    load_wall = result.load_wall_s
    print(
        f"load phase: {result.duration_s:g} simulated s in {load_wall:.2f} s wall, "
        f"{result.duration_s / load_wall:.2f} simulated s per wall s, "
        f"{result.load_events} events ({result.load_events / load_wall:,.0f} per wall s)"
    )
    print(
        f"whole run (set-up, load, drain, final restart): {result.wall_s:.2f} s wall, "
        f"{result.events} events"
    )
    print(f"messages: {result.acknowledged} acknowledged, {result.received} received")


if __name__ == "__main__":
    main()
