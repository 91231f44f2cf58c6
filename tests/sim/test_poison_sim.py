"""The poison workload (sim/poison.py, issue 24): consumers nack one key's messages for ever
and each subscription drops, blocks or dead-letters them past `max_redelivery_count`; the runs
pass under the default faults with messages really dropped or dead-lettered, and planted bugs
(an off-by-one in the limit, a backoff past its cap, an original passed before its dead
letter is stored, failure counts forgotten on restart) are caught by invariant 17 within 200
seeds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sim.__main__ import PROFILES, report
from sim.checker import POISON
from sim.run import Simulation, Workload
from tests.sim.poison_mutations import (
    ATTEMPTS_MUTATIONS,
    DEAD_LETTER_MUTATIONS,
    KEY_SHARED_MUTATIONS,
    POISON_MUTATIONS,
)

DEFAULT = PROFILES["default"]


ENGAGED = (1, 2, 4)
"""Seeds whose 5 simulated seconds reach a poison message. Seed 3 did until the state's share
became 3/4 of the cache pool (issue 28 part 5): its schedule now delivers no poison message in
5 or 8 s under any of the three policies (the runs are ok and drained; the policy is just
never engaged), so it proved nothing here."""


@pytest.mark.parametrize("poison", ["drop", "block"])
def test_poison_runs_settle_every_message(poison: str) -> None:
    workload = Workload(poison=poison)
    for seed in ENGAGED:
        simulation = Simulation(seed, workload, DEFAULT)
        result = simulation.run(5)
        assert result.ok and result.drained, report(result, workload, DEFAULT)
        dropped = sum(len(s.dropped) for s in simulation.checker.subscriptions.values())
        assert dropped, "the policy dropped (or the operator skipped) nothing"
        if poison == "block":
            assert simulation.poison is not None and simulation.poison.skipped


def test_a_key_shared_block_holds_only_its_key() -> None:
    """With only Key-Shared, a blocked key waits while the others flow: the run drains and
    the checker's order and exclusivity rules (3, 5) never see the key overtaken."""
    workload = Workload(poison="block", subscriptions=("key_shared",))
    for seed in range(1, 4):
        result = Simulation(seed, workload, DEFAULT).run(5)
        assert result.ok and result.drained, report(result, workload, DEFAULT)


def caught_by_invariant_17(poison: str, mutation: str, plant: Any) -> None:
    """The planted bug makes some seed of 200 fail, and only by invariant 17."""
    workload = Workload(poison=poison)
    with plant():
        for seed in range(1, 201):
            result = Simulation(seed, workload, DEFAULT).run(3)
            if not result.ok:
                text = report(result, workload, DEFAULT)
                assert {v.invariant for v in result.violations} == {POISON}, text
                return
    pytest.fail(f"{mutation} was not caught in 200 seeds")


@pytest.mark.parametrize("mutation", sorted(POISON_MUTATIONS))
def test_a_planted_poison_bug_is_caught(mutation: str) -> None:
    caught_by_invariant_17("drop", mutation, POISON_MUTATIONS[mutation])


def test_dead_letter_runs_store_every_exhausted_message() -> None:
    """Under DeadLetter the poison reaches the dead-letter topic (created by the broker on
    the first dead letter), each judged by the checker when reported stored."""
    workload = Workload(poison="dead_letter")
    for seed in ENGAGED:
        simulation = Simulation(seed, workload, DEFAULT)
        result = simulation.run(5)
        assert result.ok and result.drained, report(result, workload, DEFAULT)
        subscriptions = simulation.checker.subscriptions.values()
        assert sum(len(s.dead_lettered) for s in subscriptions), "nothing was dead-lettered"
        assert not any(s.dropped for s in subscriptions), "DeadLetter drops nothing"


@pytest.mark.parametrize("mutation", sorted(DEAD_LETTER_MUTATIONS))
def test_a_planted_dead_letter_bug_is_caught(mutation: str) -> None:
    caught_by_invariant_17("dead_letter", mutation, DEAD_LETTER_MUTATIONS[mutation])


@pytest.mark.parametrize("mutation", sorted(KEY_SHARED_MUTATIONS))
def test_a_planted_overtaking_of_a_blocked_key_is_caught(mutation: str) -> None:
    """Caught by the order and exclusivity rules (3, 5), which count only acknowledged or
    dropped offsets as settled."""
    workload = Workload(poison="block", subscriptions=("key_shared",))
    with KEY_SHARED_MUTATIONS[mutation]():
        for seed in range(1, 201):
            result = Simulation(seed, workload, DEFAULT).run(3)
            if not result.ok:
                text = report(result, workload, DEFAULT)
                assert {v.invariant for v in result.violations} <= {"3 order", "5 exclusivity"}
                assert "key" in result.violations[0].detail, text
                return
    pytest.fail(f"{mutation} was not caught in 200 seeds")


def test_without_poison_the_workload_is_unchanged() -> None:
    """The poison knobs draw nothing from the seed when off: a run's digest does not
    depend on `poison_limit`."""
    plain = Simulation(3, Workload(), DEFAULT).run(2)
    other = Simulation(3, dataclasses.replace(Workload(), poison_limit=5), DEFAULT).run(2)
    assert plain.digest == other.digest


def test_failure_counts_survive_restarts() -> None:
    """Under Block (blocked messages keep their counts until the operator's sweep) the
    restarts of a few seeds find counts stored, and every message the restarted broker sends
    counts at least those: the judge has reach, and the runs pass."""
    workload = Workload(poison="block")
    checked = 0
    for seed in range(1, 61):  # runs until the judge has checked sends of two seeds
        simulation = Simulation(seed, workload, DEFAULT)
        result = simulation.run(3)
        assert result.ok, report(result, workload, DEFAULT)
        assert simulation.poison is not None
        checked += bool(simulation.poison.attempts_checked)
        if checked == 2:
            break
    assert checked == 2, "no restart found a failure count stored: the judge saw nothing"


@pytest.mark.parametrize("mutation", sorted(ATTEMPTS_MUTATIONS))
def test_planted_forgotten_attempts_are_caught(mutation: str) -> None:
    caught_by_invariant_17("block", mutation, ATTEMPTS_MUTATIONS[mutation])
