"""The ids of producers gone, remembered compactly, bounded and charged to the state pool
(spec/memory.md, "Departed clients" and "State"; `danube.machines.node.remembered_producers`)."""

from __future__ import annotations

import tracemalloc

from danube.machines.memory.state import REMEMBERED_ID_BYTES
from danube.machines.node.remembered_producers import MAX_REMEMBERED, Gone, RememberedProducers
from danube.values.errors import ErrorCode
from tests.node.test_idle_producers import (
    IDLE_MS,
    SWEEP_MS,
    create,
    new_core,
    publish_error,
    tick_until,
)

BIG = (1 << 64) - 5
"""Producer ids are random u64s: most are past a signed 64-bit integer."""


def test_the_bound_holds_and_the_oldest_are_forgotten_first() -> None:
    ids = RememberedProducers(limit=5)
    ids.remember([1, 2, 3], Gone.EXPIRED, "/default/t")
    ids.remember([BIG, 4], Gone.MOVED, "/default/u")
    ids.remember([1], Gone.EXPIRED, "/default/t")  # again: the newest now
    ids.remember([6, 7], Gone.DELETED)
    assert ids.why(7) == (Gone.DELETED, ""), "answered while pending"
    assert len(ids) <= 5 + 3, "the bound, and what waits to be merged"
    ids.merge()
    assert len(ids) == 5
    assert 2 not in ids and 3 not in ids, "the two oldest went first"
    assert ids.why(1) == (Gone.EXPIRED, "/default/t"), "remembered again, so kept"
    assert ids.why(BIG) == (Gone.MOVED, "/default/u")
    assert ids.why(6) == (Gone.DELETED, "")
    assert ids.why(0) is None and ids.why(1 << 64) is None and ids.why(5) is None


def test_a_deleted_topics_producers_do_not_hide_a_move_or_an_expiry() -> None:
    ids = RememberedProducers()
    ids.remember([10], Gone.MOVED, "/default/t")
    ids.remember_deleted([10, 11])
    assert ids.why(10) == (Gone.MOVED, "/default/t")
    assert ids.why(11) == (Gone.DELETED, "")


def test_an_id_costs_about_25_bytes() -> None:
    """tracemalloc over `MAX_REMEMBERED` ids in batches of 100 (a topic's producers at a
    time): within the accounted `REMEMBERED_ID_BYTES`. The dicts before held 107
    (bench/departed_sweep.py)."""
    topics = [f"/default/t{n}" for n in range(MAX_REMEMBERED // 100)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ids = RememberedProducers()
    for n, topic in enumerate(topics):
        ids.remember(range(BIG - n * 100, BIG - n * 100 - 100, -1), Gone.EXPIRED, topic)
    ids.merge()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(ids) == MAX_REMEMBERED
    assert used / len(ids) <= REMEMBERED_ID_BYTES, used / len(ids)
    assert ids.nbytes() == 25 * len(ids)


def test_the_charge_follows_the_count() -> None:
    core = new_core()
    pool = core.state_pool
    assert pool is not None
    create(core, "a")
    create(core, "b")
    core.tick(0)
    before = pool.used
    tick_until(core, 100, IDLE_MS + SWEEP_MS)
    assert len(core.producers.remembered) == 2
    core.tick(IDLE_MS + 2 * SWEEP_MS)
    assert pool.remembered_bytes == 2 * REMEMBERED_ID_BYTES
    assert pool.used == before + 2 * REMEMBERED_ID_BYTES, "charged by the tick after"


def test_a_forgotten_id_gets_what_an_unknown_id_gets() -> None:
    core = new_core()
    core.producers.remembered.limit = 1
    old = create(core, "a")
    tick_until(core, 0, IDLE_MS + SWEEP_MS)
    new = create(core, "b")
    tick_until(core, IDLE_MS + 2 * SWEEP_MS, 2 * IDLE_MS + 3 * SWEEP_MS)
    assert old not in core.producers.remembered and new in core.producers.remembered
    assert "expired" in publish_error(core, new).message
    forgotten, unknown = publish_error(core, old), publish_error(core, 4242)
    assert forgotten.code is unknown.code is ErrorCode.UNAVAILABLE
    assert forgotten.message == unknown.message.replace("4242", str(old))
    # of a deleted topic: NOT_FOUND while remembered, then what an unknown id gets
    gone = create(core, "c", "/default/gone")
    core.delete_topic("/default/gone")
    assert publish_error(core, gone).code is ErrorCode.NOT_FOUND
    create(core, "d", "/default/t")  # /default/t served: an unknown id there is UNAVAILABLE
    core.producers.remembered.remember([BIG], Gone.DELETED)  # forgets `gone` (limit 1)
    assert gone not in core.producers.remembered
    assert publish_error(core, gone).code is ErrorCode.UNAVAILABLE
