"""Per-message cost of the pure non-reliable dispatch path (no I/O), by subscription type.

.venv/bin/pytest bench/test_dispatch_bench.py --benchmark-only
"""

from __future__ import annotations

import random

import pytest

from danube.machines.dispatch import QueueLimits, SubscriptionType
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.values.config import DispatchStrategy, Policies

BATCH = 1000


def _core_with(
    sub_type: SubscriptionType, consumers: int
) -> tuple[BrokerCore, int, list[tuple[int, int]]]:
    core = BrokerCore(
        BrokerIdentity("http://127.0.0.1:6650", "http://127.0.0.1:6650"),
        rng=random.Random(7),
        default_policies=Policies(),
        queue_limits=QueueLimits(max_messages=BATCH * 2),
    )
    core.bootstrap(["default"])
    producer = core.create_producer(
        "/default/bench", "p", access_mode=0, strategy=DispatchStrategy.NON_RELIABLE
    ).value
    ids = []
    for i in range(consumers):
        consumer_id = core.subscribe("/default/bench", f"c{i}", "sub", int(sub_type), ()).value
        ids.append((consumer_id, core.open_stream(consumer_id).value))
    return core, producer, ids


@pytest.mark.parametrize(
    ("sub_type", "consumers"),
    [
        (SubscriptionType.EXCLUSIVE, 1),
        (SubscriptionType.SHARED, 4),
        (SubscriptionType.KEY_SHARED, 4),
    ],
)
def test_publish_and_take_1000(benchmark, sub_type: SubscriptionType, consumers: int) -> None:
    core, producer, consumer_ids = _core_with(sub_type, consumers)
    keys = [f"key-{i % 64}".encode() for i in range(BATCH)]
    payload = b"x" * 1024

    def publish_batch() -> int:
        for key in keys:
            core.publish(producer, "/default/bench", payload, len(payload), key)
        taken = 0
        for consumer_id, generation in consumer_ids:
            taken += len(core.take(consumer_id, generation, BATCH) or [])
        return taken

    assert benchmark(publish_batch) == BATCH
