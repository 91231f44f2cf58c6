"""Producers: one per topic, or one per partition behind a router."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass

from grpclib import GRPCError
from grpclib.const import Status

from danube.client.connection import Connections
from danube.client.errors import TRANSPORT_ERRORS, DanubeClientError
from danube.client.schemas import SchemaRef, SchemaRegistry, WriterSchema
from danube.core.config import DispatchStrategy
from danube.core.hashing import partition_for_key
from danube.core.names import partition_name
from danube.proto import danube as pb


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
        self, connections: Connections, topic: str, name: str, strategy: DispatchStrategy
    ) -> None:
        self._connections = connections
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

    async def send(
        self, payload: bytes, key: str | None, attributes: Mapping[str, str] | None
    ) -> Receipt:
        """Sends one message; re-creates the producer once if the broker no longer knows it
        (topic moved, broker restarted without our metadata) and on retryable statuses."""
        for attempt in range(2):
            if self._stub is None or attempt:
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
            try:
                await self._stub.send_message(message)
                return Receipt(self.topic, self.name)
            except GRPCError as error:
                recoverable = error.status in (Status.NOT_FOUND, Status.UNAVAILABLE)
                if attempt or not recoverable:
                    raise DanubeClientError.from_grpc(f"send to {self.topic}", error) from None
            except TRANSPORT_ERRORS as error:
                if attempt:
                    raise DanubeClientError(f"send to {self.topic}: {error}") from None
        raise AssertionError("unreachable")


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
    ) -> None:
        if partitions < 0:
            raise DanubeClientError("partitions must be 0 (not partitioned) or more")
        self.topic = topic
        self.name = name
        if partitions:
            self._targets = [
                _TopicProducer(connections, partition_name(topic, i), f"{name}-{i}", strategy)
                for i in range(partitions)
            ]
        else:
            self._targets = [_TopicProducer(connections, topic, name, strategy)]
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
        return None

    async def send(
        self,
        payload: bytes,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> Receipt:
        """Returns once the broker acknowledged the message, saying where it went."""
        if key is not None:
            target = self._targets[partition_for_key(key, len(self._targets))]
        else:
            target = self._targets[self._next]
            self._next = (self._next + 1) % len(self._targets)
        return await target.send(payload, key, attributes)
