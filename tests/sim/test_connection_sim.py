"""Invariant 18, the connection gate (spec/memory.md, "Connections"; sim/connections.py):
under the `connection_flood` fault, with crashes, the gate keeps its caps, closes idle
connections at their first-call deadline and lets a client that calls at once in; a gate
that refuses newcomers instead of evicting idle connections, one whose deadline never
closes anything, and one without caps are each caught."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from danube.machines.memory.connections import Admission, ConnectionGate, Refusal
from sim.faults import Faults
from sim.memory_checks import MEMORY
from sim.run import Simulation, Workload

FLOODS = Faults(connection_flood=0.05, crash=0.01, partition=0.01)


def _first_violation(seeds: range) -> str | None:
    for seed in seeds:
        result = Simulation(seed, Workload(), FLOODS).run(10)
        if not result.ok:
            return f"{result.violations[0].invariant}: {result.violations[0].detail}"
    return None


def test_floods_of_idle_connections_keep_the_gate_within_its_rules() -> None:
    refusals: dict[Refusal, int] = dict.fromkeys(Refusal, 0)
    original = ConnectionGate._refuse

    def counted(self: ConnectionGate, reason: Refusal) -> Refusal:
        refusals[reason] += 1
        return original(self, reason)

    with mock.patch.object(ConnectionGate, "_refuse", counted):
        for seed in range(1, 6):
            result = Simulation(seed, Workload(), FLOODS).run(10)
            assert result.ok, result.violations
            assert result.injected["connection_flood"] > 0
    # both ways an idle connection goes were taken
    assert refusals[Refusal.EVICTED] and refusals[Refusal.FIRST_CALL_TIMEOUT], refusals


@contextlib.contextmanager
def planted(name: str, replacement: object) -> Iterator[None]:
    with mock.patch.object(ConnectionGate, name, replacement):
        yield


def _refuses_instead_of_evicting(self: ConnectionGate, now: float) -> Admission:
    """Planted: newcomers are refused once the pending places are taken."""
    if self.open >= self.limits.max_connections or self.pending >= self.limits.max_pending:
        return Admission(None, self._refuse(Refusal.FULL))
    connection = self._next
    self._next += 1
    self._pending[connection] = now
    return Admission(connection)


def _no_caps(self: ConnectionGate, now: float) -> Admission:
    """Planted: every connection is admitted."""
    connection = self._next
    self._next += 1
    self._pending[connection] = now
    return Admission(connection)


def test_a_gate_that_refuses_newcomers_instead_of_evicting_is_caught() -> None:
    with planted("admit", _refuses_instead_of_evicting):
        found = _first_violation(range(1, 3))
    assert found is not None and found.startswith(MEMORY) and "call at once" in found, found


def test_a_first_call_deadline_that_closes_nothing_is_caught() -> None:
    with planted("expired", lambda self, connection, now: False):
        found = _first_violation(range(1, 3))
    assert found is not None and found.startswith(MEMORY) and "deadline" in found, found


def test_a_gate_without_caps_is_caught() -> None:
    with planted("admit", _no_caps):
        found = _first_violation(range(1, 3))
    assert found is not None and found.startswith(MEMORY) and "over its caps" in found, found
