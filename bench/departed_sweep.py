"""The departed-subscriptions sweep's CPU (issue 28, spec/memory.md "Departed clients"):
`DepartedSubscriptions.tick`, the pure machine, over a topic table of `--topics` reliable
topics, each with one subscription whose consumer is connected (`--subscribed`, the
fraction of topics that have one; the rest have none), plus `--departed` subscriptions whose
consumer left holding a record. The grace is long, so nothing is let go: every sweep looks
at the same state. Runs against any tree (`PYTHONPATH`): a sweep that walks every topic and
one that visits the noted subscriptions alone (`ReliableLogs.unconnected`, noted here as the
dispatch path would have).

    PYTHONPATH=src:. nice -n 10 python -m bench.departed_sweep --topics 100000

Prints one JSON object: microseconds per sweep (median, min, max over `--sweeps`).

`--remembered N`: instead, the bytes (tracemalloc) of N remembered ids of expired producers
(random u64s, 100 a topic), in `RememberedProducers` and in the dict of (topic, timeout)
tuples they were kept in before.

    PYTHONPATH=src:. python -m bench.departed_sweep --remembered 100000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc
from typing import Any

from danube.machines.dispatch import SubscriptionType
from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.node.departed_subscriptions import SWEEP_MS, DepartedSubscriptions
from danube.machines.node.records import SubscriptionRecord, TopicRecord
from danube.machines.node.topic_table import TopicTable
from danube.values.config import DispatchStrategy
from danube.values.names import parse_topic


class _Logs:
    """What the sweep reads of `ReliableLogs` when it lets nothing go."""

    unconnected: dict[tuple[str, str], None] | None = None
    consumer_pool = None


def _subscription(record: TopicRecord, *, connected: bool) -> SubscriptionRecord:
    machine = ReliableSubscription(SubscriptionType.SHARED, 0, max_unacked_messages=1000)
    machine.add_consumer(1, "c", (), 0)
    sub = SubscriptionRecord("s", SubscriptionType.SHARED, machine, owner=record)
    if connected:
        machine.connect(1, 0)
    else:
        sub.records = {0: b"x"}
    record.subscriptions["s"] = sub
    return sub


def build(topics: int, subscribed: float, departed: int) -> tuple[TopicTable, _Logs]:
    table = TopicTable()
    logs = _Logs()
    every = round(1 / subscribed) if subscribed else 0
    for n in range(topics):
        record = TopicRecord(parse_topic(f"/default/t{n}"), DispatchStrategy.RELIABLE)
        if every and n % every == 0:
            _subscription(record, connected=True)
        table[record.name.full] = record
    for n in range(departed):
        record = TopicRecord(parse_topic(f"/default/d{n}"), DispatchStrategy.RELIABLE)
        _subscription(record, connected=False)
        table[record.name.full] = record
    table.touched.clear()
    return table, logs


def run(topics: int, subscribed: float, departed: int, sweeps: int) -> dict[str, Any]:
    table, logs = build(topics, subscribed, departed)
    machine = DepartedSubscriptions(logs, table, {}, grace_ms=3_600_000)  # type: ignore[arg-type]
    noted = logs.unconnected
    if noted is not None:  # as `ReliableLogs.dispatch` notes each consumer that left
        for n in range(departed):
            noted[f"/default/d{n}", "s"] = None
    now = 0
    times = []
    for _ in range(sweeps):
        now += SWEEP_MS
        start = time.perf_counter()
        machine.tick(now)
        times.append((time.perf_counter() - start) * 1e6)
    return {
        "topics": topics,
        "subscribed": subscribed,
        "departed": departed,
        "sweeps": sweeps,
        "visits_noted": noted is not None,
        "tracked": len(machine.idle_since),
        "us_per_sweep_median": round(statistics.median(times), 1),
        "us_per_sweep_min": round(min(times), 1),
        "us_per_sweep_max": round(max(times), 1),
    }


def remembered(count: int) -> dict[str, Any]:
    """Bytes per remembered id, the new arrays and the old dict (module docstring)."""
    from danube.machines.node.remembered_producers import Gone, RememberedProducers

    rng = random.Random(1)
    ids = [rng.randint(1, (1 << 64) - 1) for _ in range(count)]
    topics = [f"/default/t{n}" for n in range(count // 100 + 1)]
    out: dict[str, Any] = {"ids": count}
    for kind in ("arrays", "dict"):
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        if kind == "arrays":
            kept: Any = RememberedProducers(limit=count)
            for n in range(0, count, 100):
                kept.remember(ids[n : n + 100], Gone.EXPIRED, topics[n // 100])
            kept.merge()
        else:
            kept = {}
            for n, producer_id in enumerate(ids):
                kept[producer_id] = (topics[n // 100], 600_000)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        out[f"{kind}_bytes_per_id"] = round(used / count, 1)
        del kept
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--subscribed", type=float, default=1.0)
    parser.add_argument("--departed", type=int, default=10)
    parser.add_argument("--sweeps", type=int, default=30)
    parser.add_argument("--remembered", type=int, default=0)
    args = parser.parse_args()
    if args.remembered:
        print(json.dumps(remembered(args.remembered)))
        return
    print(json.dumps(run(args.topics, args.subscribed, args.departed, args.sweeps)))


if __name__ == "__main__":
    main()
