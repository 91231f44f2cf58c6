"""`MetadataLane`: replies that wait for metadata writes are answered once their changes are
durable, in the order they came, whatever order their targets come in (the waiters are a heap
of targets since issue 28 point 3, not a list walked at every write)."""

from __future__ import annotations

from danube.interpreter.waiters import MetadataLane


def test_waiters_are_answered_when_durable_in_the_order_they_came() -> None:
    lane = MetadataLane()
    for _ in range(4):
        lane.submit(object())
    answered: list[tuple[str, str | None]] = []
    for name, first, target in (("a", 1, 3), ("b", 1, 1), ("c", 2, 2), ("d", 4, 4)):
        lane.when_durable(first, target, lambda failure, n=name: answered.append((n, failure)))
    lane.written(None)
    assert answered == [("b", None)]
    lane.written("disk full")
    assert answered == [("b", None), ("c", "disk full")]
    lane.written(None)
    assert answered[2:] == [("a", "disk full")], "a failure among 1..3 fails the wait"
    lane.written(None)
    assert answered[3:] == [("d", None)] and not lane.settling


def test_waiters_settled_by_one_write_come_in_arrival_order() -> None:
    lane = MetadataLane()
    lane.submit(object())
    answered: list[str] = []
    for name in "xyz":
        lane.when_durable(1, 1, lambda _failure, n=name: answered.append(n))
    lane.written(None)
    assert answered == ["x", "y", "z"]
    lane.when_durable(1, 1, lambda _failure: answered.append("now"))
    assert answered[-1] == "now", "already durable: answered at once"
