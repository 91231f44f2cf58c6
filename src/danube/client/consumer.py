"""Consumers: one receive loop per (partition) topic feeding one queue.

A receive loop survives broker restarts, takeovers and topic moves: when its stream ends it
asks HealthCheck whether the broker still knows the consumer, and re-subscribes (lookup +
Subscribe, with backoff) when it does not. Only a topic that no longer exists ends the
iteration, with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.client.connection import Connections
from danube.client.errors import RETRYABLE, TRANSPORT_ERRORS, DanubeClientError
from danube.machines.wal import records
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb

log = logging.getLogger("danube.client")

_U32 = struct.Struct("<I")


class SubType(enum.IntEnum):
    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3

    @classmethod
    def named(cls, text: str) -> SubType:
        """Any spelling people and tools use: `key_shared`, `key-shared`, `Key-Shared`,
        `failover`, `fail-over`; ValueError for anything else."""
        name = text.strip().lower().replace("-", "_")
        try:
            return cls["FAILOVER" if name == "fail_over" else name.upper()]
        except KeyError:
            known = "exclusive, shared, failover, key_shared"
            raise ValueError(f"unknown subscription type {text!r} (one of {known})") from None


@dataclass(frozen=True, slots=True)
class Message:
    payload: bytes
    topic: str
    offset: int
    producer_name: str
    publish_time: int
    attributes: Mapping[str, str]
    routing_key: str | None
    schema_id: int | None
    """The producer's schema (with `schema_version`), when it wrote with one."""
    schema_version: int | None
    producer_id: int = 0
    """With `topic`, `offset` and `broker_addr`: the message's id, which acknowledges it."""
    broker_addr: str = ""
    request_id: int = 0


def _message(raw: pb.StreamMessage) -> Message:
    return Message(
        payload=raw.payload,
        topic=raw.msg_id.topic_name,
        offset=raw.msg_id.topic_offset,
        producer_name=raw.producer_name,
        publish_time=raw.publish_time,
        attributes=dict(raw.attributes),
        routing_key=raw.routing_key,
        schema_id=raw.schema_id,
        schema_version=raw.schema_version,
        producer_id=raw.msg_id.producer_id,
        broker_addr=raw.msg_id.broker_addr,
        request_id=raw.request_id,
    )


def _batch_messages(batch: ext_pb.MessageBatch) -> list[Message]:
    """The messages of a `MessageBatch`, decoded by the record codec (no betterproto
    object per message)."""
    data, messages, cursor = batch.records, [], 0
    while cursor < len(data):
        (size,) = _U32.unpack_from(data, cursor)
        record = records.decode(data[cursor + 4 : cursor + 4 + size])
        cursor += 4 + size
        messages.append(
            Message(
                payload=record.payload,
                topic=record.topic_name,
                offset=record.topic_offset,
                producer_name=record.producer_name,
                publish_time=record.publish_time,
                attributes=record.attributes,
                routing_key=record.routing_key,
                schema_id=record.schema_id,
                schema_version=record.schema_version,
                producer_id=record.producer_id,
                broker_addr=record.broker_addr,
                request_id=record.request_id,
            )
        )
    return messages


def _msg_id(message: Message) -> pb.MsgId:
    return pb.MsgId(
        producer_id=message.producer_id,
        topic_name=message.topic,
        broker_addr=message.broker_addr,
        topic_offset=message.offset,
    )


class _TopicConsumer:
    def __init__(
        self,
        connections: Connections,
        topic: str,
        consumer_name: str,
        subscription: str,
        sub_type: SubType,
        key_filters: tuple[str, ...],
        start: ext_pb.StartPosition | None,
    ) -> None:
        self._connections = connections
        self.topic = topic
        self._start = start
        self._name = consumer_name
        self._subscription = subscription
        self._sub_type = sub_type
        self._key_filters = key_filters
        self._consumer_id = 0
        self._url = ""
        self._batched = True
        """Until the broker answers UNIMPLEMENTED to the batched receive."""
        self._batched_acks = True
        self._acks: list[Message] = []
        self._acks_done: asyncio.Future[bool] | None = None
        """Answers every acknowledgement queued in `_acks`."""
        self._ack_task: asyncio.Task[None] | None = None

    async def subscribe(self) -> None:
        async def attempt(url: str) -> None:
            channel = self._connections.channel(url)
            request = pb.ConsumerRequest(
                request_id=self._connections.next_request_id(),
                topic_name=self.topic,
                consumer_name=self._name,
                subscription=self._subscription,
                subscription_type=int(self._sub_type),
                key_filters=list(self._key_filters),
            )
            if self._start is None:
                response = await pb.ConsumerServiceStub(channel).subscribe(request)
            else:
                response = await self._subscribe_at(channel, request, self._start)
            self._consumer_id, self._url = response.consumer_id, url

        await self._connections.with_retries(f"subscribe to {self.topic}", self.topic, attempt)

    @staticmethod
    async def _subscribe_at(
        channel: Channel, request: pb.ConsumerRequest, start: ext_pb.StartPosition
    ) -> pb.ConsumerResponse:
        try:
            return await ext_pb.ConsumerExtStub(channel).subscribe_at(
                ext_pb.SubscribeAtRequest(request=request, start=start)
            )
        except GRPCError as error:
            if error.status is Status.UNIMPLEMENTED:
                raise DanubeClientError(
                    "this broker cannot start a subscription at a chosen position "
                    "(Danube's own brokers start at the latest message); subscribe without "
                    "a start position",
                    Status.UNIMPLEMENTED,
                ) from None
            raise

    async def _known_to_broker(self) -> bool:
        stub = pb.HealthCheckStub(self._connections.channel(self._url))
        try:
            response = await stub.health_check(
                pb.HealthCheckRequest(
                    request_id=self._connections.next_request_id(),
                    client=pb.HealthCheckRequestClientType.Consumer,
                    id=self._consumer_id,
                )
            )
        except (GRPCError, *TRANSPORT_ERRORS):
            return False
        return response.status == pb.HealthCheckResponseClientStatus.OK

    async def _receive(self, queue: asyncio.Queue[object]) -> None:
        """One receive stream: the batched one (`ReceiveBatches`) unless this broker lacks
        it, then Danube's `ReceiveMessages`."""
        channel = self._connections.channel(self._url)
        if self._batched:
            request = ext_pb.ReceiveBatchesRequest(consumer_id=self._consumer_id)
            try:
                async for batch in ext_pb.ConsumerExtStub(channel).receive_batches(request):
                    for message in _batch_messages(batch):
                        await queue.put(message)
                return
            except GRPCError as error:
                if error.status is not Status.UNIMPLEMENTED:
                    raise
                self._batched = False
        plain = pb.ReceiveRequest(
            request_id=self._connections.next_request_id(), consumer_id=self._consumer_id
        )
        async for raw in pb.ConsumerServiceStub(channel).receive_messages(plain):
            await queue.put(_message(raw))

    async def receive_loop(self, queue: asyncio.Queue[object]) -> None:
        attempt = 0
        while not self._connections.closed:
            try:
                await self._receive(queue)
                ended_cleanly = True
            except GRPCError as error:
                if error.status not in (*RETRYABLE, Status.NOT_FOUND, Status.CANCELLED):
                    await queue.put(DanubeClientError.from_grpc(f"receive {self.topic}", error))
                    return
                ended_cleanly = False
            except TRANSPORT_ERRORS:
                ended_cleanly = False
            if ended_cleanly and await self._known_to_broker():
                await queue.put(
                    DanubeClientError(
                        f"consumer {self._name!r} on {self.topic} was taken over by another "
                        "session with the same consumer name"
                    )
                )
                return
            await asyncio.sleep(self._connections.retry.delay(min(attempt, 5)))
            attempt += 1
            if self._connections.closed:
                return
            try:
                await self.subscribe()
            except DanubeClientError as error:
                if error.status is Status.NOT_FOUND:
                    await queue.put(error)
                    return
                log.warning("event=resubscribe_failed topic=%s error=%s", self.topic, error)

    async def ack(self, message: Message) -> bool:
        return await self.ack_many([message])

    async def ack_many(self, messages: list[Message]) -> bool:
        if self._batched_acks:
            self._acks.extend(messages)
            if self._acks_done is None:
                self._acks_done = asyncio.get_running_loop().create_future()
            done = self._acks_done
            if self._ack_task is None or self._ack_task.done():
                self._ack_task = asyncio.ensure_future(self._send_acks())
            return await asyncio.shield(done)
        acknowledged = True
        for message in messages:
            request = pb.AckRequest(
                request_id=message.request_id,
                msg_id=_msg_id(message),
                subscription_name=self._subscription,
            )
            acknowledged &= await self._call("ack", lambda stub, r=request: stub.ack(r))
        return acknowledged

    async def _send_acks(self) -> None:
        """Sends the acknowledgements queued so far in one `AckBatch`, again while more
        arrived meanwhile (so a busy consumer sends few large calls and an idle one no
        delay). Against a broker without it, each goes alone (`Ack`)."""
        while self._acks:
            messages, done = self._acks, self._acks_done
            assert done is not None
            self._acks, self._acks_done = [], None
            try:
                result = await self._ack_batch(messages)
            except Exception as error:  # every waiter of this round hears of it
                done.set_exception(error)
                continue
            if result is None:
                self._batched_acks = False
                result = await self.ack_many(messages)
            done.set_result(result)

    async def _ack_batch(self, messages: list[Message]) -> bool | None:
        """None when the broker has no `AckBatch`."""
        request = ext_pb.AckBatchRequest(
            request_id=self._connections.next_request_id(),
            topic_name=self.topic,
            subscription_name=self._subscription,
            offsets=[message.offset for message in messages],
        )
        stub = ext_pb.ConsumerExtStub(self._connections.channel(self._url))
        try:
            await stub.ack_batch(request)
        except GRPCError as error:
            if error.status is Status.UNIMPLEMENTED:
                return None
            if error.status in (Status.UNAVAILABLE, Status.NOT_FOUND):
                log.warning("event=ack_lost topic=%s reason=%s", self.topic, error.message)
                return False
            raise DanubeClientError.from_grpc(f"ack on {self.topic}", error) from None
        except TRANSPORT_ERRORS as error:
            log.warning("event=ack_lost topic=%s reason=%s", self.topic, error)
            return False
        return True

    async def nack(self, message: Message, delay_ms: int | None, reason: str | None) -> bool:
        request = pb.NackRequest(
            request_id=message.request_id,
            msg_id=_msg_id(message),
            subscription_name=self._subscription,
            delay_ms=delay_ms,
            reason=reason,
        )
        return await self._call("nack", lambda stub: stub.nack(request))

    async def _call(
        self, what: str, call: Callable[[pb.ConsumerServiceStub], Awaitable[object]]
    ) -> bool:
        """False when the broker that delivered the message is gone or no longer serves the
        topic (it moved): the acknowledgement is lost and the new owner delivers the message
        again, as at-least-once allows. Other failures raise."""
        try:
            await call(pb.ConsumerServiceStub(self._connections.channel(self._url)))
        except GRPCError as error:
            if error.status in (Status.UNAVAILABLE, Status.NOT_FOUND):
                log.warning("event=%s_lost topic=%s reason=%s", what, self.topic, error.message)
                return False
            raise DanubeClientError.from_grpc(f"{what} on {self.topic}", error) from None
        except TRANSPORT_ERRORS as error:
            log.warning("event=%s_lost topic=%s reason=%s", what, self.topic, error)
            return False
        return True


def wire_start(start: str | int | None) -> ext_pb.StartPosition | None:
    """`"latest"`, `"earliest"` or an offset: where a new subscription starts (an existing one
    resumes at its cursor). None asks for nothing: Danube's default, the latest message."""
    if start is None:
        return None
    if start == "latest":
        return ext_pb.StartPosition(latest=True)
    if start == "earliest":
        return ext_pb.StartPosition(earliest=True)
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return ext_pb.StartPosition(offset=start)
    raise DanubeClientError(
        f"invalid start position {start!r}: use 'latest', 'earliest' or an offset >= 0"
    )


class Consumer:
    """Receives from a topic, or from every partition of a partitioned topic.

    Use as `async with client.consumer(...) as consumer: async for message in consumer: ...`
    and acknowledge with `await consumer.ack(message)`."""

    def __init__(
        self,
        connections: Connections,
        topic: str,
        consumer_name: str,
        subscription: str,
        *,
        sub_type: SubType = SubType.SHARED,
        key_filters: tuple[str, ...] = (),
        start: str | int | None = None,
        queue_size: int = 1000,
    ) -> None:
        self._connections = connections
        self.topic = topic
        self._consumer_name = consumer_name
        self._subscription = subscription
        self._sub_type = sub_type
        self._key_filters = tuple(key_filters)
        self._start = wire_start(start)
        self._queue: asyncio.Queue[object] = asyncio.Queue(maxsize=queue_size)
        self._targets: dict[str, _TopicConsumer] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def subscribe(self) -> Consumer:
        """Subscribes to the topic or all its partitions and starts receiving."""
        names = await self._connections.partitions(self.topic)
        if not names:
            raise DanubeClientError(
                f"topic {self.topic} does not exist (consumers never create topics)",
                Status.NOT_FOUND,
            )
        for name in names:
            target = _TopicConsumer(
                self._connections, name, self._consumer_name, self._subscription,
                self._sub_type, self._key_filters, self._start,
            )  # fmt: skip
            await target.subscribe()
            self._targets[name] = target
        self._tasks = [
            asyncio.create_task(t.receive_loop(self._queue)) for t in self._targets.values()
        ]
        return self

    async def __aenter__(self) -> Consumer:
        return await self.subscribe()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    @property
    def queued(self) -> int:
        """Messages received and not yet taken by `receive`."""
        return self._queue.qsize()

    async def receive(self) -> Message:
        item = await self._queue.get()
        if isinstance(item, DanubeClientError):
            raise item
        assert isinstance(item, Message)
        return item

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        return await self.receive()

    def _target(self, message: Message) -> _TopicConsumer:
        target = self._targets.get(message.topic)
        if target is None:
            raise DanubeClientError(f"message from {message.topic} was not received here")
        return target

    async def ack(self, message: Message) -> bool:
        """True once the broker took the acknowledgement; False when it was lost because the
        topic moved or its broker died (the message will be delivered again)."""
        return await self._target(message).ack(message)

    async def ack_many(self, messages: list[Message]) -> bool:
        """`ack` of many messages in as few calls as the broker allows (one per topic or
        partition on ours); False when any acknowledgement was lost."""
        by_target: dict[str, list[Message]] = {}
        for message in messages:
            by_target.setdefault(message.topic, []).append(message)
        results = [await self._target(group[0]).ack_many(group) for group in by_target.values()]
        return all(results)

    async def nack(
        self, message: Message, *, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """As `ack`: False when the negative acknowledgement was lost."""
        return await self._target(message).nack(message, delay_ms, reason)
