"""Producers of clients that left are removed after `producer_idle_ms` with neither a publish
nor a health check (spec/memory.md, "Departed clients"; `danube.machines.node.idle_producers`)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from danube.machines.dispatch import QueueLimits
from danube.machines.memory.budget import split
from danube.machines.node.core import BrokerCore, BrokerIdentity, PersistMeta
from danube.machines.node.idle_producers import (
    SHORT_IDLE_MS,
    SWEEP_MS,
    IdleSweep,
    short_timeout_warning,
)
from danube.values.config import DispatchStrategy, Policies, config_from_mapping
from danube.values.errors import DanubeError, ErrorCode

URL = "http://127.0.0.1:6650"
NR = DispatchStrategy.NON_RELIABLE
IDLE_MS = 10_000


def new_core(idle_ms: int = IDLE_MS) -> BrokerCore:
    memory = dataclasses.replace(split(64 * 1024 * 1024), producer_idle_ms=idle_ms)
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
        memory=memory,
    )
    core.bootstrap(["default"])
    return core


def create(core: BrokerCore, name: str = "p", topic: str = "/default/t") -> int:
    return core.create_producer(topic, name, access_mode=0, strategy=NR).value


def tick_until(core: BrokerCore, start_ms: int, end_ms: int) -> list[PersistMeta]:
    """Ticks every 100 ms from `start_ms` to `end_ms` (included); the metadata changes."""
    changes = []
    for now in range(start_ms, end_ms + 1, 100):
        changes.extend(e for e in core.tick(now).effects if isinstance(e, PersistMeta))
    return changes


def publish_error(core: BrokerCore, pid: int) -> DanubeError:
    with pytest.raises(DanubeError) as caught:
        core.publish(pid, "/default/t", "m", 1, b"")
    return caught.value


def test_an_idle_producer_is_removed_after_the_timeout_and_not_before() -> None:
    core = new_core()
    pid = create(core)
    assert tick_until(core, 0, IDLE_MS - 100) == []
    assert core.producer_healthy(pid), "not before the timeout"
    core = new_core()
    pid = create(core)
    changes = tick_until(core, 0, IDLE_MS + SWEEP_MS)
    assert [c.deletes for c in changes] == [(f"/topics/default/t/producers/{pid}",)]
    assert not core.producer_healthy(pid), "its health check answers CLOSE"
    assert core.producers.expired == 1
    error = publish_error(core, pid)
    assert error.code is ErrorCode.UNAVAILABLE, "Danube's clients retry, then create again"
    assert "expired" in error.message and f"{IDLE_MS} ms" in error.message
    again = create(core)
    assert again != pid, "its name is free: a new producer, not the expired one"
    assert core.producer_healthy(again)


def test_publishes_and_health_checks_keep_a_producer() -> None:
    core = new_core()
    publishing, checked, idle = create(core, "a"), create(core, "b"), create(core, "c")
    for now in range(0, 5 * IDLE_MS, 100):
        if now % 3_000 == 0:
            core.publish(publishing, "/default/t", "m", 1, b"")
            assert core.producer_healthy(checked)
        core.tick(now)
    assert core.producer_healthy(publishing)
    assert core.producer_healthy(checked)
    assert not core.producer_healthy(idle)


def test_a_refused_publish_counts_as_activity() -> None:
    """A client whose publishes are refused (too large, say) is still there."""
    core = new_core()
    pid = create(core)
    for now in range(0, 3 * IDLE_MS, 100):
        if now % 3_000 == 0:
            with pytest.raises(DanubeError):
                core.publish(pid, "/default/other", "m", 1, b"")
        core.tick(now)
    assert core.producer_healthy(pid)


def test_zero_keeps_producers_for_ever() -> None:
    core = new_core(idle_ms=0)
    pid = create(core)
    assert tick_until(core, 0, 20 * IDLE_MS) == []
    assert core.producer_healthy(pid)


def test_a_clock_set_back_expires_no_one() -> None:
    core = new_core()
    pid = create(core)
    core.tick(50_000)
    core.tick(1_000)  # the clock went back 49 s
    for now in range(1_100, 1_000 + IDLE_MS - 100, 100):
        core.tick(now)
    assert pid in core.producers.by_id  # (a health check would count as activity)
    core.tick(1_000 + IDLE_MS + SWEEP_MS)
    assert pid not in core.producers.by_id, "the sweep goes on after the clock went back"


def test_a_negative_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="producer_idle_ms"):
        IdleSweep(-1)


def test_the_timeout_is_configured_with_a_safe_default() -> None:
    assert config_from_mapping({}).producer_idle_timeout_ms == 600_000, "ten minutes (spec)"
    config = config_from_mapping({"broker": {"producer_idle_timeout_ms": 0}})
    assert config.producer_idle_timeout_ms == 0
    with pytest.raises(Exception, match="producer_idle_timeout_ms"):
        config_from_mapping({"broker": {"producer_idle_timeout_ms": -5}})


def test_an_unknown_id_on_a_served_topic_is_unavailable_and_elsewhere_not_found() -> None:
    """After a restart the broker no longer knows why an id is missing (an expiry is not
    remembered across it): to a topic it serves, UNAVAILABLE, which Danube's clients recover
    from by creating the producer again; NOT_FOUND reached the application (review finding)."""
    core = new_core()
    create(core)
    error = publish_error(core, 4242)
    assert error.code is ErrorCode.UNAVAILABLE, error
    assert "4242" in error.message and "create the producer again" in error.message
    with pytest.raises(DanubeError) as caught:
        core.publish(4242, "/default/never-served", "m", 1, b"")
    assert caught.value.code is ErrorCode.NOT_FOUND


def test_expiries_of_two_topics_are_written_one_topic_at_a_time() -> None:
    """Each metadata write is fenced by its topic's claim: one write for all topics made one
    topic claimed away meanwhile refuse every other topic's deletes (review finding)."""
    core = new_core()
    first = create(core, "a", "/default/t")
    second = create(core, "b", "/default/u")
    changes = tick_until(core, 0, IDLE_MS + SWEEP_MS)
    assert sorted(c.deletes for c in changes) == [
        (f"/topics/default/t/producers/{first}",),
        (f"/topics/default/u/producers/{second}",),
    ]


def test_a_producer_of_a_deleted_topic_stays_not_found_when_the_topic_is_back() -> None:
    """Danube's answer for a producer whose topic was deleted is NOT_FOUND, also once the
    topic is created again (the conformance scenario, tests/conformance/test_official_client.py);
    only an id the broker cannot place is UNAVAILABLE (CI found the difference)."""
    core = new_core()
    pid = create(core)
    core.delete_topic("/default/t")
    create(core, "other")
    assert publish_error(core, pid).code is ErrorCode.NOT_FOUND


def test_a_timeout_shorter_than_a_few_health_checks_is_warned_of() -> None:
    assert short_timeout_warning(0) is None, "0: never removed"
    assert short_timeout_warning(SHORT_IDLE_MS) is None
    warning = short_timeout_warning(1_500)
    assert warning is not None and "timeout_ms=1500" in warning and "5 s" in warning
