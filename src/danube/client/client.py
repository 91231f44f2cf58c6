"""The entry point of the Python client."""

from __future__ import annotations

from grpclib.exceptions import GRPCError

from danube.client.batching import Batching
from danube.client.connection import Connections, RetryPolicy
from danube.client.consumer import Consumer, SubType
from danube.client.errors import DanubeClientError
from danube.client.producer import Producer
from danube.client.schemas import SchemaRef, SchemaRegistry
from danube.client.security import ClientSecurity
from danube.values.config import DispatchStrategy

DEFAULT_BATCHING = Batching()


class DanubeClient:
    """Talks to a Danube broker (ours or Danube's own) at `service_url`, or to a cluster:
    several broker URLs comma-separated, any of which can answer lookups.

    `async with DanubeClient("http://127.0.0.1:6650") as client: ...` closes every channel at
    the end."""

    def __init__(
        self,
        service_url: str,
        *,
        retry: RetryPolicy | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        """`security`: TLS and a bearer token for a secured broker (spec/security.md)."""
        self._connections = Connections(service_url, retry or RetryPolicy(), security)
        self._consumers: list[Consumer] = []

    async def __aenter__(self) -> DanubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stops every consumer's receive loop, then closes the channels."""
        for consumer in self._consumers:
            await consumer.close()
        self._consumers.clear()
        self._connections.close()

    def producer(
        self,
        topic: str,
        name: str,
        *,
        partitions: int = 0,
        dispatch: DispatchStrategy = DispatchStrategy.NON_RELIABLE,
        schema: SchemaRef | None = None,
        batching: Batching | None = DEFAULT_BATCHING,
    ) -> Producer:
        """`schema` names the subject (and version) the messages are written with.
        `batching` groups messages on our brokers' batched path (None: one call per
        message, as Danube's protocol does; brokers without the path get that anyway)."""
        return Producer(
            self._connections,
            topic,
            name,
            partitions=partitions,
            strategy=dispatch,
            schema=schema,
            batching=batching,
        )

    def consumer(
        self,
        topic: str,
        consumer_name: str,
        subscription: str,
        *,
        sub_type: SubType = SubType.SHARED,
        key_filters: tuple[str, ...] = (),
        start: str | int | None = None,
    ) -> Consumer:
        """`start` ("latest", "earliest" or an offset) chooses where a new subscription
        starts; it needs our broker (Danube's always start at the latest message)."""
        consumer = Consumer(
            self._connections,
            topic,
            consumer_name,
            subscription,
            sub_type=sub_type,
            key_filters=key_filters,
            start=start,
        )
        self._consumers.append(consumer)
        return consumer

    @property
    def schemas(self) -> SchemaRegistry:
        """The schema registry, served by any broker."""
        return SchemaRegistry(self._connections)

    async def partitions(self, topic: str) -> list[str]:
        return await self._connections.partitions(topic)

    async def lookup(self, topic: str) -> str:
        """The connect URL of the broker that serves `topic` (the service URL for a topic
        not created yet); a broker's refusal raises `DanubeClientError`."""
        try:
            return await self._connections.lookup(topic)
        except GRPCError as error:
            raise DanubeClientError.from_grpc(f"lookup of {topic}", error) from None
