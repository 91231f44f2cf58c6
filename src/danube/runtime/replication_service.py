"""The follower side of replication's transport (spec/replication.md, issue 27), beside
its owner side (`danube.runtime.replication_link`): the `danube_ext.Replication` service on the
broker's admin (internal) port. It decides nothing: the node wiring's handler does.

**Follower side: `ReplicationService(handler)`.** For each stream it checks the sender's
broker id (header `x-danube-replica-from`), then hands each request to
`handler.replicate(from_broker, message, outbox)` in stream order, awaiting it before reading
the next (the handler's backpressure reaches the owner through HTTP/2 flow control). The
handler answers whenever it likes (once the frames are durable, usually later) by
`outbox.put(answer)`; answers go out in `put` order, written in the call when nothing waits
before them and HTTP/2 takes them at once, else by the outbox's writer task. When the stream
ends, `outbox.closed` turns true, later `put`s are dropped (the owner resends after its break) and
`handler.stream_closed(from_broker, outbox)` is called. A newer stream from the same broker
closes the older one (a half-open connection must not hold a second outbox). A malformed
request ends the stream with INVALID_ARGUMENT naming the rule it broke.
`EpochEnd(topic, epoch)` is answered by `handler.epoch_end(topic, epoch)`, which returns
`(end, owner_epoch)` or raises `DanubeError`; `ask_epoch_end` is its client.

Counters are plain attributes (`ServiceStats`) for the metrics exporter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpclib.const
import grpclib.server
from grpclib import GRPCError
from grpclib.const import Status

from danube.machines.replication.messages import FollowerAnswer, Replicate
from danube.proto import danube_ext as ext_pb
from danube.runtime import replication_codec as codec
from danube.runtime.grpc_util import (
    MESSAGE_HEADER,
    recv_bounded,
    send_encoded,
    send_message_now,
    unary,
)
from danube.runtime.replication_codec import FRAMES_LIMIT, FROM_BROKER_HEADER, ReplicaCodecError
from danube.runtime.stage_metrics import StageLatency
from danube.values.errors import invalid

log = logging.getLogger("danube.runtime")

STREAM_PATH = "/danube_ext.Replication/Stream"
EPOCH_END_PATH = "/danube_ext.Replication/EpochEnd"
OUTBOX_ANSWERS = 65_536
"""Answers queued on one follower stream that the owner does not read; beyond, the stream
is ended (the owner resends after its break)."""

FRAME_HEADER = MESSAGE_HEADER
"""A gRPC message's prefix: compressed flag, length."""


class Outbox:
    """Answers of one follower-side stream, sent in `put` order (module docstring)."""

    def __init__(
        self,
        from_broker: str,
        limit: int,
        stats: ServiceStats,
        stages: StageLatency | None = None,
    ) -> None:
        self.from_broker = from_broker
        self._stages = stages
        self._put_at: deque[float] = deque()
        """When each queued answer was put (`replica_answer`), when `stages` is given."""
        self._taken_at: list[float] = []
        """When each answer `_take` last returned was put: those `_sent` observes (answers put
        while the writer is inside a send are still queued, not sent)."""
        self.closed = False
        self._limit = limit
        self._stats = stats
        self._answers: deque[bytes] = deque()
        self._ready = asyncio.Event()
        self.ended: tuple[Status, str] | None = None
        """Why the service ended the stream itself (superseded, overflow), if it did."""
        self._end: Callable[[Status, str], None] | None = None
        self._stream: grpclib.server.Stream | None = None
        """The stream once its initial metadata went out: `put` writes to it at once when
        nothing is queued or being written (`send_message_now`)."""
        self._writing = False

    def put(self, answer: FollowerAnswer) -> bool:
        """Queues `answer` (raises `ReplicaCodecError` when malformed). False when the stream
        has ended: the answer is dropped, the owner resends after its break."""
        body = codec.answer_bytes(answer)
        if self.closed:
            self._stats.answers_dropped += 1
            return False
        if not self._answers and not self._writing and self._send_now(body):
            return True
        if len(self._answers) >= self._limit:
            self._stats.answers_dropped += 1
            self.end(Status.RESOURCE_EXHAUSTED, f"more than {self._limit} answers unread")
            return False
        self._answers.append(body)
        if self._stages is not None:
            self._put_at.append(time.perf_counter())
        self._ready.set()
        return True

    def _send_now(self, body: bytes) -> bool:
        stream = self._stream
        if stream is None or not send_message_now(stream._stream, body):
            return False
        stream._messages_sent += 1  # the server stream's own count, as `send_encoded` keeps it
        self._stats.answers_sent += 1
        if self._stages is not None:
            self._stages.histograms["replica_answer"].observe(0.0)
        return True

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def end(self, status: Status, reason: str) -> None:
        """Ends the stream with `status` (the owner sees a break)."""
        self.close()
        if self.ended is None and self._end is not None:
            self.ended = (status, reason)
            self._end(status, reason)

    async def _take(self) -> list[bytes]:
        """What is queued, waiting for something; [] once closed and drained."""
        while not self._answers:
            if self.closed:
                return []
            self._ready.clear()
            await self._ready.wait()
        answers = list(self._answers)
        self._answers.clear()
        if self._stages is not None:
            self._taken_at = list(self._put_at)
            self._put_at.clear()
        return answers

    def _sent(self) -> None:
        """What `_take` returned is written: `replica_answer` of each."""
        if self._stages is None:
            return
        now = time.perf_counter()
        histogram = self._stages.histograms["replica_answer"]
        for put_at in self._taken_at:
            histogram.observe((now - put_at) * 1000)
        self._taken_at = []


class _RawRequest:
    """The request type grpclib is given: the body stays bytes, for the hand codec."""

    @staticmethod
    def FromString(data: bytes) -> bytes:  # the protobuf API grpclib's codec calls
        return data


class ReplicaHandler(Protocol):
    """What the follower broker's node wiring provides to `ReplicationService`."""

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        """Take `message` (e.g. into the topic's `FollowerLog`); answer through `outbox`,
        now or later. Returns when the service may read the next request."""
        ...

    def stream_closed(self, from_broker: str, outbox: Outbox) -> None:
        """The stream that `outbox` answers on has ended; nothing put on it arrives."""
        ...

    async def epoch_end(self, topic: str, epoch: int) -> tuple[int, int]:
        """`(end, owner_epoch)` where `epoch`'s records of `topic` end on this broker's log,
        as the topic's owner; raises `DanubeError` when this broker is not its owner."""
        ...


@dataclass(slots=True)
class ServiceStats:
    streams: int = 0
    """Streams accepted."""
    requests: int = 0
    request_bytes: int = 0
    """Frames' bytes received."""
    refused: int = 0
    """Streams ended for a malformed request or a missing sender id."""
    answers_sent: int = 0
    answers_dropped: int = 0
    """Answers put after their stream ended (or beyond `OUTBOX_ANSWERS`)."""


class ReplicationService:
    """The follower broker's `danube_ext.Replication` (module docstring). Registered on the
    admin (internal) port's server."""

    def __init__(
        self,
        handler: ReplicaHandler,
        *,
        frames_limit: int = FRAMES_LIMIT,
        outbox_limit: int = OUTBOX_ANSWERS,
        stages: StageLatency | None = None,
    ) -> None:
        """`stages`: where `replica_answer` is observed."""
        self._stages = stages
        self._handler = handler
        self._frames_limit = frames_limit
        self._request_limit = codec.request_limit(frames_limit)
        self._outbox_limit = outbox_limit
        self._streams: dict[str, Outbox] = {}
        self.stats = ServiceStats()

    async def stream(self, stream: grpclib.server.Stream) -> None:
        from_broker = self._sender(stream)
        task = asyncio.current_task()
        assert task is not None
        outbox = Outbox(from_broker, self._outbox_limit, self.stats, self._stages)
        outbox._end = lambda status, reason: task.cancel()
        older = self._streams.get(from_broker)
        if older is not None:
            older.end(Status.ABORTED, "replaced by a newer stream from the same broker")
        self._streams[from_broker] = outbox
        self.stats.streams += 1
        writer: asyncio.Task[None] | None = None
        try:
            await stream.send_initial_metadata()
            outbox._stream = stream
            writer = asyncio.ensure_future(self._write(stream, outbox))
            while not writer.done():
                request = await recv_bounded(stream, self._request_limit, end_ok=True)
                if request is None:
                    break
                try:
                    message = codec.request_from_bytes(request, self._frames_limit)
                except ReplicaCodecError as error:
                    reason = f"malformed Replicate: {error}"
                    raise GRPCError(Status.INVALID_ARGUMENT, reason) from None
                self.stats.requests += 1
                self.stats.request_bytes += len(message.frames)
                await self._handler.replicate(from_broker, message, outbox)
            outbox.close()  # the owner ended its side: send what is queued, then end
            await writer
        except GRPCError as error:
            if error.status is Status.INVALID_ARGUMENT:
                self.stats.refused += 1
            raise
        except asyncio.CancelledError:
            # Our own `Outbox.end` (and nothing else, e.g. the server's shutdown): answer with
            # its status, which grpclib sends; a cancelled handler would leave the owner
            # waiting on a stream nobody serves.
            if outbox.ended is None or task.cancelling() > 1:
                raise
            task.uncancel()
            raise GRPCError(*outbox.ended) from None
        finally:
            outbox.close()
            if writer is not None:
                writer.cancel()
            if self._streams.get(from_broker) is outbox:
                del self._streams[from_broker]
            try:
                self._handler.stream_closed(from_broker, outbox)
            except Exception:
                log.exception("event=replication_stream_closed_failed from=%s", from_broker)

    def _sender(self, stream: grpclib.server.Stream) -> str:
        metadata = stream.metadata
        value = metadata.get(FROM_BROKER_HEADER) if metadata is not None else None
        try:
            return codec.check_broker_id(value)
        except ReplicaCodecError as error:
            self.stats.refused += 1
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"header {FROM_BROKER_HEADER}: {error}"
            ) from None

    async def _write(self, stream: grpclib.server.Stream, outbox: Outbox) -> None:
        while answers := await outbox._take():
            outbox._writing = True
            try:
                await send_encoded(stream, answers)
            except BaseException:
                outbox.close()  # a half-written answer: nothing more may follow it in-call
                raise
            finally:
                outbox._writing = False
            outbox._sent()
            self.stats.answers_sent += len(answers)

    async def epoch_end(self, request: ext_pb.EpochEndRequest) -> ext_pb.EpochEndResponse:
        try:
            topic, epoch = codec.decode_epoch_end_request(request)
        except ReplicaCodecError as error:
            raise invalid(f"malformed EpochEnd: {error}") from None
        end, owner_epoch = await self._handler.epoch_end(topic, epoch)
        return codec.encode_epoch_end_response(end, owner_epoch)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            STREAM_PATH: grpclib.const.Handler(
                self.stream,
                grpclib.const.Cardinality.STREAM_STREAM,
                _RawRequest,
                ext_pb.ReplicaAnswer,
            ),
            EPOCH_END_PATH: unary(
                self.epoch_end,
                ext_pb.EpochEndRequest,
                ext_pb.EpochEndResponse,
                limit=codec.MESSAGE_OVERHEAD,
            ),
        }
