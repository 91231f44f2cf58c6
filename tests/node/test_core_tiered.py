"""Reliable topics with an object tier, in the broker core (spec/object-layout.md): sealed
segments become indexed objects, local retention deletes only what is indexed, a
subscription from the earliest offset reads history from objects and hands off to the local
WAL with no gap and no duplicate, and a broker with an empty disk continues the offsets and
serves the whole history from objects. The I/O runs in memory (`danube.testing`)."""

from __future__ import annotations

import random
from typing import Any

from danube.machines.dispatch import QueueLimits, StartKind, StartPosition
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.machines.tiering import UploaderConfig, layout, validate_index
from danube.machines.tiering.index import IndexEntry
from danube.machines.wal.machine import WalConfig
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies
from danube.values.names import parse_topic

URL = "http://127.0.0.1:6650"
TOPIC = "/default/history"
EARLIEST = StartPosition(StartKind.EARLIEST)
SMALL = WalConfig(segment_bytes=4096, retention_bytes=8192, cache_bytes=2048)


def new_core(seed: int = 1) -> BrokerCore:
    return BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(seed),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
        wal_config=SMALL,
        uploads=UploaderConfig(index_interval_bytes=512),
    )


def start(
    files: dict[str, dict[int, bytearray]] | None = None,
    objects: dict[str, bytes] | None = None,
    metadata: dict[str, Any] | None = None,
) -> CoreDriver:
    core = new_core()
    driver = CoreDriver(core, files, objects, dict(metadata or {}))
    if metadata is not None:
        driver.run(core.restore(dict(metadata)).effects)
    driver.run(core.bootstrap(["default"]).effects)
    return driver


def publish(driver: CoreDriver, producer_id: int, count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        payload = f"|m{i:04d}-" + "x" * 200
        step = driver.core.publish(
            producer_id, TOPIC, payload, len(payload), None,
            encode=lambda offset, p=payload: p.encode(), now_ms=driver.now_ms,
        )  # fmt: skip
        driver.run(step.effects)
        driver.now_ms += 10
        driver.run(driver.core.tick(driver.now_ms).effects)


def producer(driver: CoreDriver) -> int:
    step = driver.core.create_producer(
        TOPIC, "p", access_mode=0, strategy=DispatchStrategy.RELIABLE
    )
    driver.run(step.effects)
    return step.value


def read_all(driver: CoreDriver, name: str, expected: int) -> list[str]:
    core = driver.core
    step = core.subscribe(TOPIC, name, name, 0, (), EARLIEST, now_ms=driver.now_ms)
    driver.run(step.effects)
    opened = core.open_stream(step.value, now_ms=driver.now_ms)
    driver.run(opened.effects)
    received: list[str] = []
    offset = 0
    for _ in range(expected * 2):
        taken = core.take(step.value, opened.value, 1000)
        assert taken is not None
        for record in taken:
            received.append(record.decode().split("-", 1)[0].lstrip("|"))
            driver.run(core.ack(TOPIC, name, offset, now_ms=driver.now_ms).effects)
            offset += 1
        if len(received) >= expected:
            break
    return received


def index_of(driver: CoreDriver) -> list[IndexEntry]:
    return [
        IndexEntry.from_json(v)
        for k, v in sorted(driver.metadata.items())
        if k.startswith("/storage/topics/default/history/segments/0")
    ]


def test_sealed_segments_become_indexed_objects_and_only_those_leave_the_disk() -> None:
    driver = start()
    pid = producer(driver)
    publish(driver, pid, 120)
    index = index_of(driver)
    assert len(index) >= 3, "small segments rotate and upload"
    assert validate_index(index) == []
    assert {e.key for e in index} == set(driver.objects)
    local = sorted(driver.files[TOPIC])
    assert local[0] > 0, "retention pruned the oldest local segments"
    assert index[-1].next_offset >= local[0], "nothing left the disk before it was indexed"
    assert driver.halted == []


def test_earliest_subscription_reads_objects_then_hands_off_to_the_wal() -> None:
    driver = start()
    pid = producer(driver)
    publish(driver, pid, 120)
    assert min(driver.files[TOPIC]) > 0
    received = read_all(driver, "audit", 120)
    assert received == [f"m{i:04d}" for i in range(120)], "no gap, no duplicate, in order"


def test_an_empty_disk_continues_offsets_and_serves_history_from_objects() -> None:
    driver = start()
    pid = producer(driver)
    publish(driver, pid, 120)
    driver.run(driver.core.quiesce(driver.now_ms).effects)  # seal: the tail becomes an object
    indexed_next = index_of(driver)[-1].next_offset
    assert indexed_next == 120
    fresh = start(files={}, objects=driver.objects, metadata=driver.metadata)
    pid = producer(fresh)
    publish(fresh, pid, 5, first=120)
    received = read_all(fresh, "replay", 125)
    assert received == [f"m{i:04d}" for i in range(125)]


def test_deleting_a_topic_deletes_its_index_so_a_new_one_starts_empty() -> None:
    driver = start()
    pid = producer(driver)
    publish(driver, pid, 60)
    assert index_of(driver)
    driver.run(driver.core.delete_topic(TOPIC).effects)
    assert index_of(driver) == []
    pid = producer(driver)  # the same name again
    publish(driver, pid, 3)
    restarted = start(files=driver.files, objects=driver.objects, metadata=driver.metadata)
    assert read_all(restarted, "fresh", 3) == ["m0000", "m0001", "m0002"]


def test_an_index_path_holding_no_entry_makes_the_commit_retry_not_halt() -> None:
    """`tier_index_read`: what a failed compare finds is judged in the core. A value that is
    no index entry tells nothing about the commit's outcome, so the commit goes again; the
    simulator's driver used to parse it itself and raise."""
    driver = start()
    path = layout.index_path(parse_topic(TOPIC), 0)
    driver.metadata[path] = "not an entry"
    publish(driver, producer(driver), 30)
    assert driver.halted == []
    del driver.metadata[path]
    for _ in range(100):
        driver.now_ms += 1_000
        driver.run(driver.core.tick(driver.now_ms).effects)
    assert IndexEntry.from_json(driver.metadata[path]).start_offset == 0
