"""Damage to the newest WAL segment through a real broker process (issue 20, item 7): a bit
flipped in the last frame, the newest segment deleted, or zeroed, must not read as a torn
tail. Before the fix each lost the acknowledged messages silently and assigned their offsets
again (`new-0` got offset 9, where `old-9` had been). Now the topic refuses with
FAILED_PRECONDITION naming the file, the byte and the lost offsets, nothing is reused, and the
operator's documented remedy continues after the highest offset anything durable has seen.

The files are damaged by walking them as spec/wal-format.md describes (the helpers of
test_reliable_durability.py), not with the code under test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from grpclib.const import Status

from danube.client import DanubeClient, DanubeClientError, DispatchStrategy, SubType
from danube.localcluster.broker_process import BrokerProcess
from tests.broker.test_reliable_durability import (
    _frames,
    _segments,
    _topic_dir,
    _wait_until_bindable,
)
from tests.support.aio import receive_for, receive_n, run, unique_topic

pytestmark = pytest.mark.slow

RELIABLE = DispatchStrategy.RELIABLE


def _publish_acknowledged(broker: BrokerProcess, topic: str, payloads: list[bytes]) -> None:
    """Reliable sends, each acknowledged to the producer; subscription `s1` receives and
    acknowledges every one."""

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(topic, "p", dispatch=RELIABLE).create()
            consumer = client.consumer(
                topic, "c", "s1", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            await consumer.subscribe()
            for payload in payloads:
                await producer.send(payload)
            received = await receive_n(consumer, len(payloads))
            assert [m.payload for m in received] == payloads

    run(scenario)


def _send_after_restart(
    broker: BrokerProcess, topic: str
) -> DanubeClientError | list[tuple[int, bytes]]:
    """Sends `new-0..2` to the restarted broker: the error the producer gets, or (the defect)
    what `--start earliest` then shows, as (offset, payload)."""

    async def scenario() -> DanubeClientError | list[tuple[int, bytes]]:
        async with DanubeClient(broker.url) as client:
            try:
                producer = await client.producer(topic, "p2", dispatch=RELIABLE).create()
                for i in range(3):
                    await producer.send(f"new-{i}".encode())
            except DanubeClientError as error:
                return error
            consumer = client.consumer(
                topic, "c", "audit", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            await consumer.subscribe()
            return [(m.offset, m.payload) for m in await receive_for(consumer, 1.0)]

    return run(scenario)


def _assert_refused(
    broker: BrokerProcess, topic: str, segment: str, byte: int, lost_from: int, through: int
) -> None:
    outcome = _send_after_restart(broker, topic)
    assert isinstance(outcome, DanubeClientError), f"acknowledged data lost silently: {outcome}"
    assert outcome.status is Status.FAILED_PRECONDITION, outcome
    message = str(outcome)
    assert f"segment {segment}, byte {byte}" in message, message
    assert f"offsets from {lost_from} through {through}" in message, message
    assert "accept-loss" in message, message
    broker.wait_for_log(rf"event=topic_stopped .*topic={re.escape(topic)}(\s|$)", timeout=5)
    assert "Traceback" not in broker.log_text(), broker.log_text()


@pytest.mark.parametrize("stop", ["graceful", "sigkill"])
def test_a_bit_flipped_in_the_newest_frame_stops_the_topic(
    broker_factory: type[BrokerProcess], tmp_path: Path, stop: str
) -> None:
    """The issue's reproduction: 10 acknowledged messages, one bit flipped 5 bytes from the
    end of the newest segment. Before the fix: INFO "torn tail", `new-0` at offset 9. After
    SIGKILL no shutdown wrote a last mark nor persisted the cursor: the checkpoint the broker
    kept while it ran is the evidence."""
    broker = broker_factory(tmp_path / "data").start()
    topic = unique_topic("flip")
    _publish_acknowledged(broker, topic, [f"old-{i}".encode() for i in range(10)])
    if stop == "graceful":
        broker.stop()
    else:
        broker.kill()
    [segment] = _segments(broker, topic)
    data = bytearray(segment.read_bytes())
    last = _frames(bytes(data))[-1]
    assert (last.base_offset, last.count) == (9, 1)
    data[-5] ^= 0x10
    segment.write_bytes(data)

    _wait_until_bindable(broker.broker_port)
    _wait_until_bindable(broker.admin_port)
    broker.start()
    _assert_refused(broker, topic, segment.name, last.start, 9, 9)
    assert segment.read_bytes() == data, "the damaged segment was changed"


def _two_segments(broker: BrokerProcess, topic: str) -> list[Path]:
    """20 acknowledged messages in two segments (a restart closes the first)."""
    _publish_acknowledged(broker, topic, [f"old-{i}".encode() for i in range(10)])
    broker.stop()
    broker.start()
    _publish_acknowledged(broker, topic, [f"old-{i}".encode() for i in range(10, 20)])
    broker.stop()
    segments = _segments(broker, topic)
    assert [path.name for path in segments] == [f"{0:020d}.wal", f"{10:020d}.wal"]
    return segments


def test_a_deleted_newest_segment_stops_the_topic(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path / "data").start()
    topic = unique_topic("deleted")
    first, newest = _two_segments(broker, topic)
    newest.unlink()

    broker.start()
    _assert_refused(broker, topic, first.name, first.stat().st_size, 10, 19)


@pytest.mark.parametrize("how", ["frames-zeroed", "zero-length"])
def test_a_zeroed_newest_segment_stops_the_topic(
    broker_factory: type[BrokerProcess], tmp_path: Path, how: str
) -> None:
    """Zeros over the frames (the header intact) read as a segment torn before its first
    frame; a zero-length file as one whose creation died: both honest after a crash, both
    lost data here."""
    broker = broker_factory(tmp_path / "data").start()
    topic = unique_topic("zeroed")
    _, newest = _two_segments(broker, topic)
    data = newest.read_bytes()
    header = _frames(data)[0].start
    if how == "frames-zeroed":
        newest.write_bytes(data[:header] + bytes(len(data) - header))
        byte = header
    else:
        newest.write_bytes(b"")
        byte = 0

    broker.start()
    _assert_refused(broker, topic, newest.name, byte, 10, 19)


def test_the_remedy_continues_after_the_highest_durable_offset(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """The operator accepts the loss as the error says (every segment file moved out,
    `accept-loss` written): the topic continues at the offset after everything durable has
    seen, so `s1` (cursor at 9) receives `new-0` at offset 10 and no offset names two
    messages, even across a restart before the first append."""
    broker = broker_factory(tmp_path / "data").start()
    topic = unique_topic("remedy")
    _publish_acknowledged(broker, topic, [f"old-{i}".encode() for i in range(10)])
    broker.stop()
    [segment] = _segments(broker, topic)
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0x10
    segment.write_bytes(data)
    broker.start()
    refused = _send_after_restart(broker, topic)
    assert isinstance(refused, DanubeClientError), refused
    resume = re.search(r"write (\d+) into a new file named accept-loss", str(refused))
    assert resume is not None, refused
    broker.stop()
    moved = tmp_path / "moved"
    moved.mkdir()
    segment.rename(moved / segment.name)
    (_topic_dir(broker, topic) / "accept-loss").write_text(resume.group(1))

    broker.start()
    broker.wait_for_log(r"event=wal_loss_accepted .*continues_at=10", timeout=5)
    broker.stop()  # a restart before the first append still knows where offsets go on
    broker.start()

    async def after() -> list[tuple[int, bytes]]:
        async with DanubeClient(broker.url) as client:
            consumer = client.consumer(
                topic, "c", "s1", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            await consumer.subscribe()
            producer = await client.producer(topic, "p2", dispatch=RELIABLE).create()
            for i in range(3):
                await producer.send(f"new-{i}".encode())
            received = await receive_n(consumer, 3)
            received += await receive_for(consumer, 0.5)
            return [(m.offset, m.payload) for m in received]

    received = run(after)
    assert int(resume.group(1)) == 10
    assert received == [(10 + i, f"new-{i}".encode()) for i in range(3)]
    assert not (_topic_dir(broker, topic) / "accept-loss").exists()
    assert "Traceback" not in broker.log_text(), broker.log_text()
