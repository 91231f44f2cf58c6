"""The schema run (`python -m sim --schemas`, issue 8 point 6): producers switching schema
versions under every compatibility mode keep every invariant, the run is deterministic, and
each planted bug is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

import pytest

from danube.machines.schema.compatibility import CompatibilityMode
from danube.machines.schema.policy import TopicSchemaConfig, ValidationPolicy, Verdict
from danube.metadata.state import MetadataState
from danube.proto import danube as pb
from danube.values.errors import DanubeError, ErrorCode
from sim.schema_checker import SchemaChecker, expected_outcome, promised_readers
from sim.schema_run import (
    SCHEMA_PROFILES,
    SchemaFaults,
    SchemaResult,
    SchemaSimulation,
    SchemaWorkload,
    schema_replay_command,
)
from sim.world import World
from tests.sim.schema_mutations import GATE_MUTATIONS, SCHEMA_MUTATIONS


def run(seed: int, duration_s: float = 3.0, profile: str = "default") -> SchemaResult:
    return SchemaSimulation(seed, SchemaWorkload(), SCHEMA_PROFILES[profile]).run(duration_s)


@pytest.mark.parametrize(
    ("mode", "readers"),
    [
        (CompatibilityMode.NONE, []),
        (CompatibilityMode.BACKWARD, [4]),
        (CompatibilityMode.BACKWARD_TRANSITIVE, [4, 5]),
        (CompatibilityMode.FORWARD, [2]),
        (CompatibilityMode.FORWARD_TRANSITIVE, [1, 2]),
        (CompatibilityMode.FULL, [4, 2]),
        (CompatibilityMode.FULL_TRANSITIVE, [4, 5, 1, 2]),
    ],
)
def test_what_each_mode_promises_a_message_of_version_3(
    mode: CompatibilityMode, readers: list[int]
) -> None:
    assert promised_readers(mode, [1, 2, 3, 4, 5], 3) == readers


def test_what_each_policy_does_with_each_defect() -> None:
    def config(policy: ValidationPolicy, payloads: bool) -> TopicSchemaConfig:
        return TopicSchemaConfig("s", policy, payloads)

    assert expected_outcome(None, "missing_id") == "accepted"
    assert expected_outcome(config(ValidationPolicy.NONE, True), "truncated") == "accepted"
    assert expected_outcome(config(ValidationPolicy.ENFORCE, True), None) == "accepted"
    assert expected_outcome(config(ValidationPolicy.WARN, True), "unknown_version") == "warned"
    assert expected_outcome(config(ValidationPolicy.ENFORCE, False), "other_subject") == "refused"
    assert expected_outcome(config(ValidationPolicy.ENFORCE, False), "trailing") == "accepted"
    assert expected_outcome(config(ValidationPolicy.ENFORCE, True), "trailing") == "refused"


def test_seeds_keep_every_invariant_and_meet_every_outcome() -> None:
    results = [run(seed) for seed in range(1, 6)]
    assert [r.violations for r in results] == [[]] * 5
    registrations = sum((Counter(r.registrations) for r in results), start=Counter[str]())
    publishes = sum((Counter(r.publishes) for r in results), start=Counter[str]())
    assert registrations["accepted"] > 0 and registrations["refused"] > 0
    assert publishes["accepted"] > 0 and publishes["warned"] > 0 and publishes["refused"] > 0
    assert publishes["in_batches"] > 0, "the gate judges batched publishes too"
    assert all(r.promises_checked > 0 for r in results)


def test_heavy_faults_keep_every_invariant() -> None:
    results = [run(seed, profile="heavy") for seed in range(20, 25)]
    assert [r.violations for r in results] == [[]] * 5
    injected = sum((r.injected for r in results), start=Counter[str]())
    assert all(injected[kind] > 0 for kind in ("crash", "stall", "partition", "slow_request"))
    assert injected["rebind"] > 0, "an operator changes bindings while producers publish"


def test_a_seed_replays_to_the_same_digest() -> None:
    first, second = run(7), run(7)
    assert first.digest == second.digest and first.events == second.events


CAUGHT_BY = {
    "compatibility_unchecked": "promise",
    "commit_without_compare": "registration",
    "payloads_never_checked": "policy",
    "registrations_refused": "progress",
}


GATE_CAUGHT_BY = {"binding_cache_never_expires": "binding freshness"}


@pytest.mark.parametrize("name", sorted(GATE_MUTATIONS))
def test_each_planted_bug_in_the_gate_flow_is_caught_within_50_seeds(name: str) -> None:
    """The schema run drives the gate's flow (`danube.machines.requests.schema_gate`) with its
    binding cache on the simulated clock, while an operator rebinds topics: a cache that
    keeps a binding past its TTL is noticed."""
    with GATE_MUTATIONS[name]():
        for seed in range(1, 51):
            violations = run(seed).violations
            if violations:
                assert violations[0].invariant == GATE_CAUGHT_BY[name], violations
                return
    pytest.fail(f"the schema run did not catch {name} in 50 seeds")


@pytest.mark.parametrize("name", sorted(SCHEMA_MUTATIONS))
def test_each_planted_bug_is_caught_by_its_invariant(name: str) -> None:
    mutation: Callable[[], object] = SCHEMA_MUTATIONS[name]
    with mutation():  # type: ignore[attr-defined]
        found = {v.invariant for v in run(1).violations}
    assert CAUGHT_BY[name] in found, f"{name} broke {found or 'nothing'}"


def test_the_command_line_reports_a_run_identically_in_any_process() -> None:
    def digest_line(hash_seed: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "sim", "--schemas", "--seed", "3", "--duration", "2"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "seed 3: ok" in done.stdout and "orders-full_transitive:" in done.stdout
        return done.stdout.splitlines()[0].split("digest ")[1]

    assert digest_line("1") == digest_line("2")


def test_a_message_of_a_version_the_store_lost_is_reported_not_a_crash() -> None:
    """Found in review: the checker looked the writer version up unguarded, so a registry bug
    that lost a version ended the run with a KeyError instead of a report."""
    checker = SchemaChecker(World(1))
    checker.bindings["/sim/t"] = None
    message = pb.StreamMessage(payload=b"\x02", schema_id=1, schema_version=4)
    checker.admitted("/sim/t", "orders", None, message, Verdict(True))
    checker.final(MetadataState(), ["orders"], {"orders"})
    assert [v.invariant for v in checker.violations] == ["registration"]
    assert "orders v4" in checker.violations[0].detail


def test_a_publish_answered_with_anything_but_a_refusal_or_unavailable_is_a_violation() -> None:
    checker = SchemaChecker(World(1))
    checker.bindings["/sim/t"] = None
    message = pb.StreamMessage(payload=b"\x02", schema_id=1, schema_version=1)
    checker.admitted("/sim/t", "orders", None, message, DanubeError(ErrorCode.UNAVAILABLE, "x"))
    assert checker.violations == []
    checker.admitted("/sim/t", "orders", None, message, DanubeError(ErrorCode.INTERNAL, "x"))
    assert [v.invariant for v in checker.violations] == ["policy"]


def test_the_replay_command_replays_the_run() -> None:
    workload = SchemaWorkload(producers=3, bad=0.3)
    faults = SchemaFaults(loss=0.01, crash=0.05)
    expected = SchemaSimulation(4, workload, faults).run(2)
    command = schema_replay_command(4, 2, workload, faults)
    assert command == (
        "python -m sim --schemas --seed 4 --duration 2 --profile none --producers 3 --bad 0.3 "
        "--loss 0.01 --crash 0.05"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sim", *command.split()[3:], "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert json.loads(done.stdout)["digest"] == expected.digest
