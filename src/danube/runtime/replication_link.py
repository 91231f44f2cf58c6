"""The runtime transport of replication (spec/replication.md, issue 27): the
`danube_ext.Replication` service between brokers' admin (internal) ports, asyncio and grpclib
like every other service. It carries the messages of `danube.machines.replication` and reports
broken streams; it decides nothing (which follower, what to resend, when to shrink: the
machines'), so the node wiring plugs it in as a port.

**Owner side: `ReplicationLinks`.** One bidirectional stream per follower broker carries the
`Replicate`s of every topic the owner replicates to it, in the order `send` was called, and
delivers the follower's answers to `on_answer` in the order the follower sent them. `send`
never waits: it encodes (a malformed `Replicate` raises `ReplicaCodecError` at once) and, when
the stream is up with nothing queued or being written and HTTP/2 takes the message without
waiting (one frame, within the flow-control window), writes it to the stream in the call;
else it queues on the follower's link and a writer task drains the queue onto the stream
(issue 27 point 6: the writer task's wake-up was a loop turn on every group commit's way to the
follower, bench/RESULTS.md).

A *loss* is anything after which a `Replicate` handed to `send` may not arrive: an established
stream ending or breaking (follower restarted, connection reset, keepalive timeout, a
malformed answer), or the queue overflowing (`queue_messages` / `queue_bytes`: the follower
reads too slowly). On a loss the link drops its queue, cuts the stream, and calls
`on_broken(follower)` exactly once; from then on nothing of the old stream is delivered, and
whatever `send` receives (even from inside `on_broken`, as `OwnerReplication.stream_broke`'s
resends are) is queued for the next stream. So the owner's machine sees: answers of stream 1,
`stream_broke`, answers of stream 2 to what it sent after it. Sends while the link is
reconnecting are queued, not lost (no report for them); a connection attempt that fails is
no loss either (nothing was sent on it) and is retried with capped exponential backoff
(`backoff_s` doubling to `backoff_cap_s`, jittered); after a stream that was up for at least
`backoff_cap_s` breaks, at once (one that breaks sooner counts as a failed attempt, so two
processes sharing a broker id cannot replace each other's stream in a busy loop). A
follower that never answers is the machine's business (its `lag_ms`), not the transport's.
Callbacks run on the event loop, synchronously; an exception in one is logged and does not
stop the link.

**Follower side**: `danube.runtime.replication_service`.

Counters are plain attributes (`LinkStats`) for the metrics exporter.

Wiring (not done here): the service goes on the admin server beside `AdminServices` in
`runtime/server.py` (cluster mode; the owner reaches it at the follower's registered
`admin_addr`, which `resolve_address` reads from the view), `ReplicationLinks` is built on the
broker's trio-asyncio loop (`loop=`) and closed before the admin server at shutdown. A broker
without the service answers UNIMPLEMENTED (`Unimplemented([ext_pb.ReplicationBase], ...)`),
which the owner sees as a failed connection attempt, retried with backoff.

Measured on loopback, one link, an echo follower, the 2-core development machine (shared):
1 KiB Replicates 18,700/s with 64 in flight (round trip p50 1.8 ms), one at a time 4,100/s
(p50 0.14 ms); 64 KiB ones 139 MB/s; 1 MiB ones 136 MB/s.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import grpclib.client
import grpclib.const
import grpclib.protocol
import grpclib.server
from grpclib import GRPCError
from grpclib.config import Configuration

from danube.client.errors import TRANSPORT_ERRORS
from danube.machines.replication.messages import FollowerAnswer, Replicate, Replicated
from danube.proto import danube_ext as ext_pb
from danube.runtime import replication_codec as codec
from danube.runtime.forwarding import host_port
from danube.runtime.grpc_util import send_message_now
from danube.runtime.peers import PEERS
from danube.runtime.replication_codec import (
    ANSWER_LIMIT,
    FRAMES_LIMIT,
    FROM_BROKER_HEADER,
    ReplicaCodecError,
)
from danube.runtime.replication_service import EPOCH_END_PATH, FRAME_HEADER, STREAM_PATH
from danube.runtime.stage_metrics import StageLatency
from danube.values.errors import DanubeError, ErrorCode

log = logging.getLogger("danube.runtime")


QUEUE_MESSAGES = 4096
"""Replicates queued on one follower's link (not yet written to its stream) before a loss."""
QUEUE_BYTES = 128 << 20
"""... and their bytes: two of the largest `Replicate`s, sixteen times the owner machine's
resend window (8 MiB), which its `max_in_flight` keeps it well within. What is queued is
charged to the broker's publish pool (`charge`, `PublishPool.replication_queued`), so new
publishes wait while followers lag (spec/memory.md, "Replication send queues")."""
WRITE_BATCH_BYTES = 1 << 20
"""Queued messages written to the stream in one HTTP/2 send, up to this many bytes."""
CONNECT_TIMEOUT_S = 5.0
EPOCH_END_TIMEOUT_S = 5.0
KEEPALIVE_S = 15.0
"""Client PINGs on an idle link (the broker's guard tolerates one per 10 s without data)."""
KEEPALIVE_TIMEOUT_S = 10.0
TIMED_SENDS = 1024
"""Sends per topic remembered for `replicate_round` until their answer (measurement only:
the oldest are forgotten beyond this, a lost stream forgets them all)."""


ResolveAddress = Callable[[str], str | None]
"""A broker id's admin address (`host:port` or `http://host:port`), None when unknown."""
OnAnswer = Callable[[str, FollowerAnswer], None]
OnBroken = Callable[[str], None]


def _host_port(address: str) -> tuple[str, int]:
    return host_port(address, "broker")


class _StreamOver(Exception):
    """The stream's life ended (lost, or the follower ended it)."""


def _channel_config() -> Configuration:
    return Configuration(_keepalive_time=KEEPALIVE_S, _keepalive_timeout=KEEPALIVE_TIMEOUT_S)


# -- owner side ----------------------------------------------------------------------------------


@dataclass(slots=True)
class LinkStats:
    """Counters of one follower's link (and, summed, of all: `ReplicationLinks.stats`)."""

    sent: int = 0
    """Replicates written to a stream."""
    sent_bytes: int = 0
    """... and their frames' bytes."""
    answers: int = 0
    breaks: int = 0
    """Losses reported through `on_broken`."""
    dropped: int = 0
    """Replicates dropped by losses (queued or in a write when the stream broke)."""
    connects: int = 0
    """Streams established (the first one included)."""
    connect_failures: int = 0
    protocol_errors: int = 0
    """Malformed answers (each also a break)."""

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)


@dataclass(eq=False, slots=True)
class _Session:
    """One stream's life: `alive` turns false, once, when the stream is lost."""

    alive: bool = True
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reported: bool = False
    raw: grpclib.protocol.Stream | None = None
    """The stream once established: `send` writes to it at once when nothing is queued."""
    writing: bool = False
    """The writer task is inside a send: a message now must queue behind it."""


@dataclass(eq=False, slots=True)
class _Link:
    follower: str
    queue: deque[tuple[bytes, int, str, int, float]] = field(default_factory=deque)
    """Encoded `ReplicaRequest`s with their frames' sizes, topic, end and `send` time."""
    on_wire: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)
    """Topic -> ends handed to the stream and when, until an answer covers them (the
    `replicate_round` stage; measurement only)."""
    queued_bytes: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    session: _Session | None = None
    task: asyncio.Task[None] | None = None
    stats: LinkStats = field(default_factory=LinkStats)


class ReplicationLinks:
    """The owner broker's streams to its follower brokers (see the module docstring).

    `resolve_address(follower)` is asked at each connection attempt, so a follower that moved
    is found again. `from_broker` is this broker's id, sent on every stream. The links' tasks
    run on `loop` (the broker's trio-asyncio loop, where grpclib runs), by default the loop
    running at the first `send`; `send` may be called from trio code on that loop's thread."""

    def __init__(
        self,
        resolve_address: ResolveAddress,
        on_answer: OnAnswer,
        on_broken: OnBroken,
        *,
        from_broker: str,
        queue_messages: int = QUEUE_MESSAGES,
        queue_bytes: int = QUEUE_BYTES,
        frames_limit: int = FRAMES_LIMIT,
        backoff_s: float = 0.05,
        backoff_cap_s: float = 2.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        loop: asyncio.AbstractEventLoop | None = None,
        charge: Callable[[int], None] | None = None,
        fits: Callable[[int], bool] | None = None,
        stages: StageLatency | None = None,
    ) -> None:
        """`stages`: where `replicate_queue` and `replicate_round` are observed.
        `charge(bytes)`: told what is queued (positive) and what leaves the queues
        (negative), for the memory budget (`PublishPool.replication_queued`); `fits(bytes)`:
        whether the budget lets that much more be queued, else the link is lost
        (`PublishPool.replication_fits`)."""
        self._loop = loop
        self._charge = charge
        self._fits = fits
        self._stages = stages
        self._resolve = resolve_address
        self._on_answer = on_answer
        self._on_broken = on_broken
        self.from_broker = codec.check_broker_id(from_broker)
        self.queue_messages = queue_messages
        self.queue_bytes = queue_bytes
        self.frames_limit = frames_limit
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s
        self.connect_timeout_s = connect_timeout_s
        self._links: dict[str, _Link] = {}
        self._closed = False

    # -- the port ---------------------------------------------------------------------------------

    def send(self, follower: str, message: Replicate) -> bool:
        """Queues `message` for `follower`'s stream (opening the link on first use). False
        when it was dropped by a loss this call caused (queue full: `on_broken` was called)
        or because the links are closed. Raises `ReplicaCodecError` for a malformed message,
        before anything is queued."""
        body = codec.request_bytes(message, self.frames_limit)
        if self._closed:
            return False
        link = self._links.get(follower)
        if link is None:
            link = self._links[follower] = _Link(follower)
        if link.task is None or link.task.done():  # new, or ended by a bug (logged)
            loop = self._loop = self._loop or asyncio.get_running_loop()
            link.task = loop.create_task(self._run(link))
        size = len(body)
        if self._send_now(link, message, body):
            return True
        if len(link.queue) >= self.queue_messages or link.queued_bytes + size > self.queue_bytes:
            link.stats.dropped += 1
            self._lose(link, "queue full")
            return False
        if self._fits is not None and not self._fits(size):
            link.stats.dropped += 1
            self._lose(link, "queue full (memory budget)")
            return False
        now = time.perf_counter() if self._stages is not None else 0.0
        link.queue.append((body, len(message.frames), message.topic, message.end, now))
        link.queued_bytes += size
        if self._charge is not None:
            self._charge(size)
        link.ready.set()
        return True

    def _send_now(self, link: _Link, message: Replicate, body: bytes) -> bool:
        """Writes `body` to the established stream at once when nothing is queued or being
        written before it (order kept) and HTTP/2 lets it go without waiting; else the
        writer task sends it (`_write`)."""
        session = link.session
        if session is None or session.raw is None or session.writing or link.queue:
            return False
        if not session.alive or not send_message_now(session.raw, body):
            return False
        link.stats.sent += 1
        link.stats.sent_bytes += len(message.frames)
        if self._stages is not None:
            self._timed_on_wire(link, [(message.topic, message.end, time.perf_counter())])
        return True

    def connected(self, follower: str) -> bool:
        """Whether `follower`'s stream is established now (for status pages, not decisions)."""
        link = self._links.get(follower)
        return link is not None and link.session is not None and link.session.alive

    def stats_of(self, follower: str) -> LinkStats:
        link = self._links.get(follower)
        return link.stats if link is not None else LinkStats()

    @property
    def stats(self) -> LinkStats:
        total = LinkStats()
        for link in self._links.values():
            for name in LinkStats.__dataclass_fields__:
                setattr(total, name, getattr(total, name) + getattr(link.stats, name))
        return total

    @property
    def followers(self) -> list[str]:
        return sorted(self._links)

    async def drop(self, follower: str) -> None:
        """Closes `follower`'s link (no longer a follower of any topic here): its queue is
        discarded without a report."""
        link = self._links.pop(follower, None)
        if link is not None:
            await self._stop(link)

    async def close(self) -> None:
        """Closes every link; later sends return False."""
        self._closed = True
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(self._stop(link) for link in links))

    # -- the links --------------------------------------------------------------------------------

    def _discard(self, link: _Link) -> None:
        """The link's queue is dropped: its bytes leave the budget's charge."""
        if self._charge is not None and link.queued_bytes:
            self._charge(-link.queued_bytes)
        link.queue.clear()
        link.queued_bytes = 0
        link.on_wire.clear()

    async def _stop(self, link: _Link) -> None:
        if link.session is not None:
            link.session.alive = False
        self._discard(link)
        if link.task is not None:
            link.task.cancel()
            await asyncio.wait({link.task})  # its end, without swallowing our own cancel

    def _lose(self, link: _Link, reason: str) -> None:
        """A loss (module docstring): drop the queue, end the stream, report once."""
        link.stats.dropped += len(link.queue)
        self._discard(link)
        session = link.session
        if session is not None:
            session.alive = False
            session.reported = True
            session.ended.set()
        link.stats.breaks += 1
        log.info("event=replication_link_broken follower=%s reason=%s", link.follower, reason)
        try:
            self._on_broken(link.follower)
        except Exception:
            log.exception("event=replication_on_broken_failed follower=%s", link.follower)

    async def _run(self, link: _Link) -> None:
        try:
            await self._connect_forever(link)
        except Exception:
            log.exception("event=replication_link_failed follower=%s", link.follower)
            raise

    async def _connect_forever(self, link: _Link) -> None:
        """Connects, streams until the stream is lost, and again, until stopped."""
        failures = 0
        while True:
            started = time.monotonic()
            if await self._session(link, _Session()):
                if time.monotonic() - started >= self.backoff_cap_s:
                    failures = 0
                    continue  # at once: the follower may just have restarted
                # A stream that broke at once (a follower refusing us, another process
                # with our broker id replacing our stream) is retried with backoff too.
            else:
                link.stats.connect_failures += 1
            failures += 1
            delay = min(self.backoff_cap_s, self.backoff_s * 2 ** min(failures - 1, 30))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _session(self, link: _Link, session: _Session) -> bool:
        """One connection attempt and, when it succeeds, the stream's life, whose end is a
        loss. True when the stream was established, False when the attempt failed (nothing
        was sent on it: no loss)."""
        address = self._address(link.follower)
        if address is None:
            return False
        channel = PEERS.channel(*address, config=_channel_config())
        established = False
        reason = "stream ended"
        try:
            async with channel.request(
                STREAM_PATH,
                grpclib.const.Cardinality.STREAM_STREAM,
                ext_pb.ReplicaRequest,
                ext_pb.ReplicaAnswer,
                metadata={FROM_BROKER_HEADER: self.from_broker, **PEERS.metadata()},
            ) as stream:
                async with asyncio.timeout(self.connect_timeout_s):
                    await stream.send_request()
                    await stream.recv_initial_metadata()
                established = True
                session.raw = stream._stream
                link.session = session
                link.stats.connects += 1
                log.info(
                    "event=replication_link_up follower=%s address=%s:%d",
                    link.follower, *address,
                )  # fmt: skip
                await self._stream(link, session, stream)
                # Leave with an exception: grpclib then resets the stream instead of waiting
                # for the follower to end it.
                raise _StreamOver
        except _StreamOver:
            pass
        except (*TRANSPORT_ERRORS, GRPCError, TimeoutError, ReplicaCodecError) as error:
            if established and isinstance(error, ReplicaCodecError):
                link.stats.protocol_errors += 1
            reason = f"{type(error).__name__}: {error}"
        except Exception as error:  # h2's and grpclib's other ways for a stream to fail
            reason = f"{type(error).__name__}: {error}"
            log.warning("event=replication_link_error follower=%s error=%s", link.follower, reason)
        finally:
            session.alive = False
            if link.session is session:
                link.session = None
            channel.close()
        if established and not session.reported:
            self._lose(link, reason[:200])
        elif not established:
            log.debug("event=replication_connect_failed follower=%s %s", link.follower, reason)
        return established

    def _address(self, follower: str) -> tuple[str, int] | None:
        try:
            address = self._resolve(follower)
            return _host_port(address) if address else None
        except Exception as error:
            log.warning("event=replication_no_address follower=%s error=%s", follower, error)
            return None

    async def _stream(self, link: _Link, session: _Session, stream: grpclib.client.Stream) -> None:
        """Runs the writer and the reader until either ends or the session is lost."""
        writer = asyncio.ensure_future(self._write(link, session, stream))
        reader = asyncio.ensure_future(self._read(link, session, stream))
        ended = asyncio.ensure_future(session.ended.wait())
        tasks = {writer, reader, ended}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if task is not ended and (error := task.exception()) is not None:
                raise error

    async def _write(self, link: _Link, session: _Session, stream: grpclib.client.Stream) -> None:
        """Writes the queue in order, several messages per HTTP/2 send."""
        raw = stream._stream
        while session.alive:
            if not link.queue:
                link.ready.clear()
                await link.ready.wait()
                continue
            parts: list[bytes] = []
            timed: list[tuple[str, int, float]] = []
            count = frames = size = 0
            while link.queue and (not parts or size + len(link.queue[0][0]) <= WRITE_BATCH_BYTES):
                body, frame_bytes, topic, end, queued_at = link.queue.popleft()
                timed.append((topic, end, queued_at))
                link.queued_bytes -= len(body)
                parts.append(FRAME_HEADER.pack(False, len(body)))
                parts.append(body)
                count += 1
                frames += frame_bytes
                size += len(body)
            if self._charge is not None:
                self._charge(-size)
            session.writing = True
            try:
                with stream._wrapper:  # woken with an error when the connection is lost
                    await raw.send_data(b"".join(parts))
            except BaseException:
                link.stats.dropped += count
                session.alive = False  # a half-written message: no in-call send may follow it
                raise
            finally:
                session.writing = False
            link.stats.sent += count
            link.stats.sent_bytes += frames
            if self._stages is not None:
                self._timed_on_wire(link, timed)

    def _timed_on_wire(self, link: _Link, timed: list[tuple[str, int, float]]) -> None:
        """`replicate_queue` of each message just written; remembers when, for its round."""
        now = time.perf_counter()
        histogram = self._stages.histograms["replicate_queue"]  # type: ignore[union-attr]
        for topic, end, queued_at in timed:
            histogram.observe((now - queued_at) * 1000)
            sent = link.on_wire.get(topic)
            if sent is None:
                sent = link.on_wire[topic] = deque(maxlen=TIMED_SENDS)
            sent.append((end, now))

    def _timed_answer(self, link: _Link, answer: FollowerAnswer) -> None:
        """`replicate_round` of every send this `Replicated` covers."""
        if not isinstance(answer, Replicated):
            return
        sent = link.on_wire.get(answer.topic)
        if not sent:
            return
        now = time.perf_counter()
        histogram = self._stages.histograms["replicate_round"]  # type: ignore[union-attr]
        while sent and sent[0][0] <= answer.end:
            histogram.observe((now - sent.popleft()[1]) * 1000)
        if not sent:
            del link.on_wire[answer.topic]  # topics come and go on a long-lived link

    async def _read(self, link: _Link, session: _Session, stream: grpclib.client.Stream) -> None:
        """Delivers answers in stream order until the follower ends the stream."""
        while True:
            answer = await _recv_answer(stream)
            if answer is None:
                await stream.recv_trailing_metadata()  # raises the follower's error status
                return
            if not session.alive:
                return
            link.stats.answers += 1
            if self._stages is not None:
                self._timed_answer(link, answer)
            try:
                self._on_answer(link.follower, answer)
            except Exception:
                log.exception("event=replication_on_answer_failed follower=%s", link.follower)


async def _recv_answer(stream: grpclib.client.Stream) -> FollowerAnswer | None:
    """The next answer, read with a bound before buffering (grpclib has none); None at the
    end of the follower's stream."""
    with stream._wrapper:  # woken with an error when the connection is lost
        return await _recv_answer_raw(stream._stream)


async def _recv_answer_raw(raw: grpclib.protocol.Stream) -> FollowerAnswer | None:
    header = await _recv_data(raw, 5)
    if not header:
        return None
    if len(header) < 5:
        raise ReplicaCodecError("truncated answer")
    compressed, length = FRAME_HEADER.unpack(header)
    if compressed:
        raise ReplicaCodecError("compressed answers are not supported")
    if length > ANSWER_LIMIT:
        raise ReplicaCodecError(f"answer of {length} bytes exceeds the limit of {ANSWER_LIMIT}")
    body = await _recv_data(raw, length)
    if len(body) != length:
        raise ReplicaCodecError("truncated answer")
    return codec.answer_from_bytes(body)


async def _recv_data(raw: grpclib.protocol.Stream, size: int) -> bytes:
    try:
        data: bytes = await raw.recv_data(size)
    except AssertionError:  # grpclib's buffer, when the stream ends inside a message
        raise ReplicaCodecError("truncated answer") from None
    return data


# -- the EpochEnd client -----------------------------------------------------------------------


async def ask_epoch_end(
    address: str, topic: str, epoch: int, *, timeout: float = EPOCH_END_TIMEOUT_S
) -> tuple[int, int]:
    """`(end, owner_epoch)`: the answer of the owner broker at `address` (its admin address)
    to a follower's `Reconcile` about `epoch`'s records of `topic`. The owner's refusal is
    raised as a `DanubeError` with its status; an owner that cannot be reached or does not
    answer in `timeout` seconds is UNAVAILABLE."""
    request = codec.encode_epoch_end_request(topic, epoch)
    host, port = _host_port(address)
    channel = PEERS.channel(host, port)
    try:
        async with channel.request(
            EPOCH_END_PATH, grpclib.const.Cardinality.UNARY_UNARY,
            ext_pb.EpochEndRequest, ext_pb.EpochEndResponse, timeout=timeout,
            metadata=PEERS.metadata(),
        ) as stream:  # fmt: skip
            await stream.send_message(request, end=True)
            reply = await stream.recv_message()
    except GRPCError as error:
        code = ErrorCode.__members__.get(error.status.name, ErrorCode.UNAVAILABLE)
        raise DanubeError(code, f"the broker at {address}: {error.message}") from None
    except (*TRANSPORT_ERRORS, TimeoutError) as error:
        raise DanubeError(
            ErrorCode.UNAVAILABLE,
            f"the broker at {address} did not answer ({error or type(error).__name__})",
        ) from None
    finally:
        channel.close()
    if reply is None:
        raise DanubeError(ErrorCode.UNAVAILABLE, f"the broker at {address} answered nothing")
    try:
        return codec.decode_epoch_end_response(reply)
    except ReplicaCodecError as error:
        raise DanubeError(ErrorCode.UNAVAILABLE, f"the broker at {address}: {error}") from None
