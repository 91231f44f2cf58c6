"""Reliable topics in the broker core: publishes acknowledged only once durable, deliveries
from the WAL, acks and cursors, restarts, start positions, takeover, Key-Shared routing,
corrupt and failing WALs. The WAL effects run in memory (`danube.testing`)."""

from __future__ import annotations

import json
import random
from typing import Any

from danube.machines.dispatch import QueueLimits, StartKind, StartPosition
from danube.machines.memory.budget import MemoryPools
from danube.machines.node.core import (
    BrokerCore,
    BrokerIdentity,
    LoadWal,
    PersistMeta,
    PublishAcked,
    PublishFailed,
    ReadWal,
    RepairWal,
    TopicStopped,
    WalIo,
)
from danube.machines.wal import format
from danube.machines.wal.machine import (
    CreateSegment,
    Durability,
    Fsync,
    WalConfig,
    Write,
    decode_file_read,
)
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies
from danube.values.errors import ErrorCode
from tests.node.test_core import code_of, replay

URL = "http://127.0.0.1:6650"
REL = DispatchStrategy.RELIABLE
EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
TOPIC = "/default/r"
EARLIEST = StartPosition(StartKind.EARLIEST)


def record_of(payload: str, key: str | None = None) -> bytes:
    """A stand-in record encoding: `key|payload` (the core never parses records itself)."""
    return f"{key or ''}|{payload}".encode()


def key_of(record: bytes) -> bytes:
    return record.split(b"|", 1)[0]


class Broker:
    """A core with its WAL in memory and its metadata replayed like the runtime does."""

    def __init__(
        self,
        config: WalConfig | None = None,
        files: dict[str, dict[int, bytearray]] | None = None,
        metadata: dict[str, Any] | None = None,
        max_unacked: int = 10,
        memory: MemoryPools | None = None,
    ) -> None:
        self.core = BrokerCore(
            BrokerIdentity(URL, URL),
            rng=random.Random(7),
            default_policies=Policies(),
            queue_limits=QueueLimits(),
            wal_config=config or WalConfig(),
            max_unacked_messages=max_unacked,
            routing_key_of=key_of,
            memory=memory,
        )
        self.driver = CoreDriver(self.core, files)
        self.metadata: dict[str, Any] = {}
        if metadata is not None:
            self.metadata = json.loads(json.dumps(metadata))
            self.run(self.core.restore(self.metadata).effects)
        self.run(self.core.bootstrap(["default"]).effects)

    def run(self, effects: Any) -> list[Any]:
        out = self.driver.run(effects)
        replay(out, self.metadata)
        return out

    def producer(self, topic: str = TOPIC, name: str = "p") -> int:
        step = self.core.create_producer(topic, name, access_mode=0, strategy=REL)
        self.run(step.effects)
        return step.value

    def publish(self, producer_id: int, payload: str, key: str | None = None) -> int:
        step = self.core.publish(
            producer_id,
            TOPIC,
            payload,
            len(payload),
            None,
            encode=lambda offset: record_of(payload, key),
            now_ms=self.driver.now_ms,
        )
        self.run(step.effects)
        return step.value

    def consumer(
        self,
        name: str,
        sub: str = "s",
        sub_type: int = EXCLUSIVE,
        start: StartPosition = EARLIEST,
        filters: tuple[str, ...] = (),
    ) -> tuple[int, int]:
        """Subscribes and opens the stream: (consumer id, stream generation)."""
        step = self.core.subscribe(TOPIC, name, sub, sub_type, filters, start, now_ms=1)
        self.run(step.effects)
        opened = self.core.open_stream(step.value, now_ms=self.driver.now_ms)
        self.run(opened.effects)
        return step.value, opened.value

    def take(self, consumer: tuple[int, int]) -> list[bytes]:
        taken = self.core.take(consumer[0], consumer[1], 1000)
        assert taken is not None
        return taken

    def ack(self, offset: int, sub: str = "s") -> None:
        self.run(self.core.ack(TOPIC, sub, offset, now_ms=self.driver.now_ms).effects)

    def cursor(self, sub: str = "s") -> Any:
        return self.metadata.get(f"/topics/default/r/subscriptions/{sub}/cursor")


def payloads(records: list[bytes]) -> list[str]:
    return [r.split(b"|", 1)[1].decode() for r in records]


def test_publish_is_acknowledged_only_after_the_fsync_that_covers_it() -> None:
    broker = Broker()
    pid = broker.producer()
    step = broker.core.publish(pid, TOPIC, "m", 1, None, encode=lambda offset: b"m", now_ms=5)
    assert step.value == 0
    io = [e for e in step.effects if isinstance(e, WalIo)]
    assert not [e for e in step.effects if isinstance(e, PublishAcked)]
    write = next(e for e in io[0].effects if isinstance(e, Write))
    after_write = broker.core.wal_io_done(TOPIC, write, None, now_ms=6).effects
    assert not [e for e in after_write if isinstance(e, PublishAcked)], "not before fsync"
    fsync = next(f for e in after_write if isinstance(e, WalIo) for f in e.effects)
    assert isinstance(fsync, Fsync)
    after_fsync = broker.core.wal_io_done(TOPIC, fsync, None, now_ms=7).effects
    assert PublishAcked(TOPIC, 0) in after_fsync


def test_flush_durability_acknowledges_at_write() -> None:
    broker = Broker(WalConfig(durability=Durability.FLUSH))
    pid = broker.producer()
    step = broker.core.publish(pid, TOPIC, "m", 1, None, encode=lambda o: b"m", now_ms=5)
    write = next(
        f for e in step.effects if isinstance(e, WalIo) for f in e.effects if isinstance(f, Write)
    )
    assert PublishAcked(TOPIC, 0) in broker.core.wal_io_done(TOPIC, write, None, now_ms=6).effects


def test_offsets_are_dense_and_records_carry_what_encode_returned() -> None:
    broker = Broker()
    pid = broker.producer()
    offsets = [broker.publish(pid, f"m{i}") for i in range(5)]
    assert offsets == [0, 1, 2, 3, 4]
    assert broker.driver.acked[TOPIC] == 4
    consumer = broker.consumer("c")
    assert payloads(broker.take(consumer)) == ["m0", "m1", "m2", "m3", "m4"]


def test_acks_move_the_cursor_and_a_restart_resumes_after_it() -> None:
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c")
    assert broker.cursor() == -1, "a new subscription persists start - 1 at once"
    for i in range(6):
        broker.publish(pid, f"m{i}")
    assert payloads(broker.take(consumer)) == [f"m{i}" for i in range(6)]
    for offset in (0, 1, 2):
        broker.ack(offset)
    broker.ack(4)  # out of order: the cursor stays at 2
    broker.run(broker.core.quiesce(10_000).effects)
    assert broker.cursor() == 2

    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    consumer_id = consumer[0]
    assert again.core.consumer_healthy(consumer_id)
    opened = again.core.open_stream(consumer_id, now_ms=1)
    again.run(opened.effects)
    taken = again.take((consumer_id, opened.value))
    # at-least-once: everything after the cursor comes again, the acked 4 included
    assert payloads(taken) == ["m3", "m4", "m5"]
    new_pid = again.producer(name="p")
    assert new_pid == pid, "producer ids survive a restart"
    assert again.publish(pid, "m6") == 6, "offsets continue after the last stored one"


def test_start_positions() -> None:
    broker = Broker()
    pid = broker.producer()
    for i in range(4):
        broker.publish(pid, f"m{i}")
    latest = broker.consumer("a", sub="latest", start=StartPosition())
    at_two = broker.consumer("b", sub="at2", start=StartPosition(StartKind.OFFSET, 2))
    earliest = broker.consumer("c", sub="earliest")
    broker.publish(pid, "m4")
    assert payloads(broker.take(latest)) == ["m4"]
    assert payloads(broker.take(at_two)) == ["m2", "m3", "m4"]
    assert payloads(broker.take(earliest)) == ["m0", "m1", "m2", "m3", "m4"]
    past_end = StartPosition(StartKind.OFFSET, 6)
    assert (
        code_of(lambda: broker.core.subscribe(TOPIC, "d", "d", SHARED, (), past_end))
        is ErrorCode.OUT_OF_RANGE
    )
    # the end itself is fine: it is where the next message goes
    broker.core.subscribe(TOPIC, "d", "d", SHARED, (), StartPosition(StartKind.OFFSET, 5))


def test_a_subscription_made_during_a_publish_stores_no_cursor_past_the_durable_end() -> None:
    """Recovery takes a stored cursor as proof its offsets were acknowledged: a LATEST (or
    at-the-end) start while a publish awaits its fsync must not store the unwritten offset,
    or a crash before that fsync stops a healthy topic (review of issue 20)."""
    broker = Broker()
    pid = broker.producer()
    broker.publish(pid, "m0")
    step = broker.core.publish(pid, TOPIC, "m1", 2, None, encode=lambda o: b"|m1", now_ms=5)
    assert step.value == 1  # assigned, its Write and Fsync not carried out
    for sub, start in (("latest", StartPosition()), ("at1", StartPosition(StartKind.OFFSET, 1))):
        broker.run(broker.core.subscribe(TOPIC, sub, sub, SHARED, (), start, now_ms=6).effects)
        assert broker.cursor(sub) == 0, sub
    # A repair now (a failed fsync) must not take the live LATEST cursor (1) as acknowledged.
    assert broker.core.recovery_evidence(TOPIC)[0] == 1


def test_closing_the_stream_redelivers_what_was_in_flight_to_the_next_consumer() -> None:
    broker = Broker()
    pid = broker.producer()
    first = broker.consumer("c1", sub_type=FAILOVER)
    second = broker.consumer("c2", sub_type=FAILOVER)
    for i in range(3):
        broker.publish(pid, f"m{i}")
    assert payloads(broker.take(first)) == ["m0", "m1", "m2"]
    assert broker.take(second) == []
    broker.ack(0)
    broker.run(broker.core.close_stream(first[0], first[1], now_ms=2_000).effects)
    assert payloads(broker.take(second)) == ["m1", "m2"]


def test_takeover_by_the_same_name_redelivers_on_the_new_stream() -> None:
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c")
    broker.publish(pid, "m0")
    assert payloads(broker.take(consumer)) == ["m0"]
    again = broker.core.subscribe(TOPIC, "c", "s", EXCLUSIVE, (), now_ms=3)
    assert again.value == consumer[0]
    broker.run(again.effects)
    opened = broker.core.open_stream(consumer[0], now_ms=3)
    broker.run(opened.effects)
    assert broker.core.take(consumer[0], consumer[1], 10) is None, "the old stream is over"
    assert payloads(broker.take((consumer[0], opened.value))) == ["m0"]


def test_key_shared_keeps_one_message_per_key_in_flight() -> None:
    broker = Broker()
    pid = broker.producer()
    a = broker.consumer("a", sub_type=KEY_SHARED)
    b = broker.consumer("b", sub_type=KEY_SHARED)
    for i in range(4):
        broker.publish(pid, f"x{i}", key="x")
    taken = broker.take(a) + broker.take(b)
    assert payloads(taken) == ["x0"], "the next message of a key waits for the ack"
    broker.ack(0)
    assert payloads(broker.take(a) + broker.take(b)) == ["x1"]


def test_lagging_subscription_reads_from_files_when_the_cache_is_gone() -> None:
    broker = Broker(WalConfig(cache_bytes=0, index_interval_bytes=1))
    pid = broker.producer()
    for i in range(30):
        broker.publish(pid, f"m{i}")
    consumer = broker.consumer("c")
    received: list[str] = []
    for _ in range(10):
        batch = payloads(broker.take(consumer))
        received += batch
        for offset in range(len(received) - len(batch), len(received)):
            broker.ack(offset)
    assert received == [f"m{i}" for i in range(30)]


def test_corrupt_segment_stops_only_its_topic() -> None:
    broker = Broker()
    pid = broker.producer()
    for i in range(3):
        broker.publish(pid, f"m{i}")
    broker.run(broker.core.create_topic("/default/other", REL).effects)
    segment = broker.driver.files[TOPIC][0]
    header = len(format.encode_segment_header(TOPIC, 0, 0))
    segment[header + 40] ^= 0xFF  # inside the first of three frames
    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    stopped = again.driver.stopped[TOPIC]
    assert format.segment_name(0) in stopped
    assert code_of(lambda: again.core.subscribe(TOPIC, "c", "s2", SHARED, ())) is (
        ErrorCode.FAILED_PRECONDITION
    )
    assert (
        code_of(lambda: again.core.create_producer(TOPIC, "p2", access_mode=0, strategy=REL))
        is ErrorCode.FAILED_PRECONDITION
    )
    other = again.core.create_producer("/default/other", "p", access_mode=0, strategy=REL)
    again.run(other.effects)
    step = again.core.publish(
        other.value, "/default/other", "m", 1, None, encode=lambda o: b"m", now_ms=1
    )
    assert PublishAcked("/default/other", 0) in again.run(step.effects)


def test_failed_fsync_fails_waiting_publishes_and_the_topic_recovers() -> None:
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c")
    broker.publish(pid, "m0")
    step = broker.core.publish(pid, TOPIC, "m1", 2, None, encode=lambda o: b"|m1", now_ms=5)
    write = next(f for e in step.effects if isinstance(e, WalIo) for f in e.effects)
    broker.driver.files[TOPIC][0] += write.data  # the write reached the page cache
    fsync = next(
        f
        for e in broker.core.wal_io_done(TOPIC, write, None, now_ms=6).effects
        if isinstance(e, WalIo)
        for f in e.effects
    )
    failed = broker.core.wal_io_done(TOPIC, fsync, "EIO", now_ms=7).effects
    assert PublishFailed(TOPIC, 1, failed[0].reason) == failed[0]
    assert any(isinstance(e, RepairWal) for e in failed)
    assert (
        code_of(
            lambda: broker.core.publish(pid, TOPIC, "x", 1, None, encode=lambda o: b"x", now_ms=8)
        )
        is ErrorCode.UNAVAILABLE
    ), "refused while the WAL is repaired"
    broker.run(failed)  # truncate to the durable prefix, reload
    assert payloads(broker.take(consumer)) == ["m0"]
    assert broker.publish(pid, "m1 again") == 1, "the unacknowledged offset is assigned again"
    assert payloads(broker.take(consumer)) == ["m1 again"]


def test_deleted_topic_created_again_starts_empty() -> None:
    broker = Broker()
    pid = broker.producer()
    broker.publish(pid, "old")
    effects = broker.core.delete_topic(TOPIC).effects
    broker.run(effects)
    assert TOPIC not in broker.driver.files
    created = broker.core.create_producer(TOPIC, "p", access_mode=0, strategy=REL)
    assert LoadWal(TOPIC, fresh=True) in created.effects
    broker.run(created.effects)
    assert broker.publish(created.value, "new") == 0
    consumer = broker.consumer("c")
    assert payloads(broker.take(consumer)) == ["new"]


def test_cursor_is_persisted_in_metadata_effects_not_per_ack() -> None:
    """The first advance is written at once, later ones at most once per flush period."""
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c")
    for i in range(5):
        broker.publish(pid, f"m{i}")
    broker.take(consumer)
    writes = []
    for offset in range(5):
        out = broker.run(broker.core.ack(TOPIC, "s", offset, now_ms=100 + offset).effects)
        writes += [e for e in out if isinstance(e, PersistMeta)]
    assert len(writes) == 1 and broker.cursor() == 0
    broker.run(broker.core.tick(5_000).effects)
    assert broker.cursor() == 4


def test_stopped_topic_effect_names_the_topic() -> None:
    broker = Broker()
    broker.producer()
    out = broker.core.wal_load_failed(TOPIC, "disk on fire").effects
    assert out == (TopicStopped(TOPIC, "disk on fire"),)


def test_a_read_answered_while_the_wal_is_repaired_is_asked_again() -> None:
    """Regression (found by the simulator, disk-full seed): a file read whose answer arrived
    while the WAL was being repaired was dropped, and the subscription never read again."""
    broker = Broker(WalConfig(cache_bytes=0))
    pid = broker.producer()
    consumer = broker.consumer("c")
    files = broker.driver.files.setdefault(TOPIC, {})

    def perform(effects: Any) -> list[Any]:
        """Runs file effects by hand, keeping the subscription's file reads aside."""
        out, work = [], list(effects)
        while work:
            effect = work.pop(0)
            if not isinstance(effect, WalIo):
                out.append(effect)
                continue
            for io in effect.effects:
                if isinstance(io, CreateSegment):
                    files[io.base_offset] = bytearray(io.header)
                elif isinstance(io, Write):
                    files[io.segment_base] += io.data
                work += broker.core.wal_io_done(TOPIC, io, None, now_ms=5).effects
        return out

    first = broker.core.publish(pid, TOPIC, "m0", 2, None, encode=lambda o: b"|m0", now_ms=5)
    pending_read = next(e for e in perform(first.effects) if isinstance(e, ReadWal))
    second = broker.core.publish(pid, TOPIC, "m1", 2, None, encode=lambda o: b"|m1", now_ms=6)
    write = next(f for e in second.effects if isinstance(e, WalIo) for f in e.effects)
    files[0] += write.data
    fsync = next(
        f
        for e in broker.core.wal_io_done(TOPIC, write, None, now_ms=7).effects
        if isinstance(e, WalIo)
        for f in e.effects
    )
    failed = broker.core.wal_io_done(TOPIC, fsync, "EIO", now_ms=8).effects
    plan = pending_read.plan
    records_read = decode_file_read(plan, bytes(files[0][plan.start : plan.end]))
    assert broker.core.wal_read_done(pending_read, records_read, now_ms=9).effects == ()
    broker.run(failed)  # repaired and loaded again
    assert payloads(broker.take(consumer)) == ["m0"]
