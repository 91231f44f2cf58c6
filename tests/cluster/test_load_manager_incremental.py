"""The load manager's incremental scores (issue 23 point 4) decide as a full rescoring does.

A leader rescored every broker from all of its topics at each observed change: 15 % of its
main thread while a dead broker's topics failed over. The machine now keeps each broker's
counted topics and the few with figures as the changes come. Here a twin runs beside it with
the old rescoring (each broker's load built afresh from its assignments, the topics on their
way to it and its last report, at every call), both fed the same random worlds of
`test_load_manager_properties`: every input must give both the same effects, and both the
same rankings after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings

from danube.machines.cluster import load_manager
from danube.machines.cluster.load_manager import LoadManager, LoadManagerConfig
from danube.machines.cluster.ranking import BrokerLoad, LoadReport, TopicLoad, scores
from tests.cluster import test_load_manager_properties as worlds


class FullRescoring(LoadManager):
    """The load manager as it was: every score from every topic, at every call."""

    def _load(self, broker: str) -> BrokerLoad:
        names = sorted(self._owned.get(broker, {}).keys() | self._expected.get(broker, set()))
        known = self._topic_loads.get(broker, {})
        report = self._reports.get(broker) or LoadReport(broker)
        topics = tuple(known.get(name) or TopicLoad(name) for name in names)
        return BrokerLoad.of(dataclasses.replace(report, topics=topics))

    def _scores(self) -> dict[str, int]:
        loads = {broker: self._load(broker) for broker in self._active()}
        return scores(self.config.assignment_strategy, loads)


class Twins:
    """Stands for the world's machine: every input goes to both, whose answers must match."""

    def __init__(self, config: LoadManagerConfig) -> None:
        self.incremental = LoadManager(worlds.ME, config)
        self.full = FullRescoring(worlds.ME, config)
        self.inputs = 0

    def __getattr__(self, name: str) -> Any:
        mine = getattr(self.incremental, name)
        if not callable(mine):
            return mine
        theirs: Callable[..., Any] = getattr(self.full, name)

        def both(*args: Any, **kwargs: Any) -> Any:
            answer = mine(*args, **kwargs)
            assert answer == theirs(*args, **kwargs), f"{name}{args} decided differently"
            assert self.incremental.rankings() == self.full.rankings(), f"after {name}{args}"
            self.inputs += 1
            return answer

        return both


class TwinWorld(worlds.World):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.machine = Twins(self.config)  # type: ignore[assignment]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds.configs(), worlds.runs)
def test_incremental_scores_decide_as_full_rescoring(
    config: LoadManagerConfig, run: worlds.Run
) -> None:
    original = worlds.World
    worlds.World = TwinWorld  # type: ignore[misc]
    try:
        world = worlds.play(config, run)
        world.calm()
    finally:
        worlds.World = original  # type: ignore[misc]
    assert isinstance(world.machine, Twins)
    assert world.machine.inputs > 0


def test_a_planted_miscount_is_caught() -> None:
    """The comparison is only as good as its power to see a difference: a machine that
    forgets the topics on their way to a broker (only its assignments count) decides
    differently from the full rescoring in a plain run."""

    class Forgetful(LoadManager):
        def _expect(self, topic: str, pending: Any, *, add: bool) -> None:
            target = pending.target()
            if target is not None:  # kept, but never counted
                topics = self._expected.setdefault(target, set())
                (topics.add if add else topics.discard)(topic)
                if not topics:
                    del self._expected[target]

    config = LoadManagerConfig()
    ops: list[tuple[Any, ...]] = [("create", t) for t in worlds.TOPICS]
    ops += [("register", "3"), ("pump",), ("pump",), ("pump",)]
    twins = Twins(config)
    twins.incremental = Forgetful(worlds.ME, config)
    world = TwinWorld(config)
    world.machine = twins  # type: ignore[assignment]
    assert _twins_disagree(world, ops), "the planted miscount went unnoticed"


def _twins_disagree(world: TwinWorld, ops: list[tuple[Any, ...]]) -> bool:
    """Runs `ops` on a led world with broker 1 registered: whether the full rescoring and the
    incremental counts parted ways."""
    try:
        world.register("1")
        world.resync()
        world.lead(True)
        for op in ops:
            world.step(op)
    except AssertionError as caught:
        assert "decided differently" in str(caught) or "after" in str(caught)
        return True
    return False


def test_a_planted_weight_bug_is_caught(monkeypatch: Any) -> None:
    """And a machine whose counts ignore what the reports say of each topic (only the count
    weighs) ranks differently once a report with figures arrives."""
    monkeypatch.setattr(load_manager, "_weighs", lambda load: False)
    config = LoadManagerConfig()
    ops: list[tuple[Any, ...]] = [("create", t) for t in worlds.TOPICS]
    ops += [("pump",), ("pump",), ("report", "1", 50), ("pump",)]
    assert _twins_disagree(TwinWorld(config), ops), "the planted weight bug went unnoticed"
