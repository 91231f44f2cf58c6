"""What a publish in flight costs (issue 28, spec/memory.md "Back-pressure"): the constants of
`danube.machines.memory.publish` (`send_cost`, `batch_cost`).

Holds N publishes of a reliable topic in flight in a fresh core, each suspended where a real
one waits for its storage (`AwaitStored`, after its step went to the WAL machine and before a
write completed), and measures with tracemalloc what they hold beyond the hot cache (which the
cache ledger accounts on its own, `WalMachine.cached_bytes`): the decoded `Record` and its
payload, the WAL's pending frame, the step and its effects, the flow's generator frames; for
a batch, the frame it arrived in (the checked batch holds it until it is answered). A plain
send's wire bytes are not counted (grpclib frees them once decoded), nor the runtime's
per-call state (its asyncio task, grpclib's stream, h2's window state).

    PYTHONPATH=src:. python -m bench.publish_memory --requests 5000

Prints, per payload size and path, the measured bytes per request and what the pool accounts.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import tracemalloc
from typing import Any

from danube.effects.flow import Finished, step
from danube.machines.dispatch import QueueLimits
from danube.machines.memory.publish import batch_cost, send_cost
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.machines.requests import publish
from danube.machines.requests.effects import AwaitStored
from danube.machines.wal import format, records
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies

TOPIC = "/default/t"
URL = "http://127.0.0.1:6650"
NOW = 1_700_000_000_000
QUEUED_LIMIT = 48 * 1024 * 1024
"""Frames never written pile up in the WAL's queue, which refuses past 64 MiB
(`MAX_QUEUED_WAL_BYTES`): the cases stay below it."""


def _core() -> tuple[BrokerCore, int]:
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
    )
    driver = CoreDriver(core)
    driver.run(core.bootstrap(["default"]).effects)
    created = core.create_producer(TOPIC, "p", access_mode=0, strategy=DispatchStrategy.RELIABLE)
    driver.run(created.effects)
    return core, created.value


def _suspended(flow: Any) -> Any:
    """Answers the flow (never fenced, its step left to the machine) up to its storage wait."""
    request = step(flow)
    while not isinstance(request, AwaitStored):
        if isinstance(request, Finished):
            raise RuntimeError(f"the publish ended before its storage wait: {request}")
        request = step(flow, answer=None)
    return flow


def _send_wires(producer_id: int, payload: int, count: int) -> list[bytes]:
    return [
        records.encode(
            records.Record(
                payload=os.urandom(payload),
                producer_id=producer_id,
                topic_name=TOPIC,
                broker_addr=URL,
                producer_name="p",
                publish_time=NOW,
                request_id=index,
                has_msg_id=True,
            )
        )
        for index in range(count)
    ]


def _batch_frames(payload: int, per_batch: int, count: int) -> list[bytes]:
    return [
        format.encode_frame(
            0,
            0,
            [
                records.encode(records.Record(payload=os.urandom(payload), has_msg_id=False))
                for _ in range(per_batch)
            ],
        )
        for _ in range(count)
    ]


def measure(path: str, payload: int, per_batch: int, requests: int) -> tuple[float, float]:
    """(measured bytes per request beyond the cache, accounted bytes per request)."""
    core, producer_id = _core()
    wal = core.topic_records()[0].log.wal
    assert wal is not None
    if path == "send":
        inputs = _send_wires(producer_id, payload, requests)
    else:
        inputs = _batch_frames(payload, per_batch, requests)
    gc.collect()
    tracemalloc.start()
    before, cached_before = tracemalloc.get_traced_memory()[0], wal.cached_bytes
    held = []
    accounted = 0
    for data in inputs:
        if path == "send":
            record = records.decode(data)
            accounted += send_cost(len(record.payload))
            flow = publish.publish_one(core, record, lambda: NOW, monotonic=lambda: NOW)
        else:
            request = publish.BatchRequest(producer_id, TOPIC, data)
            accounted += batch_cost(len(data), per_batch)
            flow = publish.publish_batch(core, request, lambda: NOW, monotonic=lambda: NOW)
        held.append(_suspended(flow))
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    beyond_cache = after - before - (wal.cached_bytes - cached_before)
    if path == "batch":  # the request holds the frame it arrived in until it is answered
        beyond_cache += sum(len(frame) for frame in inputs)
    return beyond_cache / requests, accounted / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5_000)
    args = parser.parse_args()
    measure("send", 16, 1, 100)  # warm up: first-call allocations (kernels, caches) not counted
    print(
        f"{'path':6} {'payload':>8} {'batch':>6} {'measured/req':>13} {'accounted/req':>14} ratio"
    )
    for path, per_batch in (("send", 1), ("batch", 10), ("batch", 100)):
        for payload in (16, 256, 4_096, 65_536):
            requests = max(50, args.requests * 16 // max(16, payload * per_batch // 16))
            requests = min(requests, args.requests, QUEUED_LIMIT // (payload * per_batch))
            measured, accounted = measure(path, payload, per_batch, requests)
            print(
                f"{path:6} {payload:>8} {per_batch:>6} {measured:>13.0f} {accounted:>14.0f} "
                f"{accounted / measured:.2f}"
            )


if __name__ == "__main__":
    main()
