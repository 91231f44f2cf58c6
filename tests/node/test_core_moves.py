"""Topic moves in the broker core (cluster mode, spec/cluster.md "Topic moves"): an unloading
topic refuses publishes and clients, seals and uploads its tail, and only then may leave; the
next owner adopts it from the metadata and the objects, continues its offsets and keeps its
subscriptions' cursors. Two cores share one object store and one metadata dict, as two
brokers share S3 and etcd. The I/O runs in memory (`danube.testing`)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from danube.machines.cluster.ownership import load_entries, load_reads
from danube.machines.dispatch import QueueLimits, StartKind, StartPosition
from danube.machines.node import paths
from danube.machines.node.core import BrokerCore, BrokerIdentity, DropWal, LoadWal, TierIo
from danube.machines.tiering import ListObjects, UploaderConfig
from danube.machines.wal.machine import WalConfig
from danube.metadata.model import KeyValue
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic

TOPIC = "/default/moving"
NAME = parse_topic(TOPIC)
EARLIEST = StartPosition(StartKind.EARLIEST)
NO_ORPHAN_SCAN = UploaderConfig(orphan_scan_interval_ms=None)


def broker(
    port: int,
    objects: dict[str, bytes],
    metadata: dict[str, Any],
    uploads: UploaderConfig = NO_ORPHAN_SCAN,
) -> CoreDriver:
    url = f"http://127.0.0.1:{port}"
    core = BrokerCore(
        BrokerIdentity(url, url),
        rng=random.Random(port),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
        wal_config=WalConfig(segment_bytes=1 << 20),
        uploads=uploads,
        clustered=True,
    )
    driver = CoreDriver(core, {}, objects, metadata)
    driver.run(
        core.restore({k: v for k, v in metadata.items() if k.startswith("/namespaces/")}).effects
    )
    return driver


def shared_state() -> tuple[dict[str, bytes], dict[str, Any]]:
    """The store after a cluster broker created the topic (placement.ClusterPlacement)."""
    metadata: dict[str, Any] = {
        paths.namespace_policy("default"): {},
        paths.namespace_topic(NAME): None,
        paths.topic_delivery(NAME): DispatchStrategy.RELIABLE.label,
    }
    return {}, metadata


def topic_entries(metadata: dict[str, Any]) -> dict[str, Any]:
    """What the ownership driver reads before it adopts the topic (`load_reads`), as it
    hands it over (`load_entries`)."""
    prefixes, policy_key = load_reads(TOPIC)

    def kv(key: str) -> KeyValue:
        return KeyValue(key, metadata[key], 1, 1, 1, None)

    scanned = [kv(k) for k in sorted(metadata) if k.startswith(prefixes)]
    return load_entries(TOPIC, scanned, kv(policy_key) if policy_key in metadata else None)


CLAIMS = itertools.count(1)
"""Claim revisions: every adoption holds a newer claim than the one before."""


def adopt(driver: CoreDriver, *, keep_local: bool = False) -> list[Any]:
    step = driver.core.adopt(
        topic_entries(driver.metadata), keep_local=keep_local, epoch=next(CLAIMS)
    )
    return driver.run(step.effects)


def producer(driver: CoreDriver, name: str = "p") -> int:
    step = driver.core.create_producer(
        TOPIC, name, access_mode=0, strategy=DispatchStrategy.RELIABLE
    )
    driver.run(step.effects)
    return step.value


def publish(driver: CoreDriver, producer_id: int, first: int, count: int) -> None:
    for i in range(first, first + count):
        payload = f"m{i}"
        step = driver.core.publish(
            producer_id, TOPIC, payload, len(payload), None,
            encode=lambda offset, p=payload: p.encode(), now_ms=driver.now_ms,
        )  # fmt: skip
        driver.run(step.effects)
        driver.now_ms += 10
        driver.run(driver.core.tick(driver.now_ms).effects)


def consume(driver: CoreDriver, count: int, ack: int) -> list[str]:
    """Subscribes `audit` (from the earliest offset when new), takes up to `count` records
    and acknowledges the first `ack` of them."""
    core = driver.core
    step = core.subscribe(TOPIC, "c", "audit", 0, (), EARLIEST, now_ms=driver.now_ms)
    driver.run(step.effects)
    opened = core.open_stream(step.value, now_ms=driver.now_ms)
    driver.run(opened.effects)
    received: list[str] = []
    for _ in range(count * 2):
        taken = core.take(step.value, opened.value, count - len(received))
        assert taken is not None
        received += [record.decode() for record in taken]
        if len(received) >= count:
            break
        driver.now_ms += 10
        driver.run(core.tick(driver.now_ms).effects)
    for record in received[:ack]:
        driver.run(core.ack(TOPIC, "audit", int(record[1:]), now_ms=driver.now_ms).effects)
    return received


def unload(driver: CoreDriver) -> None:
    driver.run(driver.core.unload(TOPIC, driver.now_ms).effects)
    for _ in range(100):
        if driver.core.settled(TOPIC):
            break
        driver.now_ms += 10
        driver.run(driver.core.tick(driver.now_ms).effects)
    assert driver.core.settled(TOPIC)


def test_a_moved_topic_keeps_its_offsets_history_and_cursor() -> None:
    objects, metadata = shared_state()
    old = broker(6650, objects, metadata)
    adopt(old)
    publish(old, producer(old), 0, 10)
    assert consume(old, 10, ack=4) == [f"m{i}" for i in range(10)]
    unload(old)
    removed = old.core.remove(TOPIC, reason="moved", delete_files=True)
    assert DropWal(TOPIC, "moved", True) in removed.effects
    old.run(removed.effects)
    assert TOPIC not in old.files, "nothing is left on the old broker's disk"
    assert not old.core.serves(TOPIC)

    new = broker(6651, objects, metadata)
    adopt(new)
    assert new.core.serves(TOPIC)
    # The subscription resumes after its cursor: 0..3 were acknowledged on the old owner.
    assert consume(new, 6, ack=6) == [f"m{i}" for i in range(4, 10)]
    publish(new, producer(new), 10, 3)
    assert consume(new, 3, ack=3) == ["m10", "m11", "m12"], "offsets continue at 10"


def test_an_unloading_topic_refuses_publishes_and_new_clients() -> None:
    objects, metadata = shared_state()
    driver = broker(6650, objects, metadata)
    adopt(driver)
    pid = producer(driver)
    driver.run(driver.core.unload(TOPIC, driver.now_ms).effects)
    assert not driver.core.serves(TOPIC)
    with pytest.raises(DanubeError) as refused:
        publish(driver, pid, 0, 1)
    assert refused.value.code is ErrorCode.UNAVAILABLE
    with pytest.raises(DanubeError) as refused:
        producer(driver, "other")
    assert refused.value.code is ErrorCode.UNAVAILABLE
    with pytest.raises(DanubeError) as refused:
        driver.core.subscribe(TOPIC, "c", "s", 0, (), now_ms=driver.now_ms)
    assert refused.value.code is ErrorCode.UNAVAILABLE


def test_the_producer_of_a_topic_that_left_is_told_to_look_it_up_again() -> None:
    """UNAVAILABLE (not Danube's NOT_FOUND): every client retries it with a new lookup,
    which redirects it to the new owner."""
    objects, metadata = shared_state()
    driver = broker(6650, objects, metadata)
    adopt(driver)
    pid = producer(driver)
    unload(driver)
    driver.run(driver.core.remove(TOPIC, reason="moved", delete_files=True).effects)
    with pytest.raises(DanubeError) as refused:
        publish(driver, pid, 0, 1)
    assert refused.value.code is ErrorCode.UNAVAILABLE
    assert "moved to another broker" in refused.value.message
    assert not driver.core.producer_healthy(pid)


def test_a_clustered_core_never_creates_a_topic_itself() -> None:
    objects, metadata = shared_state()
    driver = broker(6650, objects, metadata)
    with pytest.raises(DanubeError) as refused:
        producer(driver)
    assert refused.value.code is ErrorCode.UNAVAILABLE
    assert TOPIC not in driver.core.served_topics()


def test_adopting_a_topic_already_served_loads_nothing() -> None:
    objects, metadata = shared_state()
    driver = broker(6650, objects, metadata)
    adopt(driver)
    step = driver.core.adopt(topic_entries(metadata), keep_local=True, epoch=next(CLAIMS))
    assert not any(isinstance(e, LoadWal) for e in step.effects)


def test_a_stale_local_wal_gives_way_to_the_objects_of_the_newer_owner() -> None:
    """The old owner lost the topic without unloading (its lease expired); the new owner
    continued from the index. When the topic comes back, the old directory is discarded."""
    objects, metadata = shared_state()
    old = broker(6650, objects, metadata)
    adopt(old)
    publish(old, producer(old), 0, 5)
    old.run(old.core.remove(TOPIC, reason="lease lost", delete_files=False).effects)
    assert TOPIC in old.files, "a dropped topic keeps its files"

    new = broker(6651, objects, metadata)
    adopt(new)
    publish(new, producer(new), 0, 3)
    unload(new)
    new.run(new.core.remove(TOPIC, reason="moved", delete_files=True).effects)

    adopt(old, keep_local=False)
    history = consume(old, 20, ack=0)
    assert history[-1] == "m2", "the history is the newer owner's"
    publish(old, producer(old, "again"), 100, 1)
    assert consume(old, len(history) + 1, ack=0)[-1] == "m100"


def test_a_deposed_owners_late_upload_leaves_the_new_owners_objects_alone() -> None:
    """Found by `python -m sim --cluster --data` (seed 37): a broker cut off from etcd cannot
    commit, but its upload under way still lands. With keys named after the offsets alone it
    replaced the object the next owner had indexed for the same range, and acknowledged
    messages were gone."""
    objects, metadata = shared_state()
    old = broker(6650, objects, metadata)
    adopt(old)
    publish(old, producer(old), 0, 5)
    old.hold_uploads = True
    old.run(old.core.unload(TOPIC, old.now_ms).effects)
    [(late, _)] = old.port.held  # read from disk and verified; its put not answered yet
    old.run(old.core.remove(TOPIC, reason="lease lost", delete_files=False).effects)

    new = broker(6651, objects, metadata)
    adopt(new)
    publish(new, producer(new), 5, 5)
    unload(new)
    new.run(new.core.remove(TOPIC, reason="moved", delete_files=True).effects)
    indexed = dict(objects)

    assert late.key not in objects
    old.finish_uploads()
    assert all(objects[key] == data for key, data in indexed.items())
    reader = broker(6652, objects, metadata)
    adopt(reader)
    assert consume(reader, 5, ack=0) == ["m5", "m6", "m7", "m8", "m9"]


def test_acks_for_a_topic_that_moves_or_left_ask_the_client_to_look_it_up_again() -> None:
    """UNAVAILABLE, not NOT_FOUND: the client then finds the new owner, which delivers the
    message again from the persisted cursor."""
    objects, metadata = shared_state()
    old = broker(6650, objects, metadata)
    adopt(old)
    publish(old, producer(old), 0, 3)
    consume(old, 3, ack=0)
    old.run(old.core.unload(TOPIC, old.now_ms).effects)
    for stage in ("unloading", "removed"):
        with pytest.raises(DanubeError) as refused:
            old.core.ack(TOPIC, "audit", 0, now_ms=old.now_ms)
        assert refused.value.code is ErrorCode.UNAVAILABLE, stage
        with pytest.raises(DanubeError) as refused:
            old.core.nack(TOPIC, "audit", 0, None, now_ms=old.now_ms)
        assert refused.value.code is ErrorCode.UNAVAILABLE, stage
        old.run(old.core.remove(TOPIC, reason="moved", delete_files=True).effects)


def test_a_non_reliable_topic_moves_too() -> None:
    """Danube never reassigns a non-reliable topic after a rebalance (reference §17); here
    it takes the same path, minus the seal."""
    objects, metadata = shared_state()
    metadata[paths.topic_delivery(NAME)] = DispatchStrategy.NON_RELIABLE.label
    old = broker(6650, objects, metadata)
    adopt(old)
    assert old.core.serves(TOPIC)
    old.run(old.core.unload(TOPIC, old.now_ms).effects)
    assert old.core.settled(TOPIC), "nothing to seal"
    old.run(old.core.remove(TOPIC, reason="moved", delete_files=True).effects)
    new = broker(6651, objects, metadata)
    adopt(new)
    step = new.core.create_producer(
        TOPIC, "p", access_mode=0, strategy=DispatchStrategy.NON_RELIABLE
    )
    assert step.value and new.core.serves(TOPIC)


def test_an_answer_for_the_uploader_of_an_earlier_stay_is_ignored() -> None:
    """Found by `python -m sim --cluster --data`: a topic left this broker and came back while
    its old uploader's object listing was out; the answer reached the new uploader, which
    raised (it had asked nothing) or, had it asked too, took the old answer for its own."""
    objects, metadata = shared_state()
    a = broker(7001, objects, metadata, UploaderConfig(orphan_scan_interval_ms=1_000))
    adopt(a)

    def listing(now_ms: int) -> TierIo:
        effects = a.core.tick(now_ms).effects
        a.run([e for e in effects if not isinstance(e, TierIo)])
        [io] = [e for e in effects if isinstance(e, TierIo)]
        assert isinstance(io.effect, ListObjects)
        return io

    old = listing(10_000)
    a.run(a.core.remove(TOPIC, reason="moved", delete_files=True).effects)
    adopt(a)
    new = listing(20_000)

    assert a.core.tier_objects_listed(old, [], now_ms=20_001).effects == ()
    a.core.tier_objects_listed(new, [], now_ms=20_002)  # still the new uploader's to answer
