"""Owners and followers together (spec/replication.md): brokers of the testing kit, each with
its own memory disk, joined by `ReplicaNetwork`. A follower stores the owner's frames; a
promoted follower continues the log with nothing acknowledged missing; the old owner comes
back as a follower, cuts what it held beyond its epoch (KIP-101) and copies the rest; a
deposed owner's frames are refused and cannot be acknowledged."""

from __future__ import annotations

import random
from typing import Any

from danube import keys
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.dispatch import QueueLimits
from danube.machines.node.core import BrokerCore, BrokerIdentity, ReplicaConfig
from danube.machines.node.replica_owner import ReplicationSettings
from danube.machines.replication.messages import Replicate
from danube.machines.wal import format
from danube.machines.wal.machine import WalConfig
from danube.testing import CoreDriver, InstantStore, ReplicaNetwork
from danube.values.config import DispatchStrategy, Policies
from tests.node.test_core_moves import shared_state, topic_entries

TOPIC = "/default/moving"


def records_on_disk(driver: CoreDriver) -> list[bytes]:
    """Every record of the topic's segment files on this broker's disk, in offset order."""
    out: list[tuple[int, bytes]] = []
    for _, data in sorted(driver.files.get(TOPIC, {}).items()):
        scan = format.scan_segment(bytes(data))
        out.extend(format.scanned_records(bytes(data), scan))
    offsets = [offset for offset, _ in out]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True
    return [record for _, record in out]


class Cluster:
    def __init__(self) -> None:
        self.objects, metadata = shared_state()
        self.store = InstantStore()
        for key, value in metadata.items():
            self.store.put(key, value)
        self.network = ReplicaNetwork()
        self.producers: dict[str, int] = {}

    @property
    def metadata(self) -> dict[str, Any]:
        return {key: kv.value for key, kv in self.store.data.items()}

    def boot(self, broker_id: str, disk: CoreDriver | None = None) -> CoreDriver:
        """A broker process; `disk`: a dead one's, whose files (segments, epochs) it finds."""
        url = f"http://{broker_id}:6650"
        core = BrokerCore(
            BrokerIdentity(url, url),
            rng=random.Random(broker_id),
            default_policies=Policies(),
            queue_limits=QueueLimits(),
            wal_config=WalConfig(segment_bytes=512),
            clustered=True,
            replication=ReplicationSettings(broker_id=broker_id, lag_ms=500),
        )
        driver = CoreDriver(core, disk.files if disk is not None else {}, self.objects)
        driver.port.store = self.store
        if disk is not None:
            driver.port.epochs = disk.port.epochs
            driver.port.checkpoints = disk.port.checkpoints
        namespaces = {k: v for k, v in self.metadata.items() if k.startswith("/namespaces/")}
        driver.run(core.restore(namespaces).effects)
        return self.network.add(broker_id, driver)

    def own(self, broker_id: str, followers: tuple[str, ...], *, keep_local: bool) -> int:
        """`broker_id` claims the topic (a new epoch) and reads its replicas value."""
        driver = self.network.brokers[broker_id]
        self.store.put(keys.owner_key(TOPIC), {"broker_id": broker_id})
        epoch = self.store.revision  # the claim's revision
        driver.run(driver.core.adopt(topic_entries(self.metadata), keep_local=keep_local,
                                     epoch=epoch).effects)  # fmt: skip
        record = ReplicaSet(epoch, broker_id, followers)
        self.store.put(keys.replicas_key(TOPIC), record.to_json())
        config = ReplicaConfig(epoch, followers, (), self.store.revision)
        now = driver.now_ms
        driver.run(driver.core.replicas_changed(TOPIC, config, now_ms=now).effects)
        step = driver.core.create_producer(
            TOPIC, f"p{epoch}", access_mode=0, strategy=DispatchStrategy.RELIABLE
        )
        driver.run(step.effects)
        self.producers[broker_id] = step.value
        self.network.deliver()
        return epoch

    def publish(self, broker_id: str, payload: str) -> Any:
        driver = self.network.brokers[broker_id]
        step = driver.core.publish(
            self.producers[broker_id], TOPIC, payload, len(payload), None,
            encode=lambda offset: payload.encode(), now_ms=driver.now_ms,
        )  # fmt: skip
        waiter = driver.wait_stored(TOPIC, step.value)
        driver.run(step.effects)
        self.network.deliver()
        return waiter


def test_a_follower_holds_what_was_acknowledged_and_takes_over_with_it() -> None:
    cluster = Cluster()
    b1, b2 = cluster.boot("b1"), cluster.boot("b2")
    cluster.own("b1", ("b2",), keep_local=False)
    waiters = [cluster.publish("b1", f"m{i}") for i in range(20)]
    assert all(w.done and w.error is None for w in waiters)
    state = b1.core.replication_state(TOPIC)
    assert state is not None and state["in_sync"] == ["b2"], state
    assert records_on_disk(b2) == records_on_disk(b1) == [f"m{i}".encode() for i in range(20)]

    # b1 dies; b2, in sync, is promoted and continues the log from what it holds.
    del cluster.network.brokers["b1"]
    cluster.own("b2", (), keep_local=True)
    waiter = cluster.publish("b2", "after")
    assert waiter.done and waiter.error is None
    assert records_on_disk(b2) == [*(f"m{i}".encode() for i in range(20)), b"after"]


def test_the_old_owner_returns_as_a_follower_and_cuts_what_was_never_acknowledged() -> None:
    cluster = Cluster()
    b1, b2 = cluster.boot("b1"), cluster.boot("b2")
    cluster.own("b1", ("b2",), keep_local=False)
    for i in range(5):
        assert cluster.publish("b1", f"m{i}").error is None
    # b1 loses b2: what it appends now is durable on b1 alone and never acknowledged.
    cluster.network.cut("b1", "b2")
    stray = [cluster.publish("b1", f"stray{i}") for i in range(3)]
    assert not any(w.done and w.error is None for w in stray)
    del cluster.network.brokers["b1"]  # b1 crashes with its disk intact

    cluster.own("b2", ("b1",), keep_local=True)
    for i in range(4):
        assert cluster.publish("b2", f"n{i}").error is None
    # b1 restarts with its disk and follows b2: it cuts the stray records (epoch 1 ends at
    # offset 5 on b2's log) and copies epoch 2's.
    b1 = cluster.boot("b1", disk=b1)
    cluster.network.heal("b1", "b2")
    cluster.network.brokers["b2"].interpreter.replication.stream_broke("b1")
    cluster.network.deliver()
    expected = [*(f"m{i}".encode() for i in range(5)), *(f"n{i}".encode() for i in range(4))]
    assert records_on_disk(b1) == expected == records_on_disk(b2)
    # cut by epoch: at 5, where epoch 1 ends on b2, not to nothing
    loads = [e[1]["next_offset"] for e in b1.port.events if e[0] == "wal_loaded"]
    assert loads == [8, 5], loads
    assert b1.port.epochs[TOPIC].seen == cluster.store.state.get(keys.owner_key(TOPIC)).mod_revision


def test_a_deposed_owners_frames_are_refused() -> None:
    cluster = Cluster()
    b1, b2 = cluster.boot("b1"), cluster.boot("b2")
    cluster.own("b1", ("b2",), keep_local=False)
    assert cluster.publish("b1", "m0").error is None
    # b2 has seen epoch 10,000 (a newer owner's probe): b1's next frames are refused with it,
    # and b1, deposed, stops the topic instead of acknowledging.
    probe = Replicate(TOPIC, 10_000, 1, b"", 0, 0)
    b2.interpreter.replication.received("b9", probe)
    waiter = cluster.publish("b1", "m1")
    assert waiter.done and waiter.error is not None
    state = b1.core.replication_state(TOPIC)
    assert state is None, "a deposed owner drops its replication machine"
    assert records_on_disk(b2) == [b"m0"]


def test_a_replica_is_kept_while_its_broker_may_still_take_the_topic_over() -> None:
    """`still_follows`: named as owner, follower or in sync, or assigned the topic (the
    promoted follower, dropped from `followers` while its claim is under way)."""
    from danube.machines.node.replica_follower import still_follows

    record = ReplicaSet(9, "b1", ("b2",), ("b3",))
    assert still_follows("b1", record, False)  # the recorded owner
    assert still_follows("b2", record, False)  # a follower
    assert still_follows("b3", record, False)  # replaced, but still in sync
    assert not still_follows("b4", record, False)
    assert still_follows("b4", record, True)  # being promoted here
    assert not still_follows("b2", None, False)  # the set is gone (the topic was deleted)
