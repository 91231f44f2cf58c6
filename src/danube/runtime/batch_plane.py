"""The batched data path (`danube_ext.ProducerExt`, `ConsumerExt.ReceiveBatches` and
`AckBatch`; spec/protocol.md, "Batched data path"): many messages per gRPC message, one core
call and one WAL frame per batch."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable
from typing import Any

import grpclib.const
import grpclib.server
from grpclib.const import Status

from danube.machines.node.core import BatchPublished, BrokerCore
from danube.machines.node.requests import encoded
from danube.machines.requests import receive, settle
from danube.machines.requests.publish import BatchRequest, publish_batch
from danube.proto import danube_ext as ext_pb
from danube.runtime.batch_request_codec import (
    AckBatchRequestDecoded,
    AckBatchRequestWire,
    PublishBatchRequest,
    PublishBatchWire,
)
from danube.runtime.broker import BrokerRuntime, monotonic_ms, now_ms
from danube.runtime.grpc_util import RECEIVED, recv_bounded, recv_single, unary
from danube.runtime.metrics import BrokerMetrics
from danube.runtime.request_driver import RequestDriver
from danube.runtime.schema_gate import SchemaGate
from danube.runtime.streams import serve_consumer
from danube.runtime.wire_codec import BatchAckWire, MessageBatchWire, RequestIdReply
from danube.values.errors import DanubeError

log = logging.getLogger("danube.runtime")

BATCH_REQUEST_LIMIT = 8 * 1024 * 1024
"""Largest PublishBatch the broker reads (at least one largest message's worth more)."""
MAX_IN_FLIGHT = 16
"""Batches of one stream stored or being stored but not yet acknowledged: the broker reads
the stream no further until one is answered, so HTTP/2 flow control slows the client."""

_U32 = struct.Struct("<I")


class ProducerExtService:
    def __init__(self, runtime: BrokerRuntime, gate: SchemaGate, batch_limit: int) -> None:
        self._runtime = runtime
        self._core: BrokerCore = runtime.core
        self._gate = gate
        self._batch_limit = batch_limit
        self._requests = RequestDriver(runtime, gate, staged=True)

    async def publish_batches(self, stream: grpclib.server.Stream) -> None:
        """Reads batches in order and calls the core for each before reading the next, so
        offsets follow the stream; a writer task sends the answers in the same order as
        each batch's storage completes."""
        answers: asyncio.Queue[asyncio.Future[BatchAckWire] | None] = asyncio.Queue()
        window = asyncio.Semaphore(MAX_IN_FLIGHT)
        writer = asyncio.ensure_future(self._write_answers(stream, answers, window))
        try:
            while not writer.done():
                request = await recv_bounded(stream, self._batch_limit, end_ok=True)
                if request is None:
                    break
                await window.acquire()
                answers.put_nowait(asyncio.ensure_future(await self._begin(request)))
            answers.put_nowait(None)
            await writer
        finally:
            writer.cancel()
            # A client that left: its batches were handed to the core already (stored or
            # not); only the answers nobody will read are dropped.
            while not answers.empty():
                answer = answers.get_nowait()
                if answer is not None:
                    answer.cancel()

    @staticmethod
    async def _write_answers(
        stream: grpclib.server.Stream,
        answers: asyncio.Queue[asyncio.Future[BatchAckWire] | None],
        window: asyncio.Semaphore,
    ) -> None:
        while (answer := await answers.get()) is not None:
            ack = await answer
            window.release()
            await stream.send_message(ack)

    async def _begin(self, request: PublishBatchRequest) -> Awaitable[BatchAckWire]:
        """Runs the batch's publish flow up to its core call and the start of its effects
        (in stream order); the returned awaitable answers once the batch is stored, or at
        once when it is refused."""
        started = time.perf_counter()
        topic = request.topic_name
        metrics = self._runtime.metrics
        batch = BatchRequest(request.producer_id, topic, request.frame)
        try:
            done = await self._requests.begin(
                publish_batch(self._core, batch, now_ms, monotonic=monotonic_ms)
            )
        except DanubeError as error:
            count = batch.checked.count if batch.checked is not None else 1
            metrics.send_failed(topic, count, error.code.name)
            return _done(_refused(request.sequence, error))
        assert batch.checked is not None
        sizes = batch.checked.payload_sizes
        return _after(done, request.sequence, topic, sizes, started, metrics)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube_ext.ProducerExt/PublishBatches": grpclib.const.Handler(
                self.publish_batches,
                grpclib.const.Cardinality.STREAM_STREAM,
                PublishBatchWire,
                BatchAckWire,
            ),
        }


async def _after(
    done: Awaitable[BatchPublished],
    sequence: int,
    topic: str,
    sizes: Any,
    started: float,
    metrics: BrokerMetrics,
) -> BatchAckWire:
    try:
        published = await done
    except DanubeError as error:
        metrics.send_failed(topic, len(sizes), error.code.name)
        return _refused(sequence, error)
    if published.stored:
        metrics.stages.replied(RECEIVED.get())
    seconds = time.perf_counter() - started
    metrics.sent_batch(topic, sizes, seconds, stored=published.stored)
    return BatchAckWire(
        sequence=sequence, first_offset=published.first_offset, count=published.count
    )


async def _done(ack: BatchAckWire) -> BatchAckWire:
    return ack


def _refused(sequence: int, error: DanubeError) -> BatchAckWire:
    return BatchAckWire(
        sequence=sequence, status=Status[error.code.name].value, error=error.message
    )


def _packed(items: list[bytes]) -> bytes:
    return b"".join([part for item in items for part in (_U32.pack(len(item)), item)])


class ConsumerBatchService:
    """`ReceiveBatches` and `AckBatch` of `danube_ext.ConsumerExt`."""

    def __init__(self, runtime: BrokerRuntime, default_batch: int) -> None:
        self._runtime = runtime
        self._core: BrokerCore = runtime.core
        self._default_batch = default_batch
        self._requests = RequestDriver(runtime)

    async def receive_batches(self, stream: grpclib.server.Stream) -> None:
        request: ext_pb.ReceiveBatchesRequest = await recv_single(stream, 1024)
        limit = receive.turn_limit(request.max_messages, self._default_batch)

        async def send(items: list[object]) -> int:
            wire = [encoded(item) for item in items]
            packed = _packed(wire)
            await stream.send_message(MessageBatchWire(packed, len(wire)))
            return len(packed) - 4 * len(wire)

        await serve_consumer(self._runtime, stream, request.consumer_id, limit, send)

    async def ack_batch(self, request: AckBatchRequestDecoded) -> RequestIdReply:
        flow = settle.ack(
            self._core, request.topic_name, request.subscription_name, request.offsets, now_ms()
        )
        await self._requests.run(flow)
        return RequestIdReply(request.request_id)  # an AckBatchResponse's bytes

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube_ext.ConsumerExt/ReceiveBatches": grpclib.const.Handler(
                self.receive_batches,
                grpclib.const.Cardinality.UNARY_STREAM,
                ext_pb.ReceiveBatchesRequest,
                MessageBatchWire,
            ),
            "/danube_ext.ConsumerExt/AckBatch": unary(
                self.ack_batch, AckBatchRequestWire, RequestIdReply
            ),
        }
