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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.client.connection import Connections
from danube.client.errors import RETRYABLE, TRANSPORT_ERRORS, DanubeClientError
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb

log = logging.getLogger("danube.client")


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
    raw: pb.StreamMessage
    """The wire message, needed to acknowledge it."""


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
        raw=raw,
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

    async def receive_loop(self, queue: asyncio.Queue[object]) -> None:
        attempt = 0
        while not self._connections.closed:
            stub = pb.ConsumerServiceStub(self._connections.channel(self._url))
            request = pb.ReceiveRequest(
                request_id=self._connections.next_request_id(), consumer_id=self._consumer_id
            )
            try:
                async for raw in stub.receive_messages(request):
                    attempt = 0
                    await queue.put(raw)
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

    async def ack(self, raw: pb.StreamMessage) -> bool:
        request = pb.AckRequest(
            request_id=raw.request_id, msg_id=raw.msg_id, subscription_name=self._subscription
        )
        return await self._call("ack", lambda stub: stub.ack(request))

    async def nack(self, raw: pb.StreamMessage, delay_ms: int | None, reason: str | None) -> bool:
        request = pb.NackRequest(
            request_id=raw.request_id,
            msg_id=raw.msg_id,
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

    async def receive(self) -> Message:
        item = await self._queue.get()
        if isinstance(item, DanubeClientError):
            raise item
        assert isinstance(item, pb.StreamMessage)
        return _message(item)

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
        return await self._target(message).ack(message.raw)

    async def nack(
        self, message: Message, *, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """As `ack`: False when the negative acknowledgement was lost."""
        return await self._target(message).nack(message.raw, delay_ms, reason)
