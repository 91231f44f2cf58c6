"""Damaged storage (issue 20 (7); deliver 4, 8): acknowledged messages, a clean stop, one bit
flipped 5 bytes from the end of the topic's newest WAL segment, a restart. The broker must
either serve every acknowledged message byte for byte under its old offset, or refuse the
topic with an error naming the corruption; it must never serve other bytes (or nothing)
under offsets that were acknowledged, never give a new message an old offset, and a
subscription whose cursor stood at the end must receive what is published next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube.client import DanubeClient, DanubeClientError, DispatchStrategy, SubType
from tests.hostile.harness import WatchedBroker
from tests.hostile.ledger import LEDGER

pytestmark = pytest.mark.slow

NEW = [b"new-0", b"new-1", b"new-2"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedBroker]:
    data_dir: Path = tmp_path_factory.mktemp("hostile-wal") / "data"
    watched = WatchedBroker(data_dir, "storage").start()
    try:
        yield watched
    finally:
        watched.close()


def _newest_segment(broker: WatchedBroker) -> Path:
    _, namespace, name = broker.topic.split("/")
    segments = sorted((broker.process.data_dir / "wal" / namespace / name).glob("*.wal"))
    assert segments, "the topic has no WAL segment"
    return segments[-1]


def _flip_bit_near_end(path: Path, from_end: int = 5) -> int:
    data = bytearray(path.read_bytes())
    position = len(data) - from_end
    data[position] ^= 0x10
    path.write_bytes(bytes(data))
    return position


async def _publish_new(broker: WatchedBroker) -> tuple[list[int], str | None]:
    """Publishes NEW; returns their offsets as the audit subscription receives them, or the
    refusal (gRPC status name) if the topic refuses."""
    async with DanubeClient(broker.process.url) as client:
        try:
            producer = client.producer(
                broker.topic, "hostile-after", dispatch=DispatchStrategy.RELIABLE, batching=None
            )
            await producer.create()
            consumer = client.consumer(
                broker.topic, "audit", "hostile-audit", sub_type=SubType.EXCLUSIVE
            )
            await consumer.subscribe()
            for payload in NEW:
                await producer.send(payload)
        except DanubeClientError as error:
            return [], error.status.name if error.status else "TRANSPORT"
        offsets: dict[bytes, int] = {}
        try:
            async with asyncio.timeout(10):
                while len(offsets) < len(NEW):
                    message = await consumer.receive()
                    await consumer.ack(message)
                    offsets.setdefault(message.payload, message.offset)
        except TimeoutError:
            pass
        await consumer.close()
        return [offsets.get(p, -1) for p in NEW], None


def test_a_flipped_bit_in_the_newest_segment_is_not_silent_loss(broker: WatchedBroker) -> None:
    broker.stop_watcher()
    assert broker.process.stop() == 0, "the broker did not stop cleanly"
    segment = _newest_segment(broker)
    position = _flip_bit_near_end(segment)
    broker.process.start()
    broker.start_watcher()
    started = broker.mark()

    offsets, refused = asyncio.run(asyncio.wait_for(_publish_new(broker), 60))
    try:
        found = asyncio.run(broker.read_acknowledged(timeout=15))
        read_refusal = None
    except DanubeClientError as error:
        found, read_refusal = {}, error.status.name if error.status else "TRANSPORT"
    except TimeoutError:
        found, read_refusal = {}, None
    acknowledged = broker.offsets
    last_acknowledged = max(acknowledged)
    corruption_logged = any(
        "corrupt" in line and segment.name in line for line in broker.process.log_lines
    )
    served_intact = all(found.get(o) == p for o, p in acknowledged.items())
    outcome = "INTACT" if served_intact else (f"REFUSED {read_refusal}" if read_refusal else "LOST")
    LEDGER.record("storage", "bit flip in the newest frame", outcome)
    broker.run.acknowledged_intact = served_intact
    if not served_intact:
        broker.run.acknowledged_outcome = (
            f"refused: {outcome}, corruption logged {corruption_logged}"
        )
    broker.assert_healthy_since(started, "restart after a flipped bit")

    differing = sorted(o for o in acknowledged if o in found and found[o] != acknowledged[o])
    assert not differing, f"offsets {differing} now serve other bytes (bit at byte {position})"
    reused = [o for o in offsets if 0 <= o <= last_acknowledged]
    assert not reused, f"new messages got acknowledged offsets {reused}"
    if refused is None:
        assert -1 not in offsets, f"the audit subscription missed new messages: {offsets}"
    assert served_intact or (read_refusal is not None and corruption_logged), (
        f"acknowledged offsets {sorted(set(acknowledged) - set(found))} are gone without a "
        f"corruption error (read refusal: {read_refusal}, publish refusal: {refused}, "
        f"{segment.name} byte {position})"
    )


def test_the_broker_came_through(broker: WatchedBroker) -> None:
    problems = broker.finish(reread=False)
    assert not problems, "; ".join(problems)
