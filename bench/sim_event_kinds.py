"""Events per published message of a cluster run with data planes, by kind (issue 22).

    python -m bench.sim_event_kinds --profile default --seed 1 --duration 30

Counts every event the run schedules by what it runs (the function, or for a broker port's
delayed completion `SimPort._later`, the completion it wraps, with the file effect's type) and
divides by the acknowledged messages. It changes nothing of the run: the digest printed is the
run's own. The column "same instant" counts the events of a kind due at the very microsecond
of an earlier event of that kind: what coalescing the events of one kind at one instant
(deliveries on a link, completions of a disk, timers) could save at most. Why: the speed of
the cluster simulator is set by how many events a message costs
more than by what one event costs (bench/RESULTS.md, issue 22 rounds 6 and 7)."""

from __future__ import annotations

import argparse
import collections
import functools
from collections.abc import Callable
from typing import Any

from sim import world as sim_world
from sim.cluster import ClusterSimulation, ClusterWorkload
from sim.cluster_faults import CLUSTER_PROFILES


def kind(action: Any) -> str:
    while isinstance(action, functools.partial):
        action = action.func
    function = getattr(action, "__func__", action)
    name = getattr(function, "__qualname__", None) or type(action).__qualname__
    if name.endswith("SimPort._later.<locals>.run"):
        inner = action.__closure__[action.__code__.co_freevars.index("action")].cell_contents
        name = "port: " + kind(inner)
        if isinstance(inner, functools.partial) and name.endswith("_file_done"):
            name += f" {type(inner.args[1]).__name__}"
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default", choices=sorted(CLUSTER_PROFILES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    instants: collections.Counter[tuple[int, str]] = collections.Counter()
    schedule = sim_world.World.at

    def at(world: sim_world.World, delay_us: int, action: Callable[[], None]) -> None:
        name = kind(action)
        counts[name] += 1
        instants[world.now + max(delay_us, 0), name] += 1
        schedule(world, delay_us, action)

    sim_world.World.at = at  # type: ignore[method-assign]
    try:
        simulation = ClusterSimulation(
            args.seed, ClusterWorkload(data=True), CLUSTER_PROFILES[args.profile]
        )
        result = simulation.run(args.duration)
    finally:
        sim_world.World.at = schedule  # type: ignore[method-assign]
    acknowledged = max(1, result.data.get("acknowledged", 0))
    same: collections.Counter[str] = collections.Counter()
    for (_, name), count in instants.items():
        same[name] += count - 1
    print(
        f"seed {args.seed} --profile {args.profile}: {result.events} events, "
        f"{result.data.get('acknowledged', 0)} acknowledged, "
        f"{result.events / acknowledged:.2f} events per message, digest {result.digest[:16]}; "
        f"{sum(same.values())} due at the instant of an earlier event of their kind"
    )
    print("   events   /msg  same instant  kind")
    for name, count in counts.most_common(args.top):
        print(f"{count:9d} {count / acknowledged:6.2f} {same[name]:13d}  {name}")


if __name__ == "__main__":
    main()
