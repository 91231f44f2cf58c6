"""Invariant 4 (acknowledged is stored: safety) and 4b (backlog drains: liveness), apart.

Safety is judged at once on the storage and delivery records, whatever the backlog; liveness
by the drain, which ends when everything is delivered or after a bounded time with no new
first delivery, never at a fixed total time. Each has a planted bug that it alone catches."""

from __future__ import annotations

from unittest import mock

import pytest

from danube.machines.wal import format, records
from danube.machines.wal.machine import Durability
from sim.__main__ import PROFILES, report
from sim.checker import LIVENESS, SAFETY, InvariantChecker
from sim.disk import SimDisk
from sim.run import NO_PROGRESS_US, OVERLOAD, Simulation, Workload, drain_line
from sim.world import US_PER_S, World
from tests.sim.owed_mutations import LIVENESS_MUTATIONS, SAFETY_MUTATIONS

DEFAULT = PROFILES["default"]
NONE = PROFILES["none"]
TOPIC = "/default/t"


def _checker(payloads: list[bytes], *, wal_acked: int) -> InvariantChecker:
    """A checker that saw `payloads` written at offsets 0, 1, ... and the WAL acknowledge
    offsets below `wal_acked` (in `flush` mode: no disk to judge durability on)."""
    checker = InvariantChecker(World(1), SimDisk(), Durability.FLUSH)
    frames = [
        format.encode_frame(offset, 0, [records.encode(records.Record(payload=p))])
        for offset, p in enumerate(payloads)
    ]
    checker.written(TOPIC, b"".join(frames))
    if wal_acked:
        checker.acknowledged(TOPIC, wal_acked - 1, Durability.FLUSH)
    return checker


def test_a_producer_told_of_a_message_no_acknowledged_write_holds_is_a_violation() -> None:
    checker = _checker([b"a", b"b"], wal_acked=1)
    checker.produced(TOPIC, b"a", None)
    assert checker.violations == []
    checker.produced(TOPIC, b"b", None)  # written, but the WAL has not acknowledged it
    checker.produced(TOPIC, b"never written", None)
    assert [v.invariant for v in checker.violations] == [SAFETY, SAFETY]


def test_a_cursor_may_pass_only_what_a_consumer_acknowledged_or_what_is_owed_later() -> None:
    checker = _checker([b"a", b"b", b"c", b"b"], wal_acked=4)
    for payload in (b"a", b"b", b"c"):
        checker.produced(TOPIC, payload, None)
    checker.client_acked(TOPIC, "s", 0)
    checker.cursor_at(TOPIC, "s", 1)  # b at 1 unacknowledged, but stored again at 3
    assert checker.violations == []
    checker.cursor_at(TOPIC, "s", 2)  # c at 2: acknowledged to its producer, skipped
    assert [v.invariant for v in checker.violations] == [SAFETY]
    assert "offset(s) [2]" in checker.violations[0].detail
    checker.client_acked(TOPIC, "s", 3)
    checker.cursor_at(TOPIC, "s", 3)
    assert len(checker.violations) == 1


def test_a_skip_of_a_message_acknowledged_only_later_is_judged_when_it_is() -> None:
    checker = _checker([b"a"], wal_acked=1)
    checker.cursor_at(TOPIC, "s", 0)
    assert checker.violations == []
    checker.produced(TOPIC, b"a", None)
    assert [v.invariant for v in checker.violations] == [SAFETY]


def test_what_a_subscription_owes_counts_acknowledged_messages_received_in_any_order() -> None:
    checker = _checker([b"a", b"b"], wal_acked=2)
    checker.received(TOPIC, "s", "c0", 1, b"b")  # before its producer heard
    checker.produced(TOPIC, b"a", None)
    checker.produced(TOPIC, b"b", None)
    assert checker.owed(TOPIC, "s") == 1 and checker.first_deliveries(TOPIC, "s") == 1
    checker.received(TOPIC, "s", "c0", 0, b"a")
    checker.received(TOPIC, "s", "c0", 0, b"a")
    assert checker.owed(TOPIC, "s") == 0 and checker.duplicates == 1


@pytest.mark.parametrize("mutation", sorted(SAFETY_MUTATIONS))
def test_a_planted_skip_is_caught_by_safety_during_the_load(mutation: str) -> None:
    """Every message is still received at least once, so the old end-of-drain check and the
    drain would pass: only the cursor rule sees it, within a tick, not at the end.

    The consumer pool's check (invariant 18) is off here: a settled message whose record the
    node still holds is a memory fault it may report first, and this test is about what the
    cursor rule sees on its own."""
    workload = Workload()
    held_off = mock.patch.object(InvariantChecker, "held_checked", lambda *_: None)
    with SAFETY_MUTATIONS[mutation](), held_off:
        for seed in range(1, 51):
            result = Simulation(seed, workload, DEFAULT).run(3)
            if not result.ok:
                text = report(result, workload, DEFAULT)
                assert {v.invariant for v in result.violations} == {SAFETY}, text
                assert result.violations[0].time_us <= 3 * US_PER_S, text
                assert "cursor passed" in result.violations[0].detail, text
                # without the cursor rule the same run drains and breaks nothing
                with mock.patch.object(InvariantChecker, "cursor_at", lambda *_: None):
                    blind = Simulation(seed, workload, DEFAULT).run(3)
                assert blind.ok and blind.drained, report(blind, workload, DEFAULT)
                return
    pytest.fail(f"safety did not catch {mutation} in 50 seeds")


@pytest.mark.parametrize("mutation", sorted(LIVENESS_MUTATIONS))
def test_a_planted_stall_is_caught_by_liveness_alone(mutation: str) -> None:
    """Nothing acknowledged is skipped or unstored, so safety stays quiet; the drain stops
    after the no-progress limit and reports what is still owed."""
    workload = Workload()
    with LIVENESS_MUTATIONS[mutation]():
        for seed in range(1, 21):
            result = Simulation(seed, workload, NONE).run(3)
            if not result.ok:
                text = report(result, workload, NONE) + "\n" + drain_line(result)
                assert {v.invariant for v in result.violations} == {LIVENESS}, text
                assert not result.drained and result.drain_s * US_PER_S >= NO_PROGRESS_US
                assert "NOT drained" in drain_line(result)
                assert "still owes" in result.violations[0].detail, text
                return
    pytest.fail(f"liveness did not catch {mutation} in 20 seeds")


def test_an_overloaded_run_drains_for_as_long_as_it_makes_progress() -> None:
    """Four times what an Exclusive subscription takes: the backlog at the end of the load
    takes far longer than the load to deliver, and the run passes."""
    result = Simulation(1, OVERLOAD, NONE).run(5)
    assert result.ok, report(result, OVERLOAD, NONE)
    assert result.drained and result.owed_at_drain > 1_000
    assert result.drain_s > 10 and result.drain_delivered >= result.owed_at_drain


def test_the_default_workload_keeps_up_with_its_load() -> None:
    """Below what the subscriptions take: without faults, what the judged subscriptions
    owe when the load stops is about a second's worth, however long the load ran."""
    workload = Workload()
    offered = workload.rate * workload.producers * workload.topics
    subscriptions = len(workload.subscriptions) * workload.topics
    for seed in range(1, 4):
        result = Simulation(seed, workload, NONE).run(30)
        assert result.ok and result.drained, report(result, workload, NONE)
        assert result.owed_at_drain <= 2 * offered * subscriptions, drain_line(result)
        assert result.drain_s < 5, drain_line(result)
