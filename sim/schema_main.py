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

KNOB_HELP = {
    "producers": "producers per subject, evolving it at once ",
    "rate": "steps per second of each producer ",
    "evolve": "per step: register the next evolution of the schema ",
    "switch": "per step: write with another known version ",
    "bad": "per message: one that does not fit its topic's schema ",
    "brokers": "brokers whose registries share the store ",
    "rebind": "per 100 ms: an operator changes a topic's validation policy ",
}


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


def schema_report(result: SchemaResult, workload: SchemaWorkload, faults: SchemaFaults) -> str:
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
    return run_seeds(
        args,
        lambda seed: SchemaSimulation(seed, workload, faults, full_trace=full_trace).run(
            args.duration
        ),
        lambda result: schema_report(result, workload, faults),
    )
