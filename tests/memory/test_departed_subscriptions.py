"""Records held for a reliable subscription whose consumers all left are let go after a grace
period and read again when a consumer comes back (spec/memory.md, "Departed clients";
`danube.machines.node.departed_subscriptions`)."""

from __future__ import annotations

import dataclasses

from danube.machines.memory.budget import MemoryPools
from danube.machines.node.departed_subscriptions import SWEEP_MS
from tests.node.test_core_reliable import EARLIEST, REL, SHARED, Broker, payloads

KIB = 1024
GRACE_MS = 5_000


def _broker(grace_ms: int = GRACE_MS, state_costs: tuple[int, int, int] | None = None) -> Broker:
    memory = MemoryPools(
        1024 * KIB,
        512 * KIB,
        256 * KIB,
        256 * KIB,
        departed_grace_ms=grace_ms,
        state_costs=state_costs,
        transport_costs=(1, 1) if state_costs else None,
    )
    return Broker(memory=memory, max_unacked=10)


def _held(broker: Broker) -> int:
    pool = broker.core.logs.consumer_pool
    assert pool is not None
    return pool.used


def _tick_until(broker: Broker, start_ms: int, end_ms: int) -> None:
    for now in range(start_ms, end_ms + 1, 100):
        broker.driver.now_ms = now
        broker.run(broker.core.tick(now).effects)


def _departed_consumer(broker: Broker, sub_type: int = SHARED) -> tuple[int, int]:
    """A consumer took 6 messages, acknowledged offsets 0 and 2 (out of order), and left."""
    pid = broker.producer()
    for n in range(6):
        broker.publish(pid, f"m{n}")
    consumer = broker.consumer("c", sub_type=sub_type)
    assert payloads(broker.take(consumer)) == [f"m{n}" for n in range(6)]
    broker.ack(0)
    broker.ack(2)
    broker.run(broker.core.close_stream(*consumer, now_ms=broker.driver.now_ms).effects)
    return consumer


def test_a_departed_subscriptions_records_are_let_go_after_the_grace_and_not_before() -> None:
    broker = _broker()
    start = broker.driver.now_ms
    _departed_consumer(broker)
    held = _held(broker)
    assert held > 0, "4 records not acknowledged are held"
    _tick_until(broker, start, start + GRACE_MS - 100)
    assert _held(broker) == held, "not before the grace period"
    _tick_until(broker, start + GRACE_MS, start + GRACE_MS + 2 * SWEEP_MS)
    assert _held(broker) == 0, "the pool got its room back"
    assert broker.core.departed.let_go == 1


def test_a_returning_consumer_gets_what_was_not_acknowledged_and_nothing_else() -> None:
    broker = _broker()
    start = broker.driver.now_ms
    _departed_consumer(broker)
    _tick_until(broker, start, start + GRACE_MS + 2 * SWEEP_MS)
    assert _held(broker) == 0
    back = broker.consumer("c", sub_type=SHARED)
    assert payloads(broker.take(back)) == ["m1", "m3", "m4", "m5"], "read again, acked ones not"
    for offset in (1, 3, 4, 5):
        broker.ack(offset)
    _tick_until(broker, broker.driver.now_ms, broker.driver.now_ms + 2_000)
    assert broker.cursor() == 5, "every offset acknowledged once"
    assert _held(broker) == 0


def test_a_connected_consumer_keeps_its_records() -> None:
    broker = _broker()
    start = broker.driver.now_ms
    pid = broker.producer()
    for n in range(4):
        broker.publish(pid, f"m{n}")
    consumer = broker.consumer("c")
    assert len(broker.take(consumer)) == 4
    held = _held(broker)
    _tick_until(broker, start, start + 4 * GRACE_MS)
    assert _held(broker) == held, "in flight to a connected consumer: never let go"
    assert broker.core.departed.let_go == 0


def test_a_consumer_back_within_the_grace_keeps_the_window() -> None:
    broker = _broker()
    start = broker.driver.now_ms
    _departed_consumer(broker)
    held = _held(broker)
    _tick_until(broker, start, start + GRACE_MS // 2)
    broker.consumer("c", sub_type=SHARED)
    _tick_until(broker, start + GRACE_MS // 2, start + 4 * GRACE_MS)
    assert broker.core.departed.let_go == 0
    assert _held(broker) == held


def test_zero_never_lets_go() -> None:
    broker = _broker(grace_ms=0)
    start = broker.driver.now_ms
    _departed_consumer(broker)
    held = _held(broker)
    _tick_until(broker, start, start + 4 * GRACE_MS)
    assert _held(broker) == held


def test_the_default_grace_is_a_few_seconds() -> None:
    pools = MemoryPools(1024 * KIB, 512 * KIB, 256 * KIB, 256 * KIB)
    assert 5_000 <= pools.departed_grace_ms <= 30_000
    assert dataclasses.replace(pools, departed_grace_ms=0).departed_grace_ms == 0


def test_offsets_the_cursor_passed_are_not_admitted_when_read_again() -> None:
    """A rebuilt dispatcher (`carry_over`) reads again from its cursor; acknowledgements of
    the first offsets move the cursor over the ones acknowledged out of order, which leave
    its set, and a read still to come must not admit them again (swarm seed 84 of
    `--departing`: Key-Shared sent offset 80, acknowledged, while 83 of its key was out)."""
    from danube.machines.dispatch import SubscriptionType
    from danube.machines.dispatch import reliable as rd

    old = rd.ReliableSubscription(SubscriptionType.SHARED, 0, max_unacked_messages=10)
    old.add_consumer(1, "c", (), 0)
    old.connect(1, 0)
    old.readable(5, 0)
    old.records_read([(o, b"") for o in range(6)], 0)
    for offset in (2, 3):
        old.ack(offset, 1)
    old.disconnect(1, 2)
    fresh = rd.ReliableSubscription(SubscriptionType.SHARED, old.cursor + 1)
    fresh.carry_over(old)
    fresh.add_consumer(1, "c", (), 3)
    effects = fresh.connect(1, 3)
    assert [e for e in effects if isinstance(e, rd.Read)] == [rd.Read(0, 6)]
    sent = fresh.records_read([(0, b""), (1, b"")], 3)  # a partial answer
    assert [e.offsets for e in sent if isinstance(e, rd.Deliver)] == [(0, 1)]
    assert [e.from_offset for e in sent if isinstance(e, rd.Read)] == [2], "the rest, at once"
    fresh.ack(0, 4)
    fresh.ack(1, 4)
    assert fresh.cursor == 3, "over the offsets acknowledged before"
    sent = fresh.records_read([(o, b"") for o in range(2, 6)], 5)
    assert [e.offsets for e in sent if isinstance(e, rd.Deliver)] == [(4, 5)], "not 2 and 3"


def _topic_with_consumer(broker: Broker, n: int, *, leaves: bool) -> None:
    """Another topic, one message, a consumer that took it (and left, `leaves`, after
    acknowledging it: it holds nothing)."""
    topic = f"/default/other{n}"
    core = broker.core
    made = core.create_producer(topic, "p", access_mode=0, strategy=REL)
    broker.run(made.effects)
    step = core.subscribe(topic, "c", "s", SHARED, (), EARLIEST, now_ms=broker.driver.now_ms)
    broker.run(step.effects)
    opened = core.open_stream(step.value, now_ms=broker.driver.now_ms)
    broker.run(opened.effects)
    if leaves:
        broker.run(core.ack(topic, "s", 0, now_ms=broker.driver.now_ms).effects)
        broker.run(core.close_stream(step.value, opened.value, now_ms=1).effects)


def test_the_sweep_visits_only_subscriptions_without_a_connected_consumer() -> None:
    """1,000 topics: 899 with a connected consumer, 100 whose consumer left holding nothing,
    one whose consumer left holding records. The sweep looks at that one alone, not at every
    topic (it walked all of them each second: about 10 ms at 100,000 topics), and once its
    records are let go at none."""
    broker = _broker(state_costs=(1, 1, 1))  # room for 1,000 topics' state in a small pool
    start = broker.driver.now_ms
    for n in range(999):
        _topic_with_consumer(broker, n, leaves=n % 10 == 0)
    _departed_consumer(broker)
    departed = broker.core.departed
    _tick_until(broker, start, start + SWEEP_MS)
    assert departed.visited == 1, "the one departed subscription holding records"
    _tick_until(broker, start + SWEEP_MS, start + GRACE_MS + 2 * SWEEP_MS)
    assert departed.let_go == 1 and _held(broker) == 0
    assert departed.visited == 0, "let go: it holds nothing, waits for no read"
    assert len(broker.core.logs.unconnected or {}) == 0


def test_a_let_go_runs_the_dispatchers_on_the_wall_clock() -> None:
    """The grace is timed on the monotonic clock, but the inputs a let-go makes (the cursor
    flush, the rebuilt dispatcher's consumers) carry the wall clock the dispatchers run on:
    given the monotonic one, far behind it, a rebuilt dispatcher's clock started there and a
    tick left a timer due (`--departing` swarm seed 69, invariant 19)."""
    behind = 1_000_000_000  # the monotonic clock this far behind the wall clock
    broker = _broker()
    start = broker.driver.now_ms
    _departed_consumer(broker)
    for now in range(start, start + GRACE_MS + 2 * SWEEP_MS + 1, 100):
        broker.driver.now_ms = now
        broker.run(broker.core.tick(now, monotonic_ms=now - behind).effects)
    assert broker.core.departed.let_go == 1
    sub = broker.core._topics["/default/r"].subscriptions["s"]
    machine = sub.reliable
    assert machine._now >= start + GRACE_MS, "the rebuilt dispatcher runs on the wall clock"
    back = broker.consumer("c", sub_type=SHARED)
    assert payloads(broker.take(back)) == ["m1", "m3", "m4", "m5"]
    for offset in (1, 3):
        broker.ack(offset)
    now = broker.driver.now_ms
    broker.run(broker.core.tick(now, monotonic_ms=now - behind).effects)
    due = sub.reliable.next_timer_ms
    assert due is None or due > now, f"a timer left due at {due} by the tick at {now}"
