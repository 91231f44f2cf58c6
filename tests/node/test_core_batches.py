"""The core's batched publish and acknowledgement (spec/protocol.md, "Batched data path"):
one frame per batch, appended as stamped, all or nothing; plain and batched publishes share
one offset sequence; `ack_many` is `ack` of each offset."""

from __future__ import annotations

import random

import pytest

from danube.machines.dispatch import LATEST, QueueLimits
from danube.machines.node.core import BrokerCore, BrokerIdentity, WalIo
from danube.machines.wal import format, records
from danube.machines.wal.batches import check_batch
from danube.machines.wal.machine import Write
from danube.values.config import DispatchStrategy, Policies
from danube.values.errors import DanubeError, ErrorCode
from tests.node.test_core_reliable import EXCLUSIVE, TOPIC, URL, Broker

NON_RELIABLE = DispatchStrategy.NON_RELIABLE


def batch_of(*payloads: bytes, key: str | None = None) -> bytes:
    return format.encode_frame(
        0,
        0,
        [
            records.encode(records.Record(payload=p, routing_key=key, has_msg_id=False))
            for p in payloads
        ],
    )


def writes(effects: tuple[object, ...]) -> list[Write]:
    return [f for e in effects if isinstance(e, WalIo) for f in e.effects if isinstance(f, Write)]


def test_a_batch_is_one_frame_of_stamped_records_after_the_plain_publishes() -> None:
    broker = Broker()
    pid = broker.producer()
    assert broker.publish(pid, "first") == 0
    step = broker.core.publish_batch(pid, TOPIC, check_batch(batch_of(b"a", b"b", b"c")), now_ms=9)
    assert step.value.first_offset == 1 and step.value.stored
    broker.run(step.effects)
    assert broker.driver.acked[TOPIC] == 3
    # the plain publish stored the test's stand-in encoding; the batch, protobuf records
    stored = [
        records.decode(record)
        for segment in broker.driver.files[TOPIC].values()
        for offset, record in format.scanned_records(segment, format.scan_segment(segment))
        if offset
    ]
    assert [r.payload for r in stored] == [b"a", b"b", b"c"]
    assert [r.topic_offset for r in stored] == [1, 2, 3]
    assert {(r.producer_id, r.topic_name, r.broker_addr) for r in stored} == {(pid, TOPIC, URL)}
    consumer = broker.consumer("c")
    delivered = broker.take(consumer)
    assert [records.decode(r).payload for r in delivered[1:]] == [b"a", b"b", b"c"]


def test_one_batch_is_one_write() -> None:
    broker = Broker()
    pid = broker.producer()
    step = broker.core.publish_batch(pid, TOPIC, check_batch(batch_of(*[b"x"] * 50)), now_ms=1)
    assert len(writes(step.effects)) == 1


def test_ack_many_moves_the_cursor_over_every_offset() -> None:
    broker = Broker(max_unacked=100)
    pid = broker.producer()
    broker.run(
        broker.core.publish_batch(pid, TOPIC, check_batch(batch_of(*[b"m"] * 5)), now_ms=1).effects
    )
    consumer = broker.consumer("c", sub_type=EXCLUSIVE)
    assert len(broker.take(consumer)) == 5
    broker.run(broker.core.ack_many(TOPIC, "s", [0, 1, 2, 3, 4], now_ms=2).effects)
    broker.run(broker.core.tick(5_000).effects)
    assert broker.cursor() == 4


def test_a_message_over_the_size_limit_refuses_the_whole_batch() -> None:
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(max_message_size=4),
        queue_limits=QueueLimits(),
    )
    core.bootstrap(["default"])
    pid = core.create_producer(TOPIC, "p", access_mode=0, strategy=NON_RELIABLE).value
    with pytest.raises(DanubeError) as caught:
        core.publish_batch(pid, TOPIC, check_batch(batch_of(b"ok", b"too long")), now_ms=1)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert "message 1 of the batch has 8 bytes" in caught.value.message
    assert core.publish_batch(pid, TOPIC, check_batch(batch_of(b"ok")), now_ms=1).value.count == 1


def test_non_reliable_batches_are_delivered_message_by_message_in_sequence() -> None:
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
    )
    core.bootstrap(["default"])
    pid = core.create_producer(TOPIC, "p", access_mode=0, strategy=NON_RELIABLE).value
    consumer = core.subscribe(TOPIC, "c", "s", EXCLUSIVE, (), LATEST, now_ms=1).value
    generation = core.open_stream(consumer, now_ms=1).value
    first = core.publish_batch(pid, TOPIC, check_batch(batch_of(b"a", b"b")), now_ms=1).value
    assert (first.first_offset, first.last_offset, first.stored) == (0, 1, False)
    second = core.publish_batch(pid, TOPIC, check_batch(batch_of(b"c")), now_ms=1).value
    assert second.first_offset == 2
    taken = core.take(consumer, generation, 10)
    assert taken is not None
    decoded = [records.decode(item) for item in taken]
    assert [(r.payload, r.topic_offset) for r in decoded] == [(b"a", 0), (b"b", 1), (b"c", 2)]


def test_an_unknown_producer_is_refused() -> None:
    broker = Broker()
    with pytest.raises(DanubeError) as caught:
        broker.core.publish_batch(7, TOPIC, check_batch(batch_of(b"a")), now_ms=1)
    assert caught.value.code is ErrorCode.NOT_FOUND
