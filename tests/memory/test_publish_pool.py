"""The publish pool and back-pressure on publishes (spec/memory.md, "Back-pressure"): pure,
the flows driven by hand with a clock the test moves."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from danube.effects.flow import Finished, step
from danube.machines.memory.budget import split
from danube.machines.memory.ledger import CacheLedger
from danube.machines.memory.pools import broker_pools
from danube.machines.memory.publish import MAX_BYPASS, PublishPool, RoomWaiter, send_cost
from danube.machines.requests import publish
from danube.machines.requests.effects import Apply, AwaitRoom, AwaitStored, CheckFence
from danube.machines.wal import records
from danube.machines.wal.cache import HotCache
from danube.values.errors import DanubeError, ErrorCode


def test_a_reservation_fits_or_not_and_is_given_back() -> None:
    pool = PublishPool(1_000)
    assert pool.capacity == 1_000  # no cache to borrow from
    assert pool.reserve(600)
    assert not pool.reserve(500)
    assert pool.reserve(400)
    pool.release(600)
    pool.release(400)
    assert pool.used == 0 and pool.peak == 1_000
    with pytest.raises(ValueError):
        pool.release(1)


def test_the_cache_gives_way_first_up_to_half_its_pool() -> None:
    ledger = CacheLedger(pool=1_000)
    cache = HotCache(10_000, "a", ledger)
    for offset in range(10):
        cache.put(offset, [b"x"], 100)
    assert ledger.total == 1_000
    pool = PublishPool(400, ledger=ledger)
    assert pool.capacity == 900
    assert pool.reserve(400)  # its own share: the cache keeps everything
    assert ledger.total == 1_000 and ledger.pool == 1_000
    assert pool.reserve(300)  # borrowed: the cache's oldest batches go at once
    assert ledger.pool == 700 and ledger.total == 700 and cache.oldest == 3
    assert ledger.total + pool.used <= 1_000 + 400
    assert not pool.reserve(201)  # the cache keeps the other half of its pool
    pool.release(700)
    assert ledger.pool == 1_000  # its room comes back as publishes are answered


def test_pressure_leaves_room_free() -> None:
    pool = PublishPool(1_000)
    pool.pressure = 900
    assert not pool.reserve(200)
    assert pool.reserve(100)


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


class FakeCore:
    """What the publish flow asks of the core; `publish` stores nothing, or refuses."""

    def __init__(self, pool: PublishPool, refuse: bool = False) -> None:
        self.publish_pool = pool
        self.memory = split(16 * 1024 * 1024)
        self.refuse = refuse
        self.published = 0

    def serves(self, topic: str) -> bool:
        return False

    def producer_active(self, producer_id: int) -> None:
        """The flow marks the producer active as the request arrives (`idle_producers`)."""

    def publish(self, *args: Any, encode: Any, now_ms: int) -> Any:
        if self.refuse:
            raise DanubeError(ErrorCode.UNAVAILABLE, "the topic is writing behind the disk")
        self.published += 1
        encode(7)
        from danube.machines.node.effects import Step

        return Step(7)


def message(size: int = 100) -> records.Record:
    return records.Record(
        payload=b"x" * size, producer_id=1, topic_name="/default/t", has_msg_id=True
    )


def run_until_stored(flow: Any, clock: Clock) -> Any:
    """Answers the flow's requests, moving the clock on each sleep, up to its storage wait
    (returned) or its end."""
    request = step(flow)
    while True:
        if isinstance(request, CheckFence):
            request = step(flow, answer=None)
        elif isinstance(request, AwaitRoom):
            if not request.waiter.granted:
                clock.ms += request.timeout_ms  # nobody freed room: the wait ran out
            request = step(flow, answer=None)
        elif isinstance(request, Apply):
            request = step(flow, answer=None)
        else:
            return request


def test_a_send_waits_for_room_then_is_refused_with_a_clear_message_and_nothing_stored() -> None:
    pool = PublishPool(send_cost(100), wait_ms=500)
    core = FakeCore(pool)
    clock = Clock()
    assert pool.reserve(1)  # another publish holds some of the pool
    end = run_until_stored(publish.publish_one(core, message(), clock, monotonic=clock), clock)  # type: ignore[arg-type]
    assert isinstance(end, Finished) and isinstance(end.error, DanubeError)
    assert end.error.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "publish pool is full" in end.error.message
    assert "--memory-budget" in end.error.message
    assert "Nothing of it was stored" in end.error.message
    assert core.published == 0 and pool.used == 1
    assert pool.refused == 1 and pool.paused_ms >= 500


def test_a_send_that_waited_goes_on_once_room_frees_and_gives_it_back_when_answered() -> None:
    pool = PublishPool(send_cost(100))
    core = FakeCore(pool)
    clock = Clock()
    assert pool.reserve(1)
    flow = publish.publish_one(core, message(), clock, monotonic=clock)  # type: ignore[arg-type]
    request = step(flow)
    request = step(flow, answer=None)  # the fence
    assert isinstance(request, AwaitRoom) and not request.waiter.granted
    woken: list[bool] = []
    request.waiter.wake = lambda: woken.append(True)
    clock.ms += 40
    pool.release(1)  # the release admits the waiter and wakes it: no polling
    assert woken == [True] and request.waiter.granted
    request = step(flow, answer=None)
    assert isinstance(request, Apply) and core.published == 1
    assert pool.used == send_cost(100)  # held until the publish is answered
    request = step(flow, answer=None)
    assert isinstance(request, AwaitStored)
    request = step(flow, answer=None)  # stored
    request = step(flow, answer=None)  # the fence again
    assert isinstance(request, Finished) and request.error is None
    assert pool.used == 0 and pool.paused_ms == 40 and pool.refused == 0


@pytest.mark.parametrize("how", ["refused by the core", "storage failed", "client left"])
def test_every_way_out_gives_the_room_back(how: str) -> None:
    pool = PublishPool(10_000)
    core = FakeCore(pool, refuse=how == "refused by the core")
    clock = Clock()
    flow = publish.publish_one(core, message(), clock, monotonic=clock)  # type: ignore[arg-type]
    request = run_until_stored(flow, clock)
    if how == "refused by the core":
        assert isinstance(request, Finished) and request.error is not None
    elif how == "storage failed":
        assert isinstance(request, AwaitStored)
        end = step(flow, error=DanubeError(ErrorCode.INTERNAL, "write failed"))
        assert isinstance(end, Finished) and end.error is not None
    else:
        assert isinstance(request, AwaitStored)
        flow.close()  # what the runtime's driver does when the call is cancelled
    assert pool.used == 0


def test_what_can_never_fit_is_refused_at_once() -> None:
    pool = PublishPool(1_000)
    core = FakeCore(pool)
    clock = Clock()
    end = run_until_stored(publish.publish_one(core, message(5_000), clock, monotonic=clock), clock)  # type: ignore[arg-type]
    assert isinstance(end, Finished) and isinstance(end.error, DanubeError)
    assert end.error.code is ErrorCode.RESOURCE_EXHAUSTED and clock.ms == 1_000
    assert "holds at most 1000" in end.error.message


# -- waiters: in order, woken by releases, capped (spec/memory.md, "Back-pressure") ------------


def test_waiters_are_admitted_in_order_and_a_newcomer_does_not_pass_them() -> None:
    pool = PublishPool(1_000)
    assert pool.reserve(1_000)
    first, second = pool.enqueue(300), pool.enqueue(300)
    assert first is not None and second is not None and pool.waiting == 2
    assert not pool.reserve(100)  # room or not, a newcomer queues behind them
    pool.release(400)
    assert first.granted and not second.granted  # room for one: the first in line
    pool.release(300)
    assert second.granted and pool.waiting == 0 and pool.used == 1_000 - 700 + 600


def test_small_waiters_pass_a_large_head_a_bounded_number_of_times_then_it_is_served() -> None:
    pool = PublishPool(1_000)
    assert pool.reserve(900)
    large = pool.enqueue(500)
    assert large is not None
    small = [pool.enqueue(50) for _ in range(MAX_BYPASS + 3)]
    assert all(isinstance(w, RoomWaiter) for w in small)
    assert sum(w.granted for w in small if w) == 2  # 100 bytes free: two pass the head at once
    pool.release(900)  # the head fits now: it goes first, then those behind it that fit
    assert large.granted
    assert large.bypassed == 2  # only the two that passed it while it did not fit
    assert sum(w.granted for w in small if w) == 10 and pool.used == 1_000 and pool.waiting == 1


def test_a_large_head_is_not_starved_by_a_stream_of_small_ones() -> None:
    pool = PublishPool(1_000)
    assert pool.reserve(600)
    assert pool.reserve(300)
    large = pool.enqueue(700)
    assert large is not None
    admitted = 0
    for _ in range(50):  # small publishes keep coming and finishing
        small = pool.enqueue(100)
        assert small is not None
        if small.granted:
            admitted += 1
            pool.release(100)
        else:
            pool.withdraw(small)
    assert admitted == MAX_BYPASS and not large.granted  # then the room is kept for the head
    pool.release(600)
    assert large.granted


def test_a_waiter_that_leaves_gives_back_what_it_was_granted_and_lets_others_in() -> None:
    pool = PublishPool(1_000)
    assert pool.reserve(1_000)
    head = pool.enqueue(900)
    behind = pool.enqueue(100)
    assert head is not None and behind is not None
    pool.withdraw(head)  # its wait ran out before room freed
    pool.release(100)
    assert behind.granted and pool.used == 1_000
    pool.withdraw(behind)  # granted, then its client left: the room comes back
    assert pool.used == 900


def test_waiters_are_capped_and_the_next_is_refused_at_once() -> None:
    pool = PublishPool(send_cost(100), max_waiters=2)
    core = FakeCore(pool)
    clock = Clock()
    assert pool.reserve(pool.capacity)
    assert pool.enqueue(10) and pool.enqueue(10) and pool.waiting == 2
    end = run_until_stored(publish.publish_one(core, message(), clock, monotonic=clock), clock)  # type: ignore[arg-type]
    assert isinstance(end, Finished) and isinstance(end.error, DanubeError)
    assert end.error.code is ErrorCode.RESOURCE_EXHAUSTED and clock.ms == 1_000
    assert "2 more already wait for room" in end.error.message
    assert "--memory-budget" in end.error.message and pool.refused == 1


def test_a_flow_closed_while_waiting_leaves_the_queue() -> None:
    pool = PublishPool(send_cost(100))
    core = FakeCore(pool)
    clock = Clock()
    assert pool.reserve(1)
    flow = publish.publish_one(core, message(), clock, monotonic=clock)  # type: ignore[arg-type]
    step(flow)
    request = step(flow, answer=None)
    assert isinstance(request, AwaitRoom) and pool.waiting == 1
    pool.release(1)  # granted ...
    flow.close()  # ... but the client left before it went on: nothing kept
    assert pool.used == 0 and pool.waiting == 0


def test_a_wall_clock_stepped_back_neither_stretches_the_wait_nor_counts_negative_time() -> None:
    """Review finding: the wait was timed on the wall clock, so NTP setting it back an hour
    made a waiting publish ask to wait 3,603,000 ms and `paused_ms` go negative (the metric
    `danube_memory_publish_paused_seconds_total` decreased). The monotonic clock times it."""
    pool = PublishPool(send_cost(100), wait_ms=3_000)
    core = FakeCore(pool)
    wall, monotonic = Clock(), Clock()
    assert pool.reserve(1)
    flow = publish.publish_one(core, message(), wall, monotonic=monotonic)  # type: ignore[arg-type]
    request = step(flow)
    request = step(flow, answer=None)  # the fence
    assert isinstance(request, AwaitRoom) and request.timeout_ms == 3_000
    wall.ms -= 3_600_000  # the wall clock set back one hour
    monotonic.ms += 10
    request = step(flow, answer=None)  # woken without room: asks again
    assert isinstance(request, AwaitRoom) and request.timeout_ms == 2_990
    monotonic.ms += 10
    pool.release(1)
    request = step(flow, answer=None)
    assert isinstance(request, Apply)
    assert pool.paused_ms == 20


def test_publishes_never_borrow_what_the_state_took_of_the_cache_pool() -> None:
    """Review finding: the publish pool's capacity ignored the state charged to the cache
    pool, so with a 256 MiB budget and `danube-cli load`'s 3,000 streams cache + state +
    publishes reached 216 MiB against a cache and publish pool of 192."""
    memory = split(256 << 20)
    pools = broker_pools(memory)
    state, publishes, ledger = pools.state_pool, pools.publish_pool, pools.cache_ledger
    assert state is not None and publishes is not None and ledger is not None
    state.transport(5_000, 1)  # open streams are never refused: past the state's share
    state.update(1_000, 1_000, 1_000)
    assert ledger.state > ledger.state_limit > memory.cache // 2  # past what publishes may borrow
    assert publishes.capacity == memory.publish + memory.cache - ledger.state
    assert publishes.reserve(publishes.capacity)
    assert not publishes.reserve(1)
    assert ledger.total + ledger.state + publishes.used <= memory.cache + memory.publish
    # refused at once beyond: what it may ever borrow keeps the state's share back
    assert publishes.ceiling == memory.publish + memory.cache - ledger.state_limit


def test_room_the_state_gives_back_goes_to_the_waiters() -> None:
    memory = split(256 << 20)
    pools = broker_pools(memory)
    state, publishes = pools.state_pool, pools.publish_pool
    assert state is not None and publishes is not None
    state.transport(8_000, 1)  # the state takes all of the cache pool
    state.update(0, 0, 0)
    assert publishes.capacity == memory.publish
    assert publishes.reserve(memory.publish)
    waiter = publishes.enqueue(1 << 20)
    assert waiter is not None and not waiter.granted
    state.transport(0, 0)  # the streams closed: the cache pool may be borrowed from again
    state.update(0, 0, 0)
    assert waiter.granted and publishes.overlooked == 0


def test_waiting_bytes_are_capped_and_the_next_is_refused_at_once() -> None:
    """Review finding: only the number of waiters was capped (1,024), not what they hold
    outside the pool while they wait (up to 1,024 x 10 MiB)."""
    pool = PublishPool(10_000)
    assert pool.max_waiting_bytes == 10_000  # the pool's share by default
    assert pool.reserve(10_000)
    first = pool.enqueue(8_000)
    assert first is not None and pool.waiting_bytes == 8_000
    assert pool.enqueue(2_001) is None  # 10,001 bytes would wait
    second = pool.enqueue(2_000)
    assert second is not None and pool.waiting_bytes == 10_000
    pool.withdraw(second)
    assert pool.waiting_bytes == 8_000
    pool.release(10_000)  # the first is admitted: it no longer waits
    assert first.granted and pool.waiting_bytes == 0
    alone = PublishPool(1_000, max_waiting_bytes=10)
    assert alone.reserve(1_000)
    assert alone.enqueue(900) is not None  # an empty queue takes any request that may fit


def test_a_send_past_the_waiting_bytes_is_refused_with_the_reason() -> None:
    pool = PublishPool(send_cost(100), max_waiting_bytes=send_cost(100))
    core = FakeCore(pool)
    clock = Clock()
    assert pool.reserve(pool.capacity)
    assert pool.enqueue(send_cost(100) - 10)
    end = run_until_stored(publish.publish_one(core, message(), clock, monotonic=clock), clock)  # type: ignore[arg-type]
    assert isinstance(end, Finished) and isinstance(end.error, DanubeError)
    assert end.error.code is ErrorCode.RESOURCE_EXHAUSTED and clock.ms == 1_000
    assert "1 more already wait for room, holding 1690 bytes" in end.error.message
    assert f"{send_cost(100)} bytes may wait" in end.error.message
    assert "Nothing of it was stored" in end.error.message and pool.refused == 1


def test_what_can_never_fit_is_refused_at_once_not_waited_for() -> None:
    """Review finding: `ceiling` counted half the cache pool while the room to borrow always
    keeps the state's 3/4 share back, so with a 48 MiB budget a 10 MiB `SendMessage` (20 MiB
    accounted) waited its whole wait on an idle broker, and, larger than what waiting
    publishes may hold, had every other publish refused meanwhile."""
    memory = split(48 << 20)
    pools = broker_pools(memory)
    publishes = pools.publish_pool
    assert publishes is not None
    size = send_cost(10 << 20)
    assert publishes.ceiling == publishes.capacity  # an idle broker can lend all it ever will
    assert size > publishes.ceiling
    clock = [0]
    core = SimpleNamespace(publish_pool=publishes, memory=memory)
    with pytest.raises(DanubeError) as refused:
        next(publish.admitted(core, size, lambda: clock[0], stream=False))  # type: ignore[arg-type]
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert publishes.waiting == 0
    assert publishes.reserve(1_000)  # others are not refused behind it
