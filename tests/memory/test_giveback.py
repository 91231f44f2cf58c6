"""Giving memory back (spec/memory.md, "Giving memory back"): after a large drop of what the
pools account, at most once in `MIN_INTERVAL_MS`, the core emits `ReturnMemory`; the
production port collects and trims; caches of topics idle for `cache_idle_ms` are emptied."""

from __future__ import annotations

import itertools
import logging
import random

import pytest

from danube.machines.dispatch import QueueLimits
from danube.machines.memory.budget import MIB, split
from danube.machines.memory.giveback import (
    FULL_MAX_INTERVAL_MS,
    FULL_MIN_INTERVAL_MS,
    MIN_INTERVAL_MS,
    MemoryReturn,
    ReturnMemory,
)
from danube.machines.memory.ledger import CacheLedger
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.machines.wal.cache import HotCache
from danube.runtime.memory_return import MemoryReturner, rss_bytes
from danube.values.config import DispatchStrategy, Policies


def test_a_large_drop_returns_memory_once_then_waits_the_interval() -> None:
    machine = MemoryReturn(budget=256 * MIB)
    assert machine.drop_bytes == 16 * MIB
    assert machine.observe(100 * MIB, 0) == ()
    assert machine.observe(90 * MIB, 1_000) == (), "10 MiB is not a large drop"
    assert machine.observe(80 * MIB, 2_000) == (ReturnMemory(20 * MIB),)
    assert machine.observe(100 * MIB, 3_000) == ()
    assert machine.observe(50 * MIB, 4_000) == (), "within the interval: it waits"
    later = 2_000 + MIN_INTERVAL_MS
    assert machine.observe(50 * MIB, later) == (ReturnMemory(50 * MIB, full=False),), (
        "the drop is kept (a light return: the full one was 30 s ago)"
    )
    assert machine.observe(50 * MIB, later + MIN_INTERVAL_MS) == (), "nothing fell since"
    assert machine.returns == 2


def _returns(machine: MemoryReturn, rss_after: int, rounds: int) -> list[tuple[int, bool]]:
    """`rounds` large drops one `MIN_INTERVAL_MS` apart, RSS 200 MiB at each decision and
    `rss_after` at a sample between: (when, full) of each return decided."""
    out = []
    for n in range(rounds):
        at = n * MIN_INTERVAL_MS
        machine.observe(100 * MIB, at - 1, rss=rss_after)  # a sample between, then a rise
        for effect in machine.observe(50 * MIB, at, rss=200 * MIB):
            out.append((at, effect.full))
    return out


def test_a_full_collection_at_most_once_in_its_interval_light_returns_between() -> None:
    """Issue 28 part 15: a full collection held the loop 52-278 ms at each return of the
    soak; the returns between full ones collect the young generations only."""
    machine = MemoryReturn(budget=256 * MIB)
    done = _returns(machine, rss_after=150 * MIB, rounds=9)  # each full one gave 50 MiB
    assert len(done) == 9
    fulls = [at for at, full in done if full]
    assert fulls == [0, FULL_MIN_INTERVAL_MS, 2 * FULL_MIN_INTERVAL_MS], done
    assert machine.full_returns == 3 and machine.full_interval_ms == FULL_MIN_INTERVAL_MS


def test_a_full_collection_that_gave_back_little_backs_off_up_to_its_most() -> None:
    machine = MemoryReturn(budget=256 * MIB)
    done = _returns(machine, rss_after=199 * MIB, rounds=120)  # 1 MiB back: not enough
    fulls = [at for at, full in done if full]
    gaps = [b - a for a, b in itertools.pairwise(fulls)]
    # each full return is judged at the next return (30 s on): the interval doubled by then
    assert gaps == [
        2 * FULL_MIN_INTERVAL_MS,
        4 * FULL_MIN_INTERVAL_MS,
        FULL_MAX_INTERVAL_MS,
        FULL_MAX_INTERVAL_MS,
    ], gaps
    assert machine.full_interval_ms == FULL_MAX_INTERVAL_MS


def test_a_full_collection_that_gave_enough_sets_the_back_off_back() -> None:
    machine = MemoryReturn(budget=256 * MIB)
    _returns(machine, rss_after=199 * MIB, rounds=10)
    assert machine.full_interval_ms > FULL_MIN_INTERVAL_MS
    # the next full one gives 40 MiB back (a sample after it, however late, counts)
    at = 10 * MIN_INTERVAL_MS + FULL_MAX_INTERVAL_MS
    assert machine.observe(100 * MIB, at - 1, rss=200 * MIB) == ()
    assert machine.observe(50 * MIB, at, rss=200 * MIB)[0].full
    machine.observe(50 * MIB, at + 1_000, rss=190 * MIB)
    machine.observe(50 * MIB, at + 2_000, rss=160 * MIB)  # the trim done, RSS down
    machine.observe(100 * MIB, at + MIN_INTERVAL_MS - 1, rss=180 * MIB)
    assert not machine.observe(50 * MIB, at + MIN_INTERVAL_MS, rss=200 * MIB)[0].full
    assert machine.full_interval_ms == FULL_MIN_INTERVAL_MS, "judged at that return"


def test_what_the_squeeze_evicted_is_not_the_full_returns_credit() -> None:
    """Review finding (issue 28 part 15): RSS is sampled before the tick whose squeeze evicts
    the caches, whose pages go back at once; the next samples fall by them whatever the
    collection does. Every 30 s the squeeze evicts 5 MiB (over the RSS mark) and the
    collection and trim give nothing: the full returns must back off, not come every 120 s."""
    machine = MemoryReturn(budget=256 * MIB)
    rss, fulls = 200 * MIB, []
    for n in range(80):
        at = n * MIN_INTERVAL_MS
        machine.seen(100 * MIB)
        for effect in machine.observe(95 * MIB, at, over_rss=True, rss=rss, evicted=5 * MIB):
            if effect.full:
                fulls.append(at)
        rss -= 5 * MIB  # the evicted pages went back; the collection gave nothing
        machine.observe(95 * MIB, at + 1_000, over_rss=True, rss=rss)
        rss += 5 * MIB  # and the load brings it back up before the next squeeze
    gaps = [b - a for a, b in itertools.pairwise(fulls)]
    assert gaps[:3] == [2 * FULL_MIN_INTERVAL_MS, 4 * FULL_MIN_INTERVAL_MS, FULL_MAX_INTERVAL_MS]
    assert machine.full_interval_ms == FULL_MAX_INTERVAL_MS


def test_without_rss_the_back_off_stays_at_its_least() -> None:
    machine = MemoryReturn(budget=256 * MIB)
    done = []
    for n in range(9):
        machine.observe(100 * MIB, n * MIN_INTERVAL_MS - 1)
        done += [e.full for e in machine.observe(50 * MIB, n * MIN_INTERVAL_MS)]
    assert done == [True, False, False, False, True, False, False, False, True]


def test_the_port_collects_the_young_generations_only_for_a_light_return(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import gc
    from unittest import mock

    returner = MemoryReturner(trim=None)
    with mock.patch.object(gc, "collect", wraps=gc.collect) as collect:
        returner(1, full=False)
        returner(1, full=True)
    assert [c.args for c in collect.call_args_list] == [(1,), ()]


def _core_with_a_topic() -> BrokerCore:
    """A core under a 16 MiB budget with one non-reliable topic."""
    core = BrokerCore(
        BrokerIdentity("http://b:1", "http://b:1"),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(10, 1 << 20),
        memory=split(16 * MIB),
    )
    core.bootstrap(["default"])
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)
    return core


def test_the_core_emits_it_at_a_tick_after_the_state_drops() -> None:
    core = _core_with_a_topic()
    core.transport_open(streams=200, connections=1)  # 3.6 MiB of streams
    assert not [e for e in core.tick(0).effects if isinstance(e, ReturnMemory)]
    core.transport_open(streams=0, connections=0)  # they closed
    returned = [e for e in core.tick(100).effects if isinstance(e, ReturnMemory)]
    assert len(returned) == 1 and returned[0].freed >= 1 * MIB


def test_idle_caches_are_emptied_and_busy_ones_kept() -> None:
    ledger = CacheLedger(10 * MIB, idle_ms=1_000)
    idle, busy = HotCache(MIB, "/default/idle", ledger), HotCache(MIB, "/default/busy", ledger)
    ledger.evict_idle(0)
    idle.put(0, [b"x" * 100], 200)
    busy.put(0, [b"y" * 100], 200)
    for now in range(100, 2_100, 100):
        ledger.evict_idle(now)
        busy.put(now, [b"y" * 100], 200)
    assert idle.oldest is None and idle.bytes == 0
    assert busy.bytes > 0 and ledger.total == busy.bytes
    assert ledger.idle_evicted_bytes == 200
    assert not [c for c in ledger._active if c is idle], "an emptied cache is not kept"


def test_a_wall_clock_stepped_back_does_not_keep_idle_caches() -> None:
    """Review finding: the pools were timed by the core's wall clock; stepped back an hour,
    no idle cache was emptied for an hour. They take the monotonic clock now
    (`BrokerCore.tick(now_ms, monotonic_ms)`), and the ledger still survives a step back.
    And a cache filled before the first tick (stamped 0) was emptied at that tick."""
    wall = 1_764_000_000_000
    ledger = CacheLedger(10 * MIB, idle_ms=60_000)
    early = HotCache(MIB, "/default/early", ledger)
    early.put(0, [b"x"], 100)  # before any tick
    ledger.evict_idle(wall)
    assert early.bytes == 100, "not idle at the first tick"
    ledger.evict_idle(wall - 3_600_000)  # the clock goes back an hour
    ledger.evict_idle(wall - 3_600_000 + 61_000)  # a minute of real time later
    assert early.bytes == 0 and ledger.total == 0


def test_the_core_times_the_pools_on_the_monotonic_clock() -> None:
    core = _core_with_a_topic()
    core.transport_open(streams=200, connections=1)
    core.tick(1_764_000_000_000, 0)
    core.transport_open(streams=0, connections=0)
    assert [e for e in core.tick(1_764_000_000_100, 100).effects if isinstance(e, ReturnMemory)]
    core.transport_open(streams=200, connections=1)
    core.tick(1_764_000_000_200, 200)
    core.transport_open(streams=0, connections=0)
    # the wall clock went back an hour, 30 s of monotonic time later: a return is due
    later = 100 + MIN_INTERVAL_MS
    returned = core.tick(1_764_000_000_000 - 3_600_000, later).effects
    assert [e for e in returned if isinstance(e, ReturnMemory)]


def test_without_an_idle_time_nothing_is_emptied() -> None:
    ledger = CacheLedger(10 * MIB)
    cache = HotCache(MIB, "/default/t", ledger)
    cache.put(0, [b"x"], 100)
    ledger.evict_idle(10**9)
    assert cache.bytes == 100


def test_a_released_cache_is_not_kept_by_the_ledger() -> None:
    ledger = CacheLedger(10 * MIB, idle_ms=1_000)
    cache = HotCache(MIB, "/default/t", ledger)
    cache.put(0, [b"x"], 100)
    cache.release()
    assert cache not in ledger._active


def test_the_port_collects_trims_and_logs_the_rss_before_and_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trims: list[int] = []
    returner = MemoryReturner(trim=lambda: trims.append(1))
    with caplog.at_level(logging.INFO, logger="danube.runtime"):
        returner(20 * MIB)
        returner.wait(10)
    assert trims == [1]
    assert "event=memory_returned accounted_fell=20971520" in caplog.text
    assert "rss_before=" in caplog.text and rss_bytes() is not None
    assert "gc_ms=" in caplog.text and "trim_ms=" in caplog.text and "stall_ms=" in caplog.text


def test_the_trim_runs_off_the_loop_and_the_stall_is_the_collection_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The trim held the loop most of a return's 0.4-1.1 s with 1,000 topics (issue 28 part
    6): it runs in a worker thread, and the caller is back before it ends."""
    import re
    import threading

    release = threading.Event()
    where: list[str] = []

    def slow_trim() -> None:
        where.append(threading.current_thread().name)
        release.wait(10)

    returner = MemoryReturner(trim=slow_trim)
    with caplog.at_level(logging.INFO, logger="danube.runtime"):
        returner(1)  # returns while the trim waits
        assert "event=memory_returned" not in caplog.text
        release.set()
        returner.wait(10)
    assert where == ["danube-malloc-trim"]
    stall = float(re.search(r"stall_ms=([\d.]+)", caplog.text).group(1))  # type: ignore[union-attr]
    gc_ms = float(re.search(r"gc_ms=([\d.]+)", caplog.text).group(1))  # type: ignore[union-attr]
    assert stall == gc_ms


def test_inline_the_trim_runs_on_the_caller() -> None:
    import threading

    where: list[str] = []
    returner = MemoryReturner(trim=lambda: where.append(threading.current_thread().name),
                              in_thread=False)  # fmt: skip
    returner(1)
    assert where == [threading.current_thread().name]


def test_without_glibc_the_trim_is_a_no_op_said_once(caplog: pytest.LogCaptureFixture) -> None:
    returner = MemoryReturner(trim=None)
    with caplog.at_level(logging.INFO, logger="danube.runtime"):
        returner(1)
        returner(1)
    assert caplog.text.count("event=malloc_trim_absent") == 1
    assert caplog.text.count("event=memory_returned") == 2


def test_glibc_trim_is_found_here() -> None:
    """This machine has glibc: the default returner trims (a real call)."""
    returner = MemoryReturner()
    assert returner._trim is not None
    returner(0)
    returner.wait(10)


def test_over_rss_a_return_needs_something_freed_since_the_last() -> None:
    """A process over the RSS mark by its own baseline (a small budget) collected every
    `MIN_INTERVAL_MS` for ever, for nothing (review finding): over the mark, a return needs
    a quarter of a large drop since the last one (what the squeeze evicted)."""
    machine = MemoryReturn(budget=64 * MIB)
    assert machine.observe(10 * MIB, 0, over_rss=True) == ()
    assert machine.observe(5 * MIB, 1_000, over_rss=True) == (ReturnMemory(5 * MIB),)
    for step in range(1, 10):  # squeezed for good, nothing left to free: no more returns
        assert machine.observe(5 * MIB, 1_000 + step * MIN_INTERVAL_MS, over_rss=True) == ()
    later = 1_000 + 10 * MIN_INTERVAL_MS
    assert machine.observe(9 * MIB, later, over_rss=True) == ()
    assert machine.observe(5 * MIB, later + 1, over_rss=True) == (ReturnMemory(4 * MIB),)
    assert machine.returns == 2
