"""The replication transport (`danube.runtime.replication_link`, `replication_service`) over
real grpclib servers on loopback: an owner's `ReplicationLinks` streams `Replicate`s for
several topics to follower brokers' `ReplicationService`s in order and gets their answers in
order; a follower's restart is exactly one `on_broken` and a reconnect; sends queued while a
follower is away arrive once it is back; an overflowing queue is one loss; malformed messages
are refused with a clear error on either side; `EpochEnd` answers a follower's question."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpclib.const
import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.machines.memory.publish import PublishPool
from danube.machines.replication.messages import (
    FollowerAnswer,
    Mismatch,
    Replicate,
    Replicated,
)
from danube.proto import danube_ext as ext_pb
from danube.runtime.grpc_util import Server, Unimplemented
from danube.runtime.replication_codec import FROM_BROKER_HEADER, ReplicaCodecError
from danube.runtime.replication_link import ReplicationLinks, ask_epoch_end
from danube.runtime.replication_service import STREAM_PATH, Outbox, ReplicationService
from danube.values.errors import DanubeError, ErrorCode, not_found

TOPICS = ("/default/a", "/default/b")


class Echo:
    """A follower's handler: answers each Replicate with Replicated(its end), `delay_s` later
    (a follower answers once durable, after the request)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.received: list[tuple[str, Replicate]] = []
        self.closed: list[str] = []
        self.late: list[bool] = []

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        self.received.append((from_broker, message))
        answer = Replicated(message.topic, message.epoch, message.end)
        if self.delay_s:
            loop = asyncio.get_running_loop()
            loop.call_later(self.delay_s, lambda: self.late.append(outbox.put(answer)))
        else:
            outbox.put(answer)

    def stream_closed(self, from_broker: str, outbox: Outbox) -> None:
        self.closed.append(from_broker)

    async def epoch_end(self, topic: str, epoch: int) -> tuple[int, int]:
        if topic != TOPICS[0]:
            raise not_found(f"topic {topic} is not owned here")
        return 100 + epoch, 7


class Follower:
    """A follower broker's admin server, which can be stopped and started on the same port."""

    def __init__(self, handler: Any, **options: Any) -> None:
        self.service = ReplicationService(handler, **options)
        self.port = 0
        self.server: Server | None = None

    async def start(self) -> Follower:
        self.server = Server([self.service])
        await self.server.start("127.0.0.1", self.port)
        assert self.server._server is not None
        self.port = self.server._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        self.server.close_connections()
        await self.server.wait_closed()
        self.server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class Owner:
    """An owner's links with what its callbacks were told, in order."""

    def __init__(self, addresses: dict[str, str], **options: Any) -> None:
        self.answers: dict[str, list[FollowerAnswer]] = {}
        self.events: list[tuple[str, str]] = []
        self.links = ReplicationLinks(
            addresses.get,
            self._answer,
            self._broken,
            from_broker="owner-1",
            backoff_s=0.01,
            backoff_cap_s=0.05,
            **options,
        )
        self.on_broken: Callable[[str], None] = lambda follower: None

    def _answer(self, follower: str, answer: FollowerAnswer) -> None:
        self.answers.setdefault(follower, []).append(answer)
        self.events.append((follower, "answer"))

    def _broken(self, follower: str) -> None:
        self.events.append((follower, "broken"))
        self.on_broken(follower)

    def broken(self, follower: str) -> int:
        return self.events.count((follower, "broken"))


def _replicate(topic: str, prev_end: int, count: int = 2, epoch: int = 3) -> Replicate:
    frames = f"{topic}:{prev_end}".encode() * count
    return Replicate(topic, epoch, prev_end, frames, count, commit=prev_end)


async def _until(check: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.005)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


def test_two_followers_two_topics_in_order() -> None:
    async def test() -> None:
        handlers = {"f1": Echo(), "f2": Echo(delay_s=0.002)}
        followers = {name: await Follower(h).start() for name, h in handlers.items()}
        owner = Owner({name: f.address for name, f in followers.items()})
        sent: dict[str, list[Replicate]] = {name: [] for name in followers}
        ends = dict.fromkeys(TOPICS, 0)
        for i in range(60):
            topic = TOPICS[i % 2]
            message = _replicate(topic, ends[topic], count=1 + i % 3)
            ends[topic] = message.end
            for name in followers:
                assert owner.links.send(name, message)
                sent[name].append(message)
        await _until(lambda: all(len(owner.answers.get(n, [])) == 60 for n in followers))
        for name, handler in handlers.items():
            assert [m for _, m in handler.received] == sent[name]
            assert {b for b, _ in handler.received} == {"owner-1"}
            expected = [Replicated(m.topic, m.epoch, m.end) for m in sent[name]]
            assert owner.answers[name] == expected
            stats = owner.links.stats_of(name)
            assert (stats.sent, stats.answers, stats.breaks, stats.connects) == (60, 60, 0, 1)
            assert stats.sent_bytes == sum(len(m.frames) for m in sent[name])
            assert followers[name].service.stats.requests == 60
        assert owner.links.stats.sent == 120
        await owner.links.close()
        for follower in followers.values():
            await follower.stop()
        assert not owner.links.send("f1", _replicate(TOPICS[0], 0))

    _run(test)


def test_follower_restart_is_one_break_and_a_reconnect() -> None:
    async def test() -> None:
        handler = Echo()
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        for i in range(5):
            owner.links.send("f", _replicate(TOPICS[0], 2 * i))
        await _until(lambda: len(owner.answers.get("f", [])) == 5)
        await follower.stop()
        await _until(lambda: owner.broken("f") == 1)
        assert not owner.links.connected("f")
        # Sent while the follower is away: queued for the next stream, not lost.
        later = [_replicate(TOPICS[1], 2 * i) for i in range(3)]
        for message in later:
            assert owner.links.send("f", message)
        await asyncio.sleep(0.1)  # several failed connection attempts: no further break
        assert owner.broken("f") == 1
        assert owner.links.stats_of("f").connect_failures >= 1
        await follower.start()
        await _until(lambda: len(owner.answers["f"]) == 8)
        assert [m for _, m in handler.received[5:]] == later
        stats = owner.links.stats_of("f")
        assert (stats.breaks, stats.reconnects) == (1, 1)
        assert owner.links.connected("f")
        assert handler.closed == ["owner-1"]
        # The break came after every answer of the first stream, and the later answers after it.
        assert owner.events.index(("f", "broken")) == 5
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_sends_from_inside_on_broken_go_on_the_next_stream() -> None:
    """What `OwnerReplication.stream_broke` does: resend from inside the report."""

    async def test() -> None:
        handler = Echo()
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        resend = _replicate(TOPICS[0], 0)
        owner.on_broken = lambda name: owner.links.send(name, resend)
        owner.links.send("f", resend)
        await _until(lambda: len(owner.answers.get("f", [])) == 1)
        await follower.stop()
        await _until(lambda: owner.broken("f") == 1)
        await follower.start()
        await _until(lambda: len(owner.answers["f"]) == 2)
        assert [m for _, m in handler.received] == [resend, resend]
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_a_send_on_an_idle_established_stream_is_written_at_once_in_order() -> None:
    """Issue 27 point 6: nothing queued, so the send goes to the stream in the call, not a
    loop turn later by the writer task; a send larger than one frame still queues, and the
    small sends after it queue behind it (order kept)."""

    async def test() -> None:
        handler = Echo()
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        first = _replicate(TOPICS[0], 0)
        assert owner.links.send("f", first)  # connecting: queued
        await _until(lambda: len(owner.answers.get("f", [])) == 1)
        link = owner.links._links["f"]
        second = _replicate(TOPICS[0], 2)
        assert owner.links.send("f", second)
        assert not link.queue and owner.links.stats_of("f").sent == 2  # written in the call
        large = _replicate(TOPICS[0], 4, count=4000)  # more than one 16 KiB frame
        after = _replicate(TOPICS[0], 4004)
        assert owner.links.send("f", large) and owner.links.send("f", after)
        assert len(link.queue) == 2
        await _until(lambda: len(owner.answers.get("f", [])) == 4)
        assert [m for _, m in handler.received] == [first, second, large, after]
        assert owner.broken("f") == 0
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_a_full_queue_is_one_loss() -> None:
    async def test() -> None:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{unused.getsockname()[1]}"  # nobody listens there
        owner = Owner({"f": address}, queue_messages=3)
        assert all(owner.links.send("f", _replicate(TOPICS[0], 2 * i)) for i in range(3))
        assert owner.broken("f") == 0  # queued while connecting: no loss yet
        assert not owner.links.send("f", _replicate(TOPICS[0], 6))
        assert owner.broken("f") == 1
        stats = owner.links.stats_of("f")
        assert (stats.dropped, stats.breaks) == (4, 1)
        assert owner.links.send("f", _replicate(TOPICS[0], 0))  # the resend is queued again
        await owner.links.close()

    _run(test)


def test_malformed_sends_raise_before_anything_is_queued() -> None:
    async def test() -> None:
        owner = Owner({}, frames_limit=16)
        with pytest.raises(ReplicaCodecError, match="exceed the limit of 16 bytes"):
            owner.links.send("f", Replicate("t", 1, 0, b"x" * 17, 1, 0))
        with pytest.raises(ReplicaCodecError, match="prev_end -1"):
            owner.links.send("f", Replicate("t", 1, -1, b"x", 1, 0))
        assert owner.links.followers == []
        await owner.links.close()

    _run(test)


async def _raw_stream(port: int, requests: list[bytes], metadata: dict[str, str]) -> Any:
    """Sends encoded ReplicaRequests on a raw stream; the follower's status (GRPCError)."""
    channel = Channel("127.0.0.1", port)
    try:
        async with channel.request(
            STREAM_PATH, grpclib.const.Cardinality.STREAM_STREAM, ext_pb.ReplicaRequest,
            ext_pb.ReplicaAnswer, metadata=metadata, timeout=5,
        ) as stream:  # fmt: skip
            for body in requests:
                await stream.send_message(ext_pb.ReplicaRequest().parse(body))
            await stream.end()
            return [answer async for answer in stream]
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("request_", "metadata", "reason"),
    [
        (ext_pb.ReplicaRequest(topic="t", frames=b"x" * 2048, record_count=1), None, "limit"),
        (ext_pb.ReplicaRequest(topic="t", frames=b"x"), None, "record_count is 0"),
        (ext_pb.ReplicaRequest(topic="", record_count=0), None, "topic must be a non-empty"),
        (ext_pb.ReplicaRequest(topic="t"), {}, FROM_BROKER_HEADER),
    ],
)
def test_follower_refuses_malformed_requests(
    request_: ext_pb.ReplicaRequest, metadata: dict[str, str] | None, reason: str
) -> None:
    async def test() -> None:
        handler = Echo()
        follower = await Follower(handler, frames_limit=1024).start()
        header = {FROM_BROKER_HEADER: "owner-1"} if metadata is None else metadata
        with pytest.raises(GRPCError, match=reason) as caught:
            await _raw_stream(follower.port, [bytes(request_)], header)
        assert caught.value.status is Status.INVALID_ARGUMENT
        assert handler.received == []
        assert follower.service.stats.refused == 1
        await follower.stop()

    _run(test)


def test_a_well_formed_raw_stream_is_answered() -> None:
    """The baseline of the refusals above: the same path accepts a good request."""

    async def test() -> None:
        follower = await Follower(Echo()).start()
        probe = bytes(ext_pb.ReplicaRequest(topic="t", epoch=2, prev_end=5))
        answers = await _raw_stream(follower.port, [probe], {FROM_BROKER_HEADER: "owner-1"})
        assert answers == [
            ext_pb.ReplicaAnswer(
                kind=ext_pb.ReplicaAnswerKind.REPLICATED, topic="t", epoch=2, end=5
            )
        ]
        await follower.stop()

    _run(test)


class BadAnswers:
    """A follower that answers with an unknown kind."""

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        outbox._stream = None  # queued, not written at once (`Outbox._send_now`): swapped below
        outbox.put(Mismatch(message.topic, message.epoch, 0))
        outbox._answers[-1] = bytes(ext_pb.ReplicaAnswer(kind=9, topic="t"))  # type: ignore[arg-type]

    def stream_closed(self, from_broker: str, outbox: Outbox) -> None:
        pass

    async def epoch_end(self, topic: str, epoch: int) -> tuple[int, int]:
        raise AssertionError


def test_a_malformed_answer_breaks_the_stream_once() -> None:
    async def test() -> None:
        follower = await Follower(BadAnswers()).start()
        owner = Owner({"f": follower.address})
        owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: owner.broken("f") == 1)
        await _until(lambda: owner.links.stats_of("f").connects == 2)
        stats = owner.links.stats_of("f")
        assert (stats.protocol_errors, stats.answers, stats.breaks) == (1, 0, 1)
        assert "answer" not in {kind for _, kind in owner.events}
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_answers_after_the_stream_ended_are_dropped() -> None:
    async def test() -> None:
        handler = Echo(delay_s=0.2)
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: len(handler.received) == 1)
        await owner.links.close()
        await _until(lambda: handler.late == [False])
        assert follower.service.stats.answers_dropped == 1
        assert owner.events == []
        await follower.stop()

    _run(test)


def test_epoch_end() -> None:
    async def test() -> None:
        follower = await Follower(Echo()).start()
        assert await ask_epoch_end(follower.address, TOPICS[0], 4) == (104, 7)
        with pytest.raises(DanubeError, match="not owned here") as caught:
            await ask_epoch_end(follower.address, TOPICS[1], 4)
        assert caught.value.code is ErrorCode.NOT_FOUND
        with pytest.raises(ReplicaCodecError, match="epoch -1"):
            await ask_epoch_end(follower.address, TOPICS[0], -1)
        port = follower.port
        await follower.stop()
        with pytest.raises(DanubeError, match="did not answer") as caught:
            await ask_epoch_end(f"127.0.0.1:{port}", TOPICS[0], 4, timeout=1)
        assert caught.value.code is ErrorCode.UNAVAILABLE

    _run(test)


def test_drop_closes_a_link_without_a_report() -> None:
    async def test() -> None:
        handler = Echo()
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: len(owner.answers.get("f", [])) == 1)
        await owner.links.drop("f")
        await _until(lambda: handler.closed == ["owner-1"])
        assert owner.links.followers == []
        assert owner.broken("f") == 0
        assert owner.links.send("f", _replicate(TOPICS[0], 2))  # a new link
        await _until(lambda: len(owner.answers["f"]) == 2)
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_a_newer_stream_from_the_same_owner_replaces_the_older() -> None:
    """A half-open connection must not keep a second stream (and outbox) per owner."""

    async def test() -> None:
        handler = Echo()
        follower = await Follower(handler).start()
        first = Owner({"f": follower.address})
        second = Owner({"f": follower.address})  # the same broker id, "owner-1"
        first.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: len(first.answers.get("f", [])) == 1)
        second.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: len(second.answers.get("f", [])) == 1)
        await _until(lambda: first.broken("f") == 1)
        assert handler.closed[0] == "owner-1"  # then they take turns, with backoff
        await asyncio.gather(first.links.close(), second.links.close())
        await follower.stop()

    _run(test)


class Chatty(Echo):
    """Answers every request three times: beyond the outbox's limit of 2. The answers queue
    as they do when the stream cannot take them at once (its flow-control window used up by
    an owner that does not read), not written in the call (`Outbox._send_now`)."""

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        self.received.append((from_broker, message))
        outbox._stream = None
        for _ in range(3):
            outbox.put(Replicated(message.topic, message.epoch, message.end))


class Counting(Echo):
    """Echoes, noting after each answer how many answers wait in the outbox."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[int] = []

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        self.received.append((from_broker, message))
        outbox.put(Replicated(message.topic, message.epoch, message.end))
        self.waiting.append(len(outbox._answers))


def test_an_answer_on_an_idle_stream_is_written_at_once() -> None:
    """Issue 27 point 6: the follower's answer goes to the stream in `put`, not a loop turn
    later by the outbox's writer task."""

    async def test() -> None:
        handler = Counting()
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        for i in range(5):
            owner.links.send("f", _replicate(TOPICS[0], 2 * i))
        await _until(lambda: len(owner.answers.get("f", [])) == 5)
        assert handler.waiting == [0] * 5
        assert follower.service.stats.answers_sent == 5
        assert owner.answers["f"] == [Replicated(TOPICS[0], 3, 2 * i + 2) for i in range(5)]
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_unread_answers_beyond_the_limit_end_the_stream() -> None:
    async def test() -> None:
        follower = await Follower(Chatty(), outbox_limit=2).start()
        owner = Owner({"f": follower.address})
        owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: owner.broken("f") == 1)
        assert follower.service.stats.answers_dropped == 1
        assert owner.links.stats_of("f").answers <= 2
        await owner.links.close()
        await follower.stop()

    _run(test)


class Pairs(Echo):
    """Answers requests two at a time, in one HTTP/2 send."""

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        self.received.append((from_broker, message))
        if len(self.received) % 2 == 0:
            for _, m in self.received[-2:]:
                outbox.put(Replicated(m.topic, m.epoch, m.end))


def test_nothing_of_a_lost_stream_is_delivered_after_its_break() -> None:
    """The loss happens while the owner handles the first of two answers that arrived
    together: the second is not delivered after `on_broken`."""

    async def test() -> None:
        follower = await Follower(Pairs()).start()
        owner = Owner({"f": follower.address}, queue_messages=1)

        def burst(follower_id: str, answer: FollowerAnswer) -> None:
            owner._answer(follower_id, answer)
            if len(owner.answers[follower_id]) == 1:
                # larger than one HTTP/2 frame: queued, not written at once (`_send_now`)
                owner.links.send(follower_id, _replicate(TOPICS[1], 0, count=4000))
                owner.links.send(follower_id, _replicate(TOPICS[1], 2))  # the queue is full

        owner.links._on_answer = burst
        owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: owner.links.stats_of("f").sent == 1)
        owner.links.send("f", _replicate(TOPICS[0], 2))
        await _until(lambda: owner.broken("f") == 1)
        await asyncio.sleep(0.05)
        assert owner.events == [("f", "answer"), ("f", "broken")]
        await owner.links.close()
        await follower.stop()

    _run(test)


class HugePrefix:
    """A broken follower: announces a 1 GiB answer and sends three bytes of it."""

    async def stream(self, stream: Any) -> None:
        await stream.send_initial_metadata()
        await stream.recv_message()
        await stream._stream.send_data(b"\x00\x40\x00\x00\x00abc")
        await asyncio.sleep(10)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            STREAM_PATH: grpclib.const.Handler(
                self.stream,
                grpclib.const.Cardinality.STREAM_STREAM,
                ext_pb.ReplicaRequest,
                ext_pb.ReplicaAnswer,
            )
        }


def test_an_oversized_answer_is_refused_before_it_is_buffered() -> None:
    async def test() -> None:
        server = Server([HugePrefix()])
        await server.start("127.0.0.1", 0)
        assert server._server is not None
        port = server._server.sockets[0].getsockname()[1]
        owner = Owner({"f": f"127.0.0.1:{port}"})
        owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: owner.broken("f") == 1)  # at once, not after 1 GiB
        assert owner.links.stats_of("f").protocol_errors == 1
        await owner.links.close()
        server.close()
        server.close_connections()
        await server.wait_closed()

    _run(test)


def test_a_large_group_commit_crosses_flow_control() -> None:
    """Several times grpclib's 4 MiB HTTP/2 window in one Replicate."""

    async def test() -> None:
        handler = Echo()
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        big = Replicate(TOPICS[0], 1, 0, bytes(range(256)) * (48 << 10), 1000, 0)  # 12 MiB
        owner.links.send("f", big)
        owner.links.send("f", _replicate(TOPICS[0], 1000))
        await _until(lambda: len(owner.answers.get("f", [])) == 2)
        assert [m for _, m in handler.received] == [big, _replicate(TOPICS[0], 1000)]
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_a_broker_without_the_service_is_a_failed_attempt_not_a_break() -> None:
    async def test() -> None:
        server = Server([Unimplemented([ext_pb.ReplicationBase], [], "no replication here")])
        await server.start("127.0.0.1", 0)
        assert server._server is not None
        port = server._server.sockets[0].getsockname()[1]
        owner = Owner({"f": f"127.0.0.1:{port}"})
        assert owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: owner.links.stats_of("f").connect_failures >= 3)
        stats = owner.links.stats_of("f")
        assert (stats.connects, stats.breaks, stats.sent) == (0, 0, 0)
        assert owner.events == []
        await owner.links.close()
        server.close()
        server.close_connections()
        await server.wait_closed()

    _run(test)


def test_queued_replicates_are_charged_to_the_publish_pool_and_pause_publishes() -> None:
    """Issue 28: the links' send queues were outside the memory budget (up to 128 MiB a
    follower). What is queued is charged to the publish pool while it waits (never refused:
    nothing is dropped for it), so a publish that does not fit meanwhile waits; the charge
    leaves as the queue is written or dropped with a lost link."""

    async def test() -> None:
        pool = PublishPool(4096, wait_ms=1_000)
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{unused.getsockname()[1]}"  # nobody listens there
        handler = Echo()
        owner = Owner({"f": address}, queue_messages=3, charge=pool.replication_queued)
        assert owner.links.send("f", _replicate(TOPICS[0], 0, count=200))
        queued = pool.replicating
        assert queued > 1000 and pool.used == queued
        assert not pool.reserve(4096 - queued + 1)  # a publish that does not fit now waits
        waiter = pool.enqueue(4096 - queued + 1)
        assert waiter is not None and not waiter.granted
        for i in range(1, 3):
            owner.links.send("f", _replicate(TOPICS[0], 2 * i))
        assert not owner.links.send("f", _replicate(TOPICS[0], 6))  # the queue-full loss
        assert pool.replicating == 0 and waiter.granted, "the dropped queue gave its room back"
        pool.withdraw(waiter)
        await owner.links.close()
        # written to a follower: charged while queued, given back once written
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address}, charge=pool.replication_queued)
        for i in range(5):
            owner.links.send("f", _replicate(TOPICS[0], 2 * i))
        assert pool.replicating > 0
        await _until(lambda: len(owner.answers.get("f", [])) == 5)
        assert pool.replicating == 0 and pool.used == 0
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_a_follower_that_is_down_holds_back_at_most_its_share_of_the_publishes() -> None:
    """Review finding: never refused, the queue of a follower nobody answers for grew until
    the publish pool was full, below the link's own cap (128 MiB against a pool of 96 at a
    256 MiB budget), so every publish on the broker was refused while the link lived. The
    queues may hold `replication_room` (half the pool's ceiling) together; past it the link
    is lost, as when its queue fills, and the room comes back."""

    async def test() -> None:
        pool = PublishPool(1 << 20, wait_ms=1_000)
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{unused.getsockname()[1]}"  # nobody listens there
        owner = Owner(
            {"f": address},
            queue_bytes=16 << 20,
            charge=pool.replication_queued,
            fits=pool.replication_fits,
        )
        size, end, sent, refused = 64 << 10, 0, 0, 0
        for _ in range(64):  # 4 MiB offered, four times the pool
            if not pool.reserve(size):
                refused += 1
                continue
            message = Replicate(TOPICS[0], 3, end, b"x" * size, 1, commit=end)
            end = message.end
            sent += owner.links.send("f", message)
            pool.release(size)  # answered: the follower left the in-sync set
        assert ("f", "broken") in owner.events, "the link was lost at the budget's share"
        assert pool.replicating <= pool.replication_room
        assert refused == 0, "publishes were never held back past the share"
        assert pool.reserve(size)
        await owner.links.close()

    _run(test)


class _GatedEcho(Echo):
    """Holds its answer to the Replicate after `gate_after` until `gate` is set, so the
    owner's writer stops inside a send with the window spent (the follower reads no more)."""

    def __init__(self, gate_after: int) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate_after = gate_after

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        self.received.append((from_broker, message))
        if message.prev_end == self.gate_after:
            await self.gate.wait()
        outbox.put(Replicated(message.topic, message.epoch, message.end))


def test_a_send_while_the_writer_is_inside_a_send_queues_behind_it() -> None:
    """The writer task blocked half-way through a large message on the flow-control window,
    nothing queued: a send from the answer callback that runs just before the writer resumes
    must queue behind (`_Session.writing`), not write its bytes into the middle of the large
    message (the follower would refuse the garbled message and the link would break). The
    race is the real one, so without the guard this fails only when the answer callback runs
    before the writer resumes (1 run of 3 here); the next test checks the guard itself."""

    async def test() -> None:
        handler = _GatedEcho(gate_after=1000)
        follower = await Follower(handler).start()
        owner = Owner({"f": follower.address})
        first = _replicate(TOPICS[0], 0)
        owner.links.send("f", first)
        await _until(lambda: len(owner.answers.get("f", [])) == 1)
        link = owner.links._links["f"]
        big = [_replicate(TOPICS[0], 1000 + i, count=70000) for i in range(2)]  # one write
        for message in big:
            owner.links.send("f", message)
        await _until(lambda: not link.queue and link.session is not None and link.session.writing)
        small = _replicate(TOPICS[1], 0)
        sent: list[bool] = []
        answered = owner._answer

        def on_answer(name: str, answer: FollowerAnswer) -> None:
            answered(name, answer)
            if not sent:
                sent.append(owner.links.send("f", small))

        owner.links._on_answer = on_answer
        handler.gate.set()
        await _until(lambda: len(handler.received) == 4 or owner.broken("f") > 0, timeout=8)
        assert owner.broken("f") == 0
        assert [message for _, message in handler.received] == [first, *big, small]
        await owner.links.close()
        await follower.stop()

    asyncio.run(asyncio.wait_for(test(), 20))


def test_timing_records_of_answered_topics_are_let_go() -> None:
    """`replicate_round`'s per-topic records go once every send of a topic is answered: topics
    that come and go on a long-lived link leave nothing behind."""
    from danube.runtime.stage_metrics import StageLatency

    async def test() -> None:
        follower = await Follower(Echo()).start()
        owner = Owner({"f": follower.address}, stages=StageLatency())
        topics = [f"/default/t{i}" for i in range(20)]
        for topic in topics:
            owner.links.send("f", _replicate(topic, 0))
        await _until(lambda: len(owner.answers.get("f", [])) == len(topics))
        assert owner.links._links["f"].on_wire == {}
        await owner.links.close()
        await follower.stop()

    _run(test)


def test_replica_answer_observes_only_the_answers_written() -> None:
    """An answer put while the writer is inside a send stays queued: `_sent` of that send
    observes only the answers `_take` handed it."""
    from danube.runtime.replication_service import ServiceStats
    from danube.runtime.stage_metrics import StageLatency

    async def test() -> None:
        stages = StageLatency()
        outbox = Outbox("owner-1", 100, ServiceStats(), stages)
        outbox.put(Replicated(TOPICS[0], 3, 2))
        taken = await outbox._take()
        outbox._writing = True
        outbox.put(Replicated(TOPICS[0], 3, 4))  # during the send
        outbox._writing = False
        outbox._sent()
        histogram = stages.histograms["replica_answer"]
        assert len(taken) == 1
        assert sum(histogram.counts) == 1
        await outbox._take()
        outbox._sent()
        assert sum(histogram.counts) == 2

    _run(test)


def test_a_send_queues_while_the_writer_is_inside_a_send() -> None:
    """The guard itself, without the race above: with the writer marked inside a send and
    nothing queued, `send` queues the message for the writer instead of writing it in-call."""

    async def test() -> None:
        follower = await Follower(Echo()).start()
        owner = Owner({"f": follower.address})
        owner.links.send("f", _replicate(TOPICS[0], 0))
        await _until(lambda: len(owner.answers.get("f", [])) == 1)
        link = owner.links._links["f"]
        assert link.session is not None and not link.queue
        link.session.writing = True
        assert owner.links.send("f", _replicate(TOPICS[0], 2))
        assert len(link.queue) == 1  # queued, not written in the call
        sent = link.stats.sent
        link.session.writing = False
        await _until(lambda: len(owner.answers.get("f", [])) == 2)
        assert link.stats.sent == sent + 1  # the writer task sent it
        await owner.links.close()
        await follower.stop()

    _run(test)
