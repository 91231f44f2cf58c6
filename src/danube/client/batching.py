"""Batched publishing (spec/protocol.md, "Batched data path"): messages accumulate while
earlier batches are on their way and go out together, as one WAL frame on one
`danube_ext.ProducerExt/PublishBatches` stream.

Like Kafka's accumulator: a batch leaves when it is full (`max_messages`, `max_bytes`), when
`linger_ms` passed since its first message, or at once when fewer than `max_in_flight` batches
are unanswered (so an idle producer adds no delay and a busy one sends big batches)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpclib.client
from grpclib import GRPCError
from grpclib.const import Status

from danube.client.connection import RetryPolicy
from danube.client.errors import RETRYABLE, TRANSPORT_ERRORS, DanubeClientError
from danube.client.frame import encode_batch
from danube.machines.wal.layout import MAX_RECORDS_PER_FRAME
from danube.proto import danube_ext as ext_pb

MAX_BATCH_MESSAGES = MAX_RECORDS_PER_FRAME


@dataclass(frozen=True, slots=True)
class Batching:
    """How a producer groups messages for our brokers; Danube's own brokers (no batched
    path) get one call per message whatever this says."""

    linger_ms: float = 0.0
    """Wait this long after a batch's first message for more (0: only while the window of
    unanswered batches is full)."""
    max_messages: int = 1000
    max_bytes: int = 1024 * 1024
    max_in_flight: int = 4
    """Batches sent and not yet answered."""

    def __post_init__(self) -> None:
        if self.linger_ms < 0:
            raise DanubeClientError("linger_ms must not be negative")
        if not 1 <= self.max_messages <= MAX_BATCH_MESSAGES:
            raise DanubeClientError(f"max_messages must be 1 to {MAX_BATCH_MESSAGES}")
        if self.max_bytes < 1 or self.max_in_flight < 1:
            raise DanubeClientError("max_bytes and max_in_flight must be at least 1")


class Unsupported(Exception):
    """The broker has no batched path: send this batch's messages one by one."""


class Retry(Exception):
    """The batch was not stored, or its outcome is unknown (the stream broke): send its
    messages again, once the producer was created again (`error` says why)."""

    def __init__(self, error: DanubeClientError) -> None:
        super().__init__(str(error))
        self.error = error


class Batch:
    """Messages that travel together; `done` gives the offset of the first once stored."""

    __slots__ = ("done", "records", "size")

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.size = 0
        """Bytes of the frame's body: each record and its length prefix."""
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def count(self) -> int:
        return len(self.records)

    def add(self, record: bytes) -> None:
        self.records.append(record)
        self.size += 4 + len(record)

    def frame(self) -> bytes:
        """The batch as one WAL frame with base offset 0 (spec/wal-format.md)."""
        return encode_batch(self.records)


OpenStream = Callable[[], grpclib.client.Stream]
"""Opens a new PublishBatches stream (grpclib's, an async context manager)."""


class BatchSender:
    """One producer's accumulator and its stream. `add` queues an encoded message (a
    `StreamMessage` without msg_id) and returns the batch that took it; the caller awaits
    that batch's `done`.

    A stream that broke on a retryable answer is opened again at once the first time (the
    topic moved: the producer is created again where it went), and after the policy's backoff
    when it breaks again before a batch was stored (the new owner is still loading its
    write-ahead log): the senders queue their messages again at once, in their order, and
    the wait is here, in one place, so it cannot reorder them."""

    def __init__(
        self,
        settings: Batching,
        open_stream: Callable[[bool], Awaitable[tuple[OpenStream, int, str]]],
        retry: RetryPolicy | None = None,
    ) -> None:
        self._settings = settings
        self._open_stream = open_stream
        self._retry = retry or RetryPolicy()
        self._broken = 0
        """Streams that broke in a row, without a batch stored in between."""
        self._current: Batch | None = None
        self._ready: collections.deque[Batch] = collections.deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last: Batch | None = None
        self._recreate = False
        """The last stream ended because the producer is gone: create it again first."""
        self.unsupported = False

    def add(self, record: bytes) -> Batch:
        """Queues an encoded message; the batch that took it answers for it."""
        batch = self._current
        settings = self._settings
        if batch is not None and (
            batch.count >= settings.max_messages
            or batch.size + 4 + len(record) > settings.max_bytes
        ):
            self._ready.append(batch)
            batch = None
        if batch is None:
            batch = self._current = self._last = Batch()
        batch.add(record)
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return batch

    async def flush(self) -> None:
        """Waits until the newest batch is answered: answers come in order, so every
        earlier batch is answered too (a batch sent again is newer than the newest)."""
        while self._last is not None and not self._last.done.done():
            await asyncio.wait([self._last.done])

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _next_batch(self, unanswered: int) -> Batch:
        """The next batch to send: a full one, else the current one once it lingered (or
        at once while the window has room and nothing lingers)."""
        while True:
            if self._ready:
                return self._ready.popleft()
            current = self._current
            if current is not None and current.count:
                linger = self._settings.linger_ms
                if linger and unanswered:
                    await asyncio.sleep(linger / 1000)
                if self._ready:
                    continue
                self._current = None
                return current
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _run(self) -> None:
        """Sends batches on one stream for as long as it works; a broken stream fails its
        unanswered batches with `Retry` (their senders try again) and ends the task."""
        in_flight: collections.deque[Batch] = collections.deque()
        window = asyncio.Semaphore(self._settings.max_in_flight)
        try:
            if self._broken > 1:
                await asyncio.sleep(self._retry.delay(self._broken - 2))
            open_stream, producer_id, topic = await self._open_stream(self._recreate)
            self._recreate = False
            async with open_stream() as stream:
                await stream.send_request()
                reader = asyncio.ensure_future(self._read_acks(stream, in_flight, window))
                sender = asyncio.ensure_future(
                    self._send(stream, producer_id, topic, in_flight, window)
                )
                try:
                    done, _ = await asyncio.wait(
                        {reader, sender}, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        task.result()
                finally:
                    for task in (reader, sender):
                        task.cancel()
                        if task.done() and not task.cancelled():
                            task.exception()  # retrieved: the first failure is the one raised
        except (GRPCError, DanubeClientError, *TRANSPORT_ERRORS) as error:
            self._fail_all(in_flight, error)

    async def _send(
        self,
        stream: grpclib.client.Stream,
        producer_id: int,
        topic: str,
        in_flight: collections.deque[Batch],
        window: asyncio.Semaphore,
    ) -> None:
        sequence = 0
        while True:
            await window.acquire()
            batch = await self._next_batch(len(in_flight))
            in_flight.append(batch)
            sequence += 1
            request = ext_pb.PublishBatch(
                producer_id=producer_id, topic_name=topic, sequence=sequence, frame=batch.frame()
            )
            await stream.send_message(request)

    async def _read_acks(
        self,
        stream: grpclib.client.Stream,
        in_flight: collections.deque[Batch],
        window: asyncio.Semaphore,
    ) -> None:
        while (ack := await stream.recv_message()) is not None:
            batch = in_flight.popleft()
            window.release()
            if ack.status == 0:
                self._broken = 0
                batch.done.set_result(ack.first_offset)
                continue
            status = Status(ack.status)
            error = DanubeClientError.from_grpc("send", GRPCError(status, ack.error))
            if status not in RETRYABLE and status is not Status.NOT_FOUND:
                batch.done.set_exception(error)
                continue
            # The producer is gone here (topic moved or deleted, broker restarted): this
            # stream can store nothing more; the next one starts with a new producer.
            in_flight.appendleft(batch)
            raise error
        raise DanubeClientError("the broker ended the batch stream", Status.UNAVAILABLE)

    def _fail_all(self, in_flight: collections.deque[Batch], cause: BaseException) -> None:
        """Every batch not answered, and every batch waiting, learns the stream broke."""
        pending = [*in_flight, *self._ready]
        if self._current is not None:
            pending.append(self._current)
        self._current = None
        self._ready.clear()
        if isinstance(cause, GRPCError) and cause.status is Status.UNIMPLEMENTED:
            self.unsupported = True
        self._recreate = True
        self._broken += 1
        if isinstance(cause, GRPCError):
            cause = DanubeClientError.from_grpc("publish", cause)
        elif not isinstance(cause, DanubeClientError):
            cause = DanubeClientError(f"publish: {cause}")
        failure = Unsupported() if self.unsupported else Retry(cause)
        for batch in pending:
            if not batch.done.done():
                batch.done.set_exception(failure)
