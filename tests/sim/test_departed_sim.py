"""Departed clients under the simulator (`--departing`, spec/memory.md "Departed clients"):
producers that leave are removed after the idle timeout and create themselves again when
they come back, and a subscription whose consumers left lets go of what it holds and reads it
again when one is back, nothing acknowledged lost. Invariant 20 (only idle producers expire)
and 18 (the consumer pool holds what is in flight to connected consumers) catch the planted
bugs: a sweep that ignores activity, and a let-go that does not wait for the consumers to
leave."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

from danube.machines.node.departed_subscriptions import DepartedSubscriptions
from danube.machines.node.idle_producers import IdleSweep
from danube.machines.node.records import ProducerRecord
from sim.faults import Faults
from sim.memory_checks import IDLE, MEMORY
from sim.run import Simulation, Workload

DEPARTING = Workload(departing=True)


def test_departing_clients_are_let_go_and_come_back_with_nothing_lost() -> None:
    expired = let_go = 0
    for seed in (1, 2):
        simulation = Simulation(seed, DEPARTING, Faults())
        result = simulation.run(30)
        assert result.ok, result.violations
        expired += simulation.broker.expired_producers
        let_go += simulation.broker.subscriptions_let_go
        assert sum(p.left for p in simulation.producers) > 0
        assert sum(c.left for c in simulation.consumers) > 0
    assert expired > 0, "producers that left were removed"
    assert let_go > 0, "subscriptions whose consumers left let go of their records"


@contextlib.contextmanager
def sweep_ignores_activity() -> Iterator[None]:
    """The planted bug: the sweep times a producer from its first sweep, whatever it did
    since (publishes and health checks are not looked at)."""

    def idle(self: IdleSweep, producers: Any, now_ms: int) -> list[ProducerRecord]:
        expired = []
        for producer in producers:
            if producer.seen_ms < 0:
                producer.seen_ms = now_ms
            elif producer.seen_ms <= now_ms - self.idle_ms:
                expired.append(producer)
        return expired

    with mock.patch.object(IdleSweep, "idle", idle):
        yield


def test_expiring_an_active_producer_is_caught() -> None:
    with sweep_ignores_activity():
        result = Simulation(1, DEPARTING, Faults()).run(10)
    assert not result.ok
    assert result.violations[0].invariant == IDLE, result.violations


@contextlib.contextmanager
def let_go_of_connected_subscriptions() -> Iterator[None]:
    """The planted bug: the grace is counted from when records are first held, whether a
    consumer is connected or not."""
    original = DepartedSubscriptions.tick
    holding: dict[tuple[str, str, int], int] = {}

    def tick(self: DepartedSubscriptions, now_ms: int, wall_ms: int | None = None) -> list[Any]:
        effects = []
        for record in list(self._topics.values()):
            for sub in list(record.subscriptions.values()):
                machine: Any = sub.machine
                if record.reliable and sub.records and machine.connected_count:
                    since = holding.setdefault((record.name.full, sub.name, sub.epoch), now_ms)
                    if now_ms - since >= self.grace_ms and not machine.held:
                        wall = now_ms if wall_ms is None else wall_ms
                        effects.extend(self._let_go(record, sub, wall))
        return [*effects, *original(self, now_ms, wall_ms)]

    with mock.patch.object(DepartedSubscriptions, "tick", tick):
        yield


def test_letting_go_of_records_in_flight_is_caught() -> None:
    with let_go_of_connected_subscriptions():
        result = Simulation(1, DEPARTING, Faults()).run(10)
    assert not result.ok
    assert result.violations[0].invariant == MEMORY, result.violations


@contextlib.contextmanager
def departures_not_noted() -> Iterator[None]:
    """The planted bug: the dispatcher inputs that leave a subscription with no connected
    consumer (a stream closing, a consumer removed, a read landing after the last one left)
    are not noted (`ReliableLogs.unconnected`), so the sweep, which visits only those,
    never hears of a departure and the records are held for ever. (Only a stream's close
    left unnoted is not enough: the subscription's next timer, an ack deadline or a cursor
    flush, goes through the same path and notes it.)"""
    original = DepartedSubscriptions.__init__

    def init(self: DepartedSubscriptions, logs: Any, *args: Any, **kwargs: Any) -> None:
        original(self, logs, *args, **kwargs)
        logs.unconnected = None

    with mock.patch.object(DepartedSubscriptions, "__init__", init):
        yield


def test_a_departure_the_sweep_does_not_hear_of_is_caught() -> None:
    with departures_not_noted():
        result = Simulation(1, DEPARTING, Faults()).run(30)
    assert not result.ok
    assert result.violations[0].invariant == MEMORY, result.violations
    assert "unconnected" in result.violations[0].detail, result.violations
