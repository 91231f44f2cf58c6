"""`sim.world.Timeouts`: one timer for a caller's timeouts must fire each at exactly its
deadline (as the event per timeout it replaced did), never one that was cleared, and leave no
event behind once nothing is pending."""

from __future__ import annotations

from sim.world import Timeouts, World


def test_each_timeout_fires_at_its_deadline_and_a_cleared_one_never() -> None:
    world = World(1)
    timeouts = Timeouts(world, 1_000)
    fired: list[tuple[str, int]] = []

    def expire(name: str) -> None:
        fired.append((name, world.now))

    def later(delay: int, name: str, *, clear: bool = False) -> None:
        def start() -> None:
            timeout = timeouts.start(lambda: expire(name))
            if clear:
                world.at(500, timeout.clear)

        world.at(delay, start)

    later(0, "a")
    later(100, "b", clear=True)  # answered at 600: never fires
    later(200, "c")
    later(2_500, "d")  # after the timer went idle: armed again
    world.run_until(10_000)
    assert fired == [("a", 1_000), ("c", 1_200), ("d", 3_500)]


def test_a_timeout_started_by_an_expiring_one_fires_in_turn() -> None:
    world = World(1)
    timeouts = Timeouts(world, 1_000)
    fired: list[int] = []

    def expire() -> None:
        fired.append(world.now)
        if len(fired) < 3:
            timeouts.start(expire)  # a retry's timeout, started as the last one fires

    timeouts.start(expire)
    world.run_until(10_000)
    assert fired == [1_000, 2_000, 3_000]
    events = world.events
    world.run_until(20_000)
    assert world.events == events, "no timer left once nothing is pending"
