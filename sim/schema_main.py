"""`python -m sim --schemas`: the schema run (`sim.schema_run`), for one seed or many.

Exit status 0 when every run kept every invariant, 1 when one did not (its replay command and
the trace before the violation are printed), 2 for bad arguments."""

from __future__ import annotations

import argparse

from sim.schema_run import (
    SCHEMA_PROFILES,
    SchemaFaults,
    SchemaResult,
    SchemaSimulation,
    SchemaWorkload,
    schema_replay_command,
)
from sim.seeds import (
    add_fault_arguments,
    add_run_arguments,
    add_workload_arguments,
    chosen_faults,
    chosen_workload,
    run_seeds,
    violation_lines,
)
from sim.swarm import Draw, Space, draw, either, given_knobs, one_of

KNOB_HELP = {
    "producers": "producers per subject, evolving it at once ",
    "rate": "steps per second of each producer ",
    "evolve": "per step: register the next evolution of the schema ",
    "switch": "per step: write with another known version ",
    "bad": "per message: one that does not fit its topic's schema ",
    "brokers": "brokers whose registries share the store ",
    "rebind": "per 100 ms: an operator changes a topic's validation policy ",
    "batch": "per publish: 2 to 4 messages in one request, judged as one ",
}

SWARM: Space = {
    "producers": one_of(1, 2, 3),
    "brokers": one_of(1, 2, 3),
    "evolve": one_of(0.02, 0.06, 0.15),
    "switch": either((0.02, 0.04, 0.1)),
    "bad": either((0.05, 0.1, 0.3)),
    "rebind": either((0.02, 0.05, 0.1)),
    "batch": either((0.3, 0.6)),
}
"""What `--schemas --swarm` draws per seed, besides turning each fault of the profile on or
off."""


def swarm_draw(
    seed: int, workload: SchemaWorkload, faults: SchemaFaults, pinned: set[str]
) -> Draw[SchemaWorkload, SchemaFaults]:
    return draw("schemas", seed, workload, faults, SWARM, pinned=pinned)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim --schemas",
        description="Deterministic simulation of the schema registry and publish checks: "
        "producers evolving a subject under each compatibility mode through several "
        "brokers sharing one simulated etcd, under faults; fastavro's schema resolution "
        "checks that every mode keeps its promise.",
    )
    add_run_arguments(parser, SCHEMA_PROFILES, 10.0, "producers")
    add_workload_arguments(parser, SchemaWorkload, KNOB_HELP)
    add_fault_arguments(parser, SchemaFaults)
    return parser


def schema_report(
    result: SchemaResult,
    workload: SchemaWorkload,
    faults: SchemaFaults,
    swarm: Draw[SchemaWorkload, SchemaFaults] | None = None,
) -> str:
    speed = result.duration_s / result.wall_s if result.wall_s else 0.0
    shown = ", ".join(f"{kind} {count}" for kind, count in result.registrations.items())
    published = ", ".join(f"{kind} {count}" for kind, count in result.publishes.items())
    lines = [
        f"seed {result.seed}: {'ok' if result.ok else 'VIOLATION'} · {result.events} events, "
        f"{result.duration_s:g} s simulated in {result.wall_s:.2f} s ({speed:.1f}x real "
        f"time) · digest {result.digest[:16]}",
        f"  registrations: {shown or 'none'}",
        f"  publishes: {published or 'none'}; reader promises checked: {result.promises_checked}",
        *(f"  {subject}: {summary}" for subject, summary in result.subjects.items()),
        f"  faults injected: {result.injected.summary()}",
    ]
    if swarm is not None:
        lines.append(swarm.line())
    replay = schema_replay_command(result.seed, result.duration_s, workload, faults)
    lines += violation_lines(result.violations, replay, result.trace_tail)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    workload = chosen_workload(args, SchemaWorkload)
    if workload.producers < 1 or workload.brokers < 1 or workload.rate <= 0:
        raise SystemExit("python -m sim --schemas: error: producers, brokers and rate must be > 0")
    faults = chosen_faults(args, SCHEMA_PROFILES)
    full_trace = args.trace is not None
    pinned = given_knobs(argv, SchemaWorkload, SchemaFaults)
    draws: dict[int, Draw[SchemaWorkload, SchemaFaults]] = {}

    def swarm(seed: int) -> Draw[SchemaWorkload, SchemaFaults]:
        if seed not in draws:
            draws[seed] = swarm_draw(seed, workload, faults, pinned)
        return draws[seed]

    def settings(seed: int) -> tuple[SchemaWorkload, SchemaFaults]:
        return (swarm(seed).workload, swarm(seed).faults) if args.swarm else (workload, faults)

    return run_seeds(
        args,
        lambda seed: SchemaSimulation(seed, *settings(seed), full_trace=full_trace).run(
            args.duration
        ),
        lambda result: schema_report(
            result, *settings(result.seed), swarm(result.seed) if args.swarm else None
        ),
        swarm if args.swarm else None,
    )
