"""`python -m sim --cluster`: the cluster control-plane run, for one seed or many.

Exit status 0 when every run kept every invariant, 1 when one did not (its replay command and
the trace before the violation are printed), 2 for bad arguments."""

from __future__ import annotations

import argparse

from sim.cluster import ClusterResult, ClusterSimulation, ClusterWorkload, cluster_replay_command
from sim.cluster_faults import CLUSTER_PROFILES, ClusterFaults
from sim.seeds import (
    add_fault_arguments,
    add_run_arguments,
    add_workload_arguments,
    chosen_faults,
    chosen_workload,
    run_seeds,
    violation_lines,
)
from sim.swarm import Draw, Space, coin, draw, either, given_knobs, one_of

KNOB_HELP = {
    "data": "data planes: ownership, broker cores, object store, producers ",
    "rate": "with --data: messages per second of each topic's producer ",
    "in_flight": "with --data: publishes each producer keeps unanswered at most (its window; "
    "1: one at a time) ",
    "batched": "with --data: chance that a topic's producer publishes on the batched path "
    "(PublishBatch; 0: one SendMessage a publish, nothing drawn) ",
    "batch": "with --batched: most payloads a PublishBatch carries ",
    "replicated": "data planes whose topics are at fsync and replicate to followers "
    "(spec/replication.md; invariants r1, r2) ",
    "admin": "operator's calls (drains, unloads, deletions, policies; invariants i, j, k) ",
    "scratch_topics": "topics the operator creates to delete ",
    "poison": "with --data: topics with a subscription whose consumer nacks the poison "
    "messages, dead-lettered (mostly on another broker) after 3 deliveries (invariant p) ",
    "replication_factor": "with --replicated: the cluster's replication factor "
    "(cluster.replication_factor; 0: the default rule, 2 with two brokers or more) ",
}

SWARM: Space = {
    "brokers": one_of(3, 4, 5),
    "topics": one_of(8, 24, 48),
    "rebalance": coin,
    "admin": either((4, 8, 16), off=0),
    "scratch_topics": one_of(1, 3, 6),
}
"""What `--cluster --swarm` draws per seed (with `--data`, also the producers' rate). Each
fault of the profile is on half the time; `skew` is never raised (below 1 the self-fencing
margin holds, spec/cluster.md)."""
SWARM_DATA: Space = {
    **SWARM,
    "rate": one_of(5.0, 10.0, 20.0),
    "poison": either((2, 4, 8), off=0),
    "in_flight": one_of(1, 2, 4, 8),
    "batched": one_of(0.0, 0.5, 1.0),
}
"""With data planes: the producers' rate, never above the default, the poison workload
(`sim.cluster_poison`) half the time, the producers' window, one at a time included, and the
share of batched producers (each drawn last when added, so it moved none of the other
draws)."""


def swarm_draw(
    seed: int, workload: ClusterWorkload, faults: ClusterFaults, pinned: set[str]
) -> Draw[ClusterWorkload, ClusterFaults]:
    # `--replicated` implies `--data` (`ClusterRun`), so CI's fuzz runs draw the data knobs and
    # the poison workload too.
    space = SWARM_DATA if workload.data or workload.replicated else SWARM
    return draw("cluster", seed, workload, faults, space, pinned=pinned, unscaled=("skew",))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim --cluster",
        description="Deterministic simulation of a cluster under faults: brokers' membership "
        "and load manager against a simulated etcd; with --data also their ownership "
        "machines, broker cores, an object store and producers (invariants g and h).",
    )
    add_run_arguments(parser, CLUSTER_PROFILES, 30.0, "faults")
    add_workload_arguments(parser, ClusterWorkload, KNOB_HELP)
    add_fault_arguments(parser, ClusterFaults)
    return parser


def _settings(args: argparse.Namespace) -> tuple[ClusterWorkload, ClusterFaults]:
    return chosen_workload(args, ClusterWorkload), chosen_faults(args, CLUSTER_PROFILES)


def cluster_report(
    result: ClusterResult,
    workload: ClusterWorkload,
    faults: ClusterFaults,
    swarm: Draw[ClusterWorkload, ClusterFaults] | None = None,
) -> str:
    speed = (result.duration_s + result.settle_s) / result.wall_s if result.wall_s else 0.0
    landed = ", ".join(f"{kind} {count}" for kind, count in result.landed.items()) or "nothing"
    expected = workload.topics + min(workload.poison, workload.topics)  # and dead-letter topics
    lines = [
        f"seed {result.seed}: {'ok' if result.ok else 'VIOLATION'} · {result.events} events, "
        f"{result.duration_s:g} s of faults simulated in {result.wall_s:.2f} s "
        f"({speed:.0f}x real time) · digest {result.digest[:16]}",
        f"  {result.created}/{expected} topics created; settled {result.settled} "
        f"({result.settle_s:.1f} s after the faults stopped)",
        f"  writes that took effect: {landed}",
        f"  faults injected: {result.injected.summary()}",
    ]
    if swarm is not None:
        lines.append(swarm.line())
    if result.data:
        counts = ", ".join(f"{kind} {count}" for kind, count in sorted(result.data.items()))
        lines.insert(3, f"  data plane: {counts}")
    if result.admin:
        answers = ", ".join(f"{kind} {count}" for kind, count in result.admin.items())
        lines.insert(3, f"  operator's calls answered: {answers}")
    replay = cluster_replay_command(result.seed, result.duration_s, workload, faults)
    lines += violation_lines(result.violations, replay, result.trace_tail)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    workload, faults = _settings(args)
    try:
        workload.settings("1")
    except ValueError as error:
        raise SystemExit(f"python -m sim --cluster: error: {error}") from None
    full_trace = args.trace is not None
    pinned = given_knobs(argv, ClusterWorkload, ClusterFaults)
    draws: dict[int, Draw[ClusterWorkload, ClusterFaults]] = {}

    def swarm(seed: int) -> Draw[ClusterWorkload, ClusterFaults]:
        if seed not in draws:
            draws[seed] = swarm_draw(seed, workload, faults, pinned)
        return draws[seed]

    def settings(seed: int) -> tuple[ClusterWorkload, ClusterFaults]:
        return (swarm(seed).workload, swarm(seed).faults) if args.swarm else (workload, faults)

    return run_seeds(
        args,
        lambda seed: ClusterSimulation(seed, *settings(seed), full_trace=full_trace).run(
            args.duration
        ),
        lambda result: cluster_report(
            result, *settings(result.seed), swarm(result.seed) if args.swarm else None
        ),
        swarm if args.swarm else None,
    )
