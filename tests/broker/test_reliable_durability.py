"""Reliable topics through a real broker process, against the disk: acknowledged messages
survive SIGKILL, a torn tail is cut off and offsets continue after it, and a byte changed in
the middle of a segment stops that topic (FAILED_PRECONDITION naming the file) but not the
broker (spec/durability.md, spec/wal-format.md; issue 3, point 7).

The segment files are read and damaged by walking the frames as spec/wal-format.md describes,
not with `danube.machines.wal.format`: the on-disk layout is a contract for outside readers, so the
test relies on the page, not on the code under test.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.client import DanubeClient, DanubeClientError, DispatchStrategy, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from tests.support.aio import receive_for, receive_n, run, unique_topic
from tests.support.wire import channel_to

pytestmark = pytest.mark.slow

RELIABLE = DispatchStrategy.RELIABLE

# -- segment files as spec/wal-format.md describes them --------------------------------------

SEGMENT_MAGIC = b"DANUBEWL"
FRAME_MAGIC = 0x46574E44
FRAME_HEAD = struct.Struct("<IIIHHQQ")  # crc, length, magic, flags, count, base, publish time
FRAME_HEAD_BYTES = 32


@dataclass(frozen=True, slots=True)
class FrameAt:
    """Where one frame lies in a segment file and which offsets it holds."""

    start: int
    length: int
    base_offset: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.length


def _frames(data: bytes) -> list[FrameAt]:
    """Every frame of an undamaged segment, in file order. Fails unless the file is exactly a
    header followed by whole, densely numbered frames, so a damage step below cuts or flips
    what the test thinks it does."""
    assert data[:8] == SEGMENT_MAGIC, data[:16]
    (header_bytes,) = struct.unpack_from("<H", data, 10)
    frames: list[FrameAt] = []
    pos = header_bytes
    while pos < len(data):
        _crc, length, magic, _flags, count, base, _time = FRAME_HEAD.unpack_from(data, pos)
        assert magic == FRAME_MAGIC, f"no frame magic at byte {pos}"
        if frames:
            assert base == frames[-1].base_offset + frames[-1].count, "offsets not dense"
        frames.append(FrameAt(pos, length, base, count))
        pos += length
    assert pos == len(data), "the last frame runs past the end of the file"
    return frames


def _topic_dir(broker: BrokerProcess, topic: str) -> Path:
    """`<data_dir>/wal/<namespace>/<topic>`: the default WAL root and topic layout."""
    _, namespace, name = topic.split("/")
    return broker.data_dir / "wal" / namespace / name


def _segments(broker: BrokerProcess, topic: str) -> list[Path]:
    """The topic's segment files, oldest first (names are 20-digit base offsets)."""
    paths = sorted(_topic_dir(broker, topic).glob("*.wal"))
    for path in paths:
        assert re.fullmatch(r"\d{20}\.wal", path.name), path.name
    return paths


# -- broker and wire helpers ------------------------------------------------------------------


def _wait_until_bindable(port: int, timeout: float = 5.0) -> None:
    """After SIGKILL the kernel may hold a listening port for a moment; a restart on the same
    address (which clients reconnect to) must wait for it rather than fail."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.05)


def _kill_and_restart(broker: BrokerProcess) -> None:
    """SIGKILL, then start again on the same ports and data directory."""
    address = broker.broker_addr
    broker.kill()
    for attempt in range(3):
        _wait_until_bindable(broker.broker_port)
        _wait_until_bindable(broker.admin_port)
        try:
            broker.start()
            break
        except RuntimeError:
            if attempt == 2:
                raise
    assert broker.broker_addr == address


async def _create_reliable_producer(channel: Channel, topic: str, name: str = "p") -> int:
    response = await pb.ProducerServiceStub(channel).create_producer(
        pb.ProducerRequest(
            request_id=1,
            producer_name=name,
            topic_name=topic,
            dispatch_strategy=pb.DispatchStrategy.Reliable,
        )
    )
    return response.producer_id


async def _past_lazy_recovery(call: Callable[[], Awaitable[None]]) -> None:
    """`call()`, again while it answers UNAVAILABLE, as every client does: a restarted broker
    recovers a topic's WAL lazily (at its first use, or when the start-up sweep reaches it) and
    answers "loading its write-ahead log; retry shortly" until then. Without the retry a raw
    call right after a start saw that answer on a slow machine instead of the outcome of the
    recovery (CI, stop 42)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            await call()
            return
        except GRPCError as error:
            if error.status is not Status.UNAVAILABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def _send_raw(channel: Channel, producer_id: int, topic: str, payload: bytes) -> None:
    msg_id = pb.MsgId(producer_id=producer_id, topic_name=topic)
    response = await pb.ProducerServiceStub(channel).send_message(
        pb.StreamMessage(request_id=9, msg_id=msg_id, payload=payload, producer_name="p")
    )
    assert response.request_id == 9


async def _send_until_acknowledged(client: DanubeClient, topic: str, payload: bytes) -> int:
    """Sends one reliable message, retrying while the broker is away; returns the attempts."""
    producer = client.producer(topic, "p", dispatch=RELIABLE)
    for attempt in range(1, 100):
        try:
            await asyncio.wait_for(producer.send(payload), 20)
            return attempt
        except DanubeClientError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{payload!r} was never acknowledged")


# -- (a) zero loss under SIGKILL --------------------------------------------------------------

SEED = 20260307
MESSAGES = 3000
KILLS = 4


@dataclass
class Chaos:
    """What the producer and the killer share: progress, and how many kills have begun and
    ended, so the producer can tell which sends a kill may have interrupted."""

    acknowledged: int = 0
    kills_started: int = 0
    kills_finished: int = 0
    done: bool = False
    exposed: set[int] = field(default_factory=set)
    """Sequence numbers whose send overlapped a kill: the only ones that may be stored twice
    (the reply was lost, so the client or the test sent them again)."""
    raised: Counter[int] = field(default_factory=Counter)
    """Sends that raised to the test (it retried them), by sequence number."""
    logs: list[str] = field(default_factory=list)
    """The log of each killed broker process, for the failure message."""


def _tails(logs: list[str], lines: int = 15) -> str:
    """The last lines of each broker process's log, for a failure message."""
    return "\n".join(
        f"--- broker run {run_number} ---\n" + "\n".join(log.splitlines()[-lines:])
        for run_number, log in enumerate(logs)
    )


async def _produce(producer_client: DanubeClient, topic: str, chaos: Chaos) -> None:
    producer = producer_client.producer(topic, "p", dispatch=RELIABLE)
    await producer.create()
    for seq in range(MESSAGES):
        finished_before = chaos.kills_finished
        while True:
            try:
                # A send either completes or fails once the connection breaks; one that hangs
                # is a bug to report, not a case to retry.
                await asyncio.wait_for(producer.send(str(seq).encode()), 20)
                break
            except DanubeClientError:
                chaos.raised[seq] += 1
            await asyncio.sleep(0.05)
        if chaos.kills_started > finished_before:
            chaos.exposed.add(seq)
        chaos.acknowledged = seq + 1
    chaos.done = True


async def _kill_repeatedly(broker: BrokerProcess, chaos: Chaos, rng: random.Random) -> None:
    """Kills at random points of the production (after a random number of acknowledged
    messages plus a random few milliseconds, so the kill usually lands inside a send)."""
    thresholds = sorted(rng.sample(range(200, MESSAGES - 200), KILLS))
    for threshold in thresholds:
        while chaos.acknowledged < threshold:
            await asyncio.sleep(0.001)
        await asyncio.sleep(rng.uniform(0, 0.02))
        assert not chaos.done, "production finished before every kill happened"
        chaos.logs.append(broker.log_text())
        chaos.kills_started += 1
        await asyncio.to_thread(_kill_and_restart, broker)
        chaos.kills_finished += 1


@dataclass(frozen=True, slots=True)
class Audit:
    by_offset: dict[int, bytes]
    deliveries: int
    sentinel_offset: int


async def _read_to_sentinel(client: DanubeClient, topic: str, sentinel: bytes) -> Audit:
    """Reads the audit subscription (created before producing) until the sentinel, acking
    each message; redeliveries of one offset must repeat its payload."""
    consumer = client.consumer(topic, "c", "audit", sub_type=SubType.EXCLUSIVE, start="earliest")
    await consumer.subscribe()
    by_offset: dict[int, bytes] = {}
    deliveries = 0
    try:
        async with asyncio.timeout(40):
            while True:
                message = await consumer.receive()
                await consumer.ack(message)
                deliveries += 1
                seen = by_offset.setdefault(message.offset, message.payload)
                assert seen == message.payload, (
                    f"offset {message.offset} named {seen!r} and then {message.payload!r}"
                )
                if message.payload == sentinel:
                    return Audit(by_offset, deliveries, message.offset)
    except TimeoutError:
        raise AssertionError(
            f"sentinel not received; got {len(by_offset)} offsets in {deliveries} deliveries"
        ) from None
    finally:
        await consumer.close()


def test_sigkill_during_reliable_production_loses_nothing_acknowledged(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """The promise of `fsync` durability: a send that returned is on disk, so SIGKILLs at
    random points of a long production lose nothing. Sends cut off by a kill are retried
    until acknowledged, so a message whose first reply was lost may be stored twice (once per
    attempt) — only those. Offsets stay dense and every offset names one payload, whatever
    the redeliveries."""
    broker = broker_factory(tmp_path / "data").start()
    topic = unique_topic("sigkill")
    chaos = Chaos()
    rng = random.Random(SEED)
    sentinel = b"end"

    async def scenario() -> Audit:
        async with DanubeClient(broker.url) as client:
            await client.producer(topic, "p", dispatch=RELIABLE).create()
            # The audit subscription exists before the first message and reads nothing
            # until production ends: everything must wait for it on disk.
            audit = client.consumer(
                topic, "c", "audit", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            await audit.subscribe()
            await audit.close()
            await asyncio.gather(
                _produce(client, topic, chaos), _kill_repeatedly(broker, chaos, rng)
            )
            await _send_until_acknowledged(client, topic, sentinel)
            return await _read_to_sentinel(client, topic, sentinel)

    started = time.monotonic()
    audit = run(scenario, timeout=150)
    elapsed = time.monotonic() - started

    assert chaos.kills_finished == KILLS
    offsets = sorted(audit.by_offset)
    assert offsets == list(range(len(offsets))), "offsets are not dense from 0"
    assert audit.sentinel_offset == offsets[-1], "something was stored after the sentinel"
    stored = Counter(int(audit.by_offset[offset]) for offset in offsets[:-1])
    lost = sorted(set(range(MESSAGES)) - set(stored))
    foreign = sorted(set(stored) - set(range(MESSAGES)))
    duplicated = {seq: count - 1 for seq, count in stored.items() if count > 1}
    redelivered = audit.deliveries - len(audit.by_offset)
    print(
        f"\n{MESSAGES} messages, {KILLS} SIGKILLs in {elapsed:.1f} s; "
        f"sends that raised and were retried: {dict(chaos.raised)}; "
        f"sends that overlapped a kill: {sorted(chaos.exposed)}; "
        f"stored twice or more: {duplicated}; redelivered offsets: {redelivered}"
    )
    logs = _tails([*chaos.logs, broker.log_text()])
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:10]}\n{logs}"
    assert not foreign, foreign
    assert set(chaos.raised) <= chaos.exposed, "a send failed without a kill during it"
    assert set(duplicated) <= chaos.exposed, (
        f"stored more than once without a kill during their send: "
        f"{sorted(set(duplicated) - chaos.exposed)}\n{logs}"
    )


# -- (b) a torn tail --------------------------------------------------------------------------


def test_torn_tail_is_cut_and_offsets_continue_after_it(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """A crash in the middle of writing the newest frame leaves a torn tail: the broker cuts
    it off, serves every whole frame, and the next message takes the first offset after the
    last surviving record (the torn one was never acknowledged nor readable, so nobody saw
    that offset). The torn frame is one that was being written when the process died: the
    next offset's frame, cut short, after every acknowledged one (cutting an acknowledged
    frame is damage to durable data instead: tests/broker/test_wal_damage.py)."""
    broker = broker_factory(tmp_path / "data").start()
    topic = unique_topic("torn")
    count = 50

    async def produce() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(topic, "p", dispatch=RELIABLE).create()
            for seq in range(count):
                await producer.send(str(seq).encode())

    run(produce)
    broker.kill()
    [segment] = _segments(broker, topic)
    frames = _frames(segment.read_bytes())
    assert sum(frame.count for frame in frames) == count
    assert len(frames) >= 2, "sequential sends should be separate frames"
    surviving = count
    last = frames[-1]
    torn = bytearray(segment.read_bytes()[last.start : last.end])
    struct.pack_into("<Q", torn, 16, surviving)  # the unacknowledged next frame's offset
    with segment.open("ab") as file:
        file.write(torn[:-10])  # mid-frame: every frame is >= 36 bytes

    broker.start()

    async def after() -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
        async with DanubeClient(broker.url) as client:
            consumer = client.consumer(
                topic, "c", "after", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            await consumer.subscribe()
            old = await receive_n(consumer, surviving)
            producer = await client.producer(topic, "p", dispatch=RELIABLE).create()
            await producer.send(b"after-restart")
            new = await receive_n(consumer, 1)
            new += await receive_for(consumer, 0.5)
            return [(m.offset, m.payload) for m in old], [(m.offset, m.payload) for m in new]

    old, new = run(after)
    assert old == [(seq, str(seq).encode()) for seq in range(surviving)]
    assert new == [(surviving, b"after-restart")]
    # Recovery truncated the torn bytes, and the first append after it began a new segment
    # named by its base offset (segments found at recovery are closed).
    assert segment.stat().st_size == frames[-1].end
    assert (segment.parent / f"{surviving:020d}.wal").exists()
    log = broker.log_text()
    assert "Traceback" not in log, log
    assert "event=topic_stopped" not in log, log


# -- (c) a flipped byte in the middle ---------------------------------------------------------


def test_corrupt_segment_stops_only_its_topic(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """A byte changed inside durable data, with valid frames after it, is corruption, not a
    torn tail: skipping it would silently lose acknowledged messages and reuse offsets. The
    broker must start anyway, stop that one topic with an error an operator can act on (the
    file, and what to do) and leave the file as it is, while other topics, reliable ones
    included, keep working."""
    broker = broker_factory(tmp_path / "data").start()
    damaged = unique_topic("flipped")
    healthy = unique_topic("healthy")
    sends = 30

    async def before() -> int:
        async with channel_to(broker.broker_addr) as channel:
            producer_id = await _create_reliable_producer(channel, damaged)
            for seq in range(sends):
                await _send_raw(channel, producer_id, damaged, str(seq).encode())
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(healthy, "p", dispatch=RELIABLE).create()
            for seq in range(5):
                await producer.send(f"h{seq}".encode())
        return producer_id

    producer_id = run(before)
    broker.kill()
    [segment] = _segments(broker, damaged)
    data = bytearray(segment.read_bytes())
    frames = _frames(bytes(data))
    assert len(frames) == sends
    frame = frames[len(frames) // 3]
    position = frame.start + FRAME_HEAD_BYTES + (frame.length - FRAME_HEAD_BYTES) // 2
    data[position] ^= 0xFF
    segment.write_bytes(data)

    broker.start()

    async def after() -> tuple[GRPCError, GRPCError, DanubeClientError]:
        async with channel_to(broker.broker_addr) as channel:
            with pytest.raises(GRPCError) as send:
                await _past_lazy_recovery(
                    lambda: _send_raw(channel, producer_id, damaged, b"into-a-stopped-topic")
                )
            with pytest.raises(GRPCError) as create:
                await _create_reliable_producer(channel, damaged, "another")
        async with DanubeClient(broker.url) as client:
            with pytest.raises(DanubeClientError) as subscribe:
                await client.consumer(
                    damaged, "c", "s", sub_type=SubType.EXCLUSIVE, start="earliest"
                ).subscribe()
        return send.value, create.value, subscribe.value

    send, create, subscribe = run(after)
    statuses = [send.status, create.status, subscribe.status]
    assert statuses == [Status.FAILED_PRECONDITION] * 3, (send, create, subscribe)
    for message in (send.message or "", create.message or "", str(subscribe)):
        assert segment.name in message, message
        assert "restore" in message or "move" in message, message
    # Where the damage is, so an operator can inspect it (spec/durability.md, "Recovery").
    assert damaged in (create.message or "") and str(frame.start) in (create.message or "")
    broker.wait_for_log(rf"event=topic_stopped .*topic={re.escape(damaged)}(\s|$)", timeout=5)
    assert segment.read_bytes() == data, "the damaged segment was changed"

    other = unique_topic("other")

    async def others_still_work() -> tuple[list[tuple[int, bytes]], list[bytes]]:
        async with DanubeClient(broker.url) as client:
            consumer = client.consumer(
                healthy, "c", "s", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            await consumer.subscribe()
            producer = await client.producer(healthy, "p", dispatch=RELIABLE).create()
            await producer.send(b"h-after")
            reliable = await receive_n(consumer, 6)
            plain = await client.producer(other, "p").create()
            plain_consumer = await client.consumer(
                other, "c", "s", sub_type=SubType.EXCLUSIVE
            ).subscribe()
            await plain.send(b"plain")
            received = await receive_n(plain_consumer, 1)
            return [(m.offset, m.payload) for m in reliable], [m.payload for m in received]

    reliable, plain = run(others_still_work)
    assert reliable == [(i, f"h{i}".encode()) for i in range(5)] + [(5, b"h-after")]
    assert plain == [b"plain"]
    assert broker.process is not None and broker.process.poll() is None
    assert "Traceback" not in broker.log_text(), broker.log_text()
