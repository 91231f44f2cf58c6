"""Topics, subscriptions and consumers in the memory budget (spec/memory.md, "State"): they are
charged to the cache pool (which shrinks, evicting cached batches), and creating one more is
refused RESOURCE_EXHAUSTED, with nothing created, once they hold their share."""

from __future__ import annotations

import random

import pytest

from danube.machines.dispatch import QueueLimits
from danube.machines.memory.budget import MIB, split
from danube.machines.memory.state import (
    CONNECTION_BYTES,
    CONSUMER_BYTES,
    CONSUMER_WITH_STREAM_BYTES,
    STATE_SHARE,
    STREAM_BYTES,
    SUBSCRIPTION_BYTES,
    TOPIC_BYTES,
    topic_costs,
)
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.values.config import DispatchStrategy, Policies
from danube.values.errors import DanubeError, ErrorCode


def _core(budget: int = 16 * MIB) -> BrokerCore:
    core = BrokerCore(
        BrokerIdentity("http://b:1", "http://b:1"),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(10, 1 << 20),
        memory=split(budget),
    )
    core.bootstrap(["default"])
    return core


def test_topics_fill_their_share_then_one_more_is_refused_and_nothing_is_created() -> None:
    core = _core()
    pool, ledger = core.state_pool, core.cache_ledger
    assert pool is not None and ledger is not None and core.memory is not None
    assert pool.limit == int(core.memory.cache * STATE_SHARE)
    fits = pool.limit // TOPIC_BYTES
    for index in range(fits):
        core.create_topic(f"/default/t{index}", DispatchStrategy.RELIABLE)
    with pytest.raises(DanubeError) as refused:
        core.create_topic("/default/one-more", DispatchStrategy.RELIABLE)
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert (
        "--memory-budget" in refused.value.message
        and "Nothing was created" in refused.value.message
    )
    assert "/default/one-more" not in core.topics("default") and pool.refused == 1
    with pytest.raises(DanubeError):  # a producer would create it: refused the same way
        core.create_producer(
            "/default/one-more", "p", access_mode=0, strategy=DispatchStrategy.RELIABLE
        )
    core.tick(0)
    assert ledger.state == pool.used == fits * TOPIC_BYTES
    assert ledger.pool == core.memory.cache - ledger.state  # the caches gave way
    core.delete_topic("/default/t0")
    core.tick(1)  # what is gone is given back at the next tick
    assert pool.used == (fits - 1) * TOPIC_BYTES
    core.create_topic("/default/one-more", DispatchStrategy.RELIABLE)


def test_subscriptions_and_consumers_are_counted_and_refused_past_the_share() -> None:
    core = _core()
    pool = core.state_pool
    assert pool is not None
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)  # no WAL to load first
    core.subscribe("/default/t", "c0", "s0", 0, ())
    core.tick(0)
    assert core.state_counts() == (1, 1, 1)
    assert pool.used == TOPIC_BYTES + SUBSCRIPTION_BYTES + CONSUMER_BYTES
    index = 1
    with pytest.raises(DanubeError) as refused:
        while True:
            core.subscribe("/default/t", f"c{index}", f"s{index}", 0, ())
            index += 1
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert f"s{index}" not in core.subscriptions("/default/t")
    core.unsubscribe("/default/t", "s1")
    core.tick(1)
    assert core.state_counts()[1] == index - 1  # the count follows unsubscribe


def test_open_streams_and_connections_are_charged_to_the_cache_pool_and_leave_less_room() -> None:
    """The soak's load holds 2,000 streams on one connection: the runtime reports them at each
    tick and the state pool charges them (bench/stream_memory.py), so the cache pool shrinks
    and fewer topics fit; they are given back when the streams close."""
    core = _core()
    pool, ledger = core.state_pool, core.cache_ledger
    assert pool is not None and ledger is not None and core.memory is not None
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)
    core.tick(0)
    assert pool.used == TOPIC_BYTES
    core.transport_open(streams=200, connections=3)
    charged = TOPIC_BYTES + 200 * STREAM_BYTES + 3 * CONNECTION_BYTES
    assert pool.used == ledger.state == charged
    assert ledger.pool == core.memory.cache - charged  # the caches gave way at once
    room = (pool.limit - charged) // TOPIC_BYTES
    for index in range(room):
        core.create_topic(f"/default/more{index}", DispatchStrategy.NON_RELIABLE)
    with pytest.raises(DanubeError) as refused:
        core.create_topic("/default/one-more", DispatchStrategy.NON_RELIABLE)
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    core.transport_open(streams=0, connections=0)  # the streams closed
    assert pool.used == (1 + room) * TOPIC_BYTES
    core.create_topic("/default/one-more", DispatchStrategy.NON_RELIABLE)


def test_a_consumer_and_its_stream_are_charged_once_and_its_creation_counts_the_stream() -> None:
    """`CONSUMER_WITH_STREAM_BYTES` was measured with the consumer's receive stream open, and
    the stream is charged as a stream: the consumer itself is charged what is left of it, so
    the pair costs about what was measured (it cost both, 30 KiB, before). Its creation is
    weighed with the stream it is about to open."""
    measured = max(CONSUMER_WITH_STREAM_BYTES, STREAM_BYTES)
    charged = CONSUMER_BYTES + STREAM_BYTES
    assert charged <= measured + 1024
    core = _core()
    pool = core.state_pool
    assert pool is not None
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)
    core.subscribe("/default/t", "c0", "s0", 0, ())
    core.transport_open(streams=1, connections=1)  # its receive stream, its connection
    core.tick(0)
    pair = CONSUMER_BYTES + STREAM_BYTES
    assert pool.used == TOPIC_BYTES + SUBSCRIPTION_BYTES + pair + CONNECTION_BYTES
    # fill to just under what one more subscription with its consumer and stream needs
    pool.used = pool.limit - SUBSCRIPTION_BYTES - pair + 1
    assert pool.refusal(what="consumer", subscriptions=1, consumers=1) is not None
    pool.used -= 1
    assert pool.refusal(what="consumer", subscriptions=1, consumers=1) is None


def test_tiered_and_replicated_topics_are_charged_what_they_add() -> None:
    # TOPIC_BYTES was measured untiered and standalone; an idle uploader (about 1.5 KiB) and
    # an owner's replication state with two followers (about 3.1 KiB) come on top (review
    # finding: 6.5 KiB charged for about 9.5 and 11 KiB held)
    assert topic_costs(tiered=False, replicated=False) == (
        TOPIC_BYTES,
        SUBSCRIPTION_BYTES,
        CONSUMER_BYTES,
    )
    assert topic_costs(tiered=True, replicated=False)[0] >= TOPIC_BYTES + 1_497
    assert topic_costs(tiered=False, replicated=True)[0] >= TOPIC_BYTES + 3_000
    assert topic_costs(tiered=True, replicated=True)[0] >= TOPIC_BYTES + 4_500
