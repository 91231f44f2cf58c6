"""Producers: one per topic, or one per partition behind a router."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

import grpclib.client
import grpclib.const
from grpclib import GRPCError
from grpclib.const import Status

from danube.client.batching import Batch, Batching, BatchSender, OpenStream, Retry, Unsupported
from danube.client.connection import Connections
from danube.client.errors import TRANSPORT_ERRORS, DanubeClientError
from danube.client.schemas import SchemaRef, SchemaRegistry, WriterSchema
from danube.machines.wal import records
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from danube.values.config import DispatchStrategy
from danube.values.hashing import partition_for_key
from danube.values.names import partition_name

log = logging.getLogger("danube.client")

PUBLISH_BATCHES = "/danube_ext.ProducerExt/PublishBatches"

_Message = tuple[bytes, str | None, Mapping[str, str] | None]
"""What `send` was given: payload, key, attributes."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """Where an acknowledged message went: the topic or partition, and the producer name the
    broker stores with it (a partition's producer is `<name>-<n>`), which is how an audit
    finds the message again."""

    topic: str
    producer_name: str


class _TopicProducer:
    """A producer attached to one (partition) topic on the broker that serves it."""

    def __init__(
        self,
        connections: Connections,
        topic: str,
        name: str,
        strategy: DispatchStrategy,
        batching: Batching | None,
    ) -> None:
        self._connections = connections
        self._batcher = (
            BatchSender(batching, self._batch_stream, connections.retry) if batching else None
        )
        self.topic = topic
        self.name = name
        self._strategy = strategy
        self._producer_id: int | None = None
        self._broker_url = ""
        self._stub: pb.ProducerServiceStub | None = None
        self._request_ids = itertools.count(1)
        self.schema: tuple[SchemaRef, WriterSchema] | None = None
        """Set by the `Producer` before `create` when its messages carry a schema."""

    async def create(self) -> None:
        async def attempt(url: str) -> None:
            stub = pb.ProducerServiceStub(self._connections.channel(url))
            response = await stub.create_producer(
                pb.ProducerRequest(
                    request_id=next(self._request_ids),
                    producer_name=self.name,
                    topic_name=self.topic,
                    producer_access_mode=pb.ProducerAccessMode.Shared,
                    dispatch_strategy=pb.DispatchStrategy(int(self._strategy)),
                    schema_ref=self.schema[0].wire() if self.schema else None,
                )
            )
            self._stub, self._broker_url = stub, url
            self._producer_id = response.producer_id

        await self._connections.with_retries(
            f"create producer on {self.topic}", self.topic, attempt
        )

    async def _batch_stream(self, recreate: bool) -> tuple[OpenStream, int, str]:
        """What the batch sender needs to open its stream, creating the producer first when
        it is new or was lost."""
        if recreate or self._stub is None:
            await self.create()
        assert self._producer_id is not None
        channel = self._connections.channel(self._broker_url)

        def open_stream() -> grpclib.client.Stream:
            return channel.request(
                PUBLISH_BATCHES,
                grpclib.const.Cardinality.STREAM_STREAM,
                ext_pb.PublishBatch,
                ext_pb.BatchAck,
            )

        return open_stream, self._producer_id, self.topic

    def enqueue(
        self, payload: bytes, key: str | None, attributes: Mapping[str, str] | None
    ) -> Awaitable[Receipt]:
        """Adds the message to the current batch (the batched path); the result answers
        once it is stored. Without batching, or against a broker without the batched path,
        the message is sent on its own at once."""
        if self._batcher is None or self._batcher.unsupported or self._stub is None:
            return asyncio.ensure_future(self.send(payload, key, attributes))
        record = self._record(payload, key, attributes)
        return _Enqueued(self, self._batcher.add(record), record, (payload, key, attributes))

    async def send(
        self, payload: bytes, key: str | None, attributes: Mapping[str, str] | None
    ) -> Receipt:
        """Sends one message and waits for it to be stored: batched when the producer
        batches and the broker can, else on its own."""
        message = (payload, key, attributes)
        if self._batcher is None or self._batcher.unsupported:
            return await self._send_one(*message)
        if self._stub is None:
            await self.create()
        record = self._record(payload, key, attributes)
        return await self._stored(self._batcher.add(record), record, message)

    async def _stored(self, batch: Batch, record: bytes, message: _Message) -> Receipt:
        """Waits for the batch holding `record`. A batch the broker refused as retryable, or
        lost with its stream, is sent again in a new batch (after the producer was created
        again, and after the sender's backoff from the second time on) for as long as the
        retry policy allows: at least `min_elapsed_s`, as long as a failover or a new
        owner's load of its write-ahead log may take. Against a broker without the batched
        path the message goes alone."""
        policy = self._connections.retry
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                await asyncio.shield(batch.done)
                return Receipt(self.topic, self.name)
            except Unsupported:
                return await self._send_one(*message)
            except Retry as retry:
                elapsed = time.monotonic() - started
                if self._batcher is None or policy.exhausted(attempt, elapsed, True):
                    raise retry.error from None
                log.info("event=batch_retry topic=%s reason=%s", self.topic, retry.error)
            attempt += 1
            batch = self._batcher.add(record)

    def _record(
        self, payload: bytes, key: str | None, attributes: Mapping[str, str] | None
    ) -> bytes:
        """The message as a batch carries it: a `StreamMessage` without msg_id."""
        return records.encode(
            records.Record(
                payload=payload,
                publish_time=time.time_ns() // 1_000_000,
                producer_name=self.name,
                attributes=dict(attributes) if attributes else {},
                routing_key=key,
                schema_id=self.schema[1].schema_id if self.schema else None,
                schema_version=self.schema[1].version if self.schema else None,
                has_msg_id=False,
            )
        )

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()

    async def flush(self) -> None:
        if self._batcher is not None:
            await self._batcher.flush()

    async def _send_one(
        self, payload: bytes, key: str | None, attributes: Mapping[str, str] | None
    ) -> Receipt:
        """Sends one message. On NOT_FOUND or UNAVAILABLE (topic moved, broker restarted
        without our metadata, a new owner still loading its write-ahead log) or a broken
        connection, creates the producer again and resends: at once the first time, then
        after the retry policy's backoff, for as long as it allows."""
        policy = self._connections.retry
        started = time.monotonic()
        attempt = 0
        while True:
            if self._stub is None or attempt:
                if attempt > 1:
                    await asyncio.sleep(policy.delay(attempt - 2))
                await self.create()
            assert self._stub is not None and self._producer_id is not None
            message = pb.StreamMessage(
                request_id=next(self._request_ids),
                msg_id=pb.MsgId(
                    producer_id=self._producer_id,
                    topic_name=self.topic,
                    broker_addr=self._broker_url,
                ),
                payload=payload,
                publish_time=time.time_ns() // 1_000_000,
                producer_name=self.name,
                attributes=dict(attributes or {}),
                routing_key=key,
                schema_id=self.schema[1].schema_id if self.schema else None,
                schema_version=self.schema[1].version if self.schema else None,
            )
            exhausted = policy.exhausted(attempt, time.monotonic() - started, True)
            try:
                await self._stub.send_message(message)
                return Receipt(self.topic, self.name)
            except GRPCError as error:
                recoverable = error.status in (Status.NOT_FOUND, Status.UNAVAILABLE)
                if exhausted or not recoverable:
                    raise DanubeClientError.from_grpc(f"send to {self.topic}", error) from None
            except TRANSPORT_ERRORS as error:
                if exhausted:
                    raise DanubeClientError(f"send to {self.topic}: {error}") from None
            attempt += 1


class _Enqueued:
    """The result of `enqueue`: awaiting it waits for its batch (no task per message)."""

    __slots__ = ("_batch", "_message", "_producer", "_record")

    def __init__(
        self, producer: _TopicProducer, batch: Batch, record: bytes, message: _Message
    ) -> None:
        self._producer = producer
        self._batch = batch
        self._record = record
        self._message = message

    def __await__(self) -> Generator[Any, None, Receipt]:
        return self._producer._stored(self._batch, self._record, self._message).__await__()


class Producer:
    """Publishes to a topic; with `partitions > 0`, to `<topic>-part-<n>`, choosing the
    partition round-robin, or by FNV-1a 64 of the key (as every official client does).

    With a `schema` reference, the version it chooses is resolved once, at `create`, and
    every message is stamped with its schema id and version (`self.schema` says which); the
    broker binds an unbound topic to the subject and refuses a topic bound to another.

    Use as `async with client.producer(...) as producer: await producer.send(b"...")`."""

    def __init__(
        self,
        connections: Connections,
        topic: str,
        name: str,
        *,
        partitions: int = 0,
        strategy: DispatchStrategy = DispatchStrategy.NON_RELIABLE,
        schema: SchemaRef | None = None,
        batching: Batching | None = None,
    ) -> None:
        if partitions < 0:
            raise DanubeClientError("partitions must be 0 (not partitioned) or more")
        self.topic = topic
        self.name = name
        if partitions:
            self._targets = [
                _TopicProducer(
                    connections, partition_name(topic, i), f"{name}-{i}", strategy, batching
                )
                for i in range(partitions)
            ]
        else:
            self._targets = [_TopicProducer(connections, topic, name, strategy, batching)]
        self._next = 0
        self._registry = SchemaRegistry(connections)
        self._schema_ref = schema
        self.schema: WriterSchema | None = None

    async def resolve_schema(self) -> WriterSchema | None:
        """The schema the messages will carry, resolved on the first call (`create` calls
        it), so an application can check its payloads before the topic is touched."""
        if self._schema_ref is not None and self.schema is None:
            self.schema = await self._registry.resolve(self._schema_ref)
            for target in self._targets:
                target.schema = (self._schema_ref, self.schema)
        return self.schema

    async def create(self) -> Producer:
        await self.resolve_schema()
        for target in self._targets:
            await target.create()
        return self

    async def __aenter__(self) -> Producer:
        return await self.create()

    async def __aexit__(self, *_: object) -> None:
        await self.flush()
        for target in self._targets:
            target.close()

    async def flush(self) -> None:
        """Waits until every batch enqueued so far is answered (stored or failed); the
        messages' own results say which."""
        for target in self._targets:
            await target.flush()

    async def send(
        self,
        payload: bytes,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> Receipt:
        """Returns once the broker acknowledged the message, saying where it went."""
        return await self._target(key).send(payload, key, attributes)

    def enqueue(
        self,
        payload: bytes,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> Awaitable[Receipt]:
        """Queues the message without waiting: await the result (or `flush`) to know it
        was stored. Cheaper than `send` per message when many are in flight (no task per
        message); call `Producer.create` (or enter the producer) first."""
        target = self._target(key)
        return target.enqueue(payload, key, attributes)

    def _target(self, key: str | None) -> _TopicProducer:
        if key is not None:
            return self._targets[partition_for_key(key, len(self._targets))]
        target = self._targets[self._next]
        self._next = (self._next + 1) % len(self._targets)
        return target
