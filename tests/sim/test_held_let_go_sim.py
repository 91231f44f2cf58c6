"""Invariant 18, records held for consumers that left (spec/memory.md, "Consumer queues"):
when a reliable subscription's last consumer goes, its held records are let go and read
again once a consumer returns. Planted: a core that never lets them go (caught by invariant
18: records held in vain), and a dispatcher that lets them go without reading them again
(caught by the delivery invariants)."""

from __future__ import annotations

from typing import Any
from unittest import mock

from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.node.consumers import Consumers
from sim.__main__ import PROFILES
from sim.checker import MEMORY
from sim.run import Simulation, Workload

HEAVY = PROFILES["heavy"]


def _first_violation(seeds: range) -> tuple[str, str] | None:
    for seed in seeds:
        result = Simulation(seed, Workload(), HEAVY).run(10)
        if not result.ok:
            return result.violations[0].invariant, result.violations[0].detail
    return None


def test_heavy_faults_keep_the_consumer_pool_exact_while_consumers_come_and_go() -> None:
    let_go: list[int] = []
    original = ReliableSubscription.let_go

    def counted(self: ReliableSubscription, now_ms: int) -> Any:
        effects = original(self, now_ms)
        if effects is not None:
            let_go.append(now_ms)
        return effects

    with mock.patch.object(ReliableSubscription, "let_go", counted):
        for seed in range(1, 6):
            result = Simulation(seed, Workload(), HEAVY).run(10)
            assert result.ok, result.violations
            assert result.drained, f"seed {seed}: not everything acknowledged was delivered"
    assert let_go, "no subscription let its records go: the rule was not exercised"


def test_records_kept_for_consumers_that_all_left_are_caught() -> None:
    with mock.patch.object(Consumers, "_let_go_if_last", lambda self, record, sub, now: []):
        found = _first_violation(range(1, 6))
    assert found is not None and found[0] == MEMORY and "all left" in found[1], found


def test_records_let_go_and_never_read_again_are_caught() -> None:
    original = ReliableSubscription.let_go

    def forgets(self: ReliableSubscription, now_ms: int) -> Any:
        position = self.read_position
        effects = original(self, now_ms)
        if effects is not None:
            self.read_position = position  # planted: what was let go is not read again
        return effects

    with mock.patch.object(ReliableSubscription, "let_go", forgets):
        found = _first_violation(range(1, 6))
    assert found is not None and found[0] != MEMORY, found
