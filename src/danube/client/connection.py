"""Channels to brokers, topic lookup and the retry policy shared by producers and consumers."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.protocol import H2Protocol

from danube.client.errors import RETRYABLE, TRANSPORT_ERRORS, DanubeClientError
from danube.proto import danube as pb

T = TypeVar("T")


def parse_address(url: str) -> tuple[str, int]:
    """Accepts `http://host:port`, `https://host:port` or `host:port`."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname or parts.port is None:
        raise DanubeClientError(f"invalid broker address {url!r}: expected http://host:port")
    return parts.hostname, parts.port


class BrokerChannel(Channel):
    """A grpclib channel that reports a connection lost while it was being set up as a
    connection error. Stock grpclib hands such a connection (its transport already deleted)
    to the request, which then fails with AttributeError: seen when a broker dies during a
    reconnect."""

    async def __connect__(self) -> H2Protocol:
        protocol = await super().__connect__()
        if protocol.handler.connection_lost:
            raise ConnectionResetError("the connection closed while it was being set up")
        return protocol


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff for retryable statuses: attempt n waits uniformly in [L/2, L] with
    L = min(base * (n + 1), max) (the official clients' schedule)."""

    max_retries: int = 5
    base_backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int) -> float:
        limit = min(self.base_backoff_s * (attempt + 1), self.max_backoff_s)
        return random.uniform(limit / 2, limit)


class Connections:
    """One grpclib channel per broker address, shared by every producer and consumer of a
    client."""

    def __init__(self, service_url: str, retry: RetryPolicy) -> None:
        self.service_url = service_url
        self.retry = retry
        self._channels: dict[tuple[str, int], BrokerChannel] = {}
        self.closed = False
        self._request_ids = itertools.count(1)
        parse_address(service_url)

    def next_request_id(self) -> int:
        return next(self._request_ids)

    def channel(self, url: str) -> BrokerChannel:
        if self.closed:
            raise DanubeClientError("the client is closed")
        address = parse_address(url)
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = BrokerChannel(*address)
        return channel

    def close(self) -> None:
        self.closed = True
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    async def lookup(self, topic: str) -> str:
        """The connect URL of the broker that serves `topic`. An unknown topic answers the
        service URL: a producer's create will make the topic there."""
        stub = pb.DiscoveryStub(self.channel(self.service_url))
        try:
            response = await stub.topic_lookup(
                pb.TopicLookupRequest(request_id=self.next_request_id(), topic=topic)
            )
        except GRPCError as error:
            if error.status is Status.NOT_FOUND:
                return self.service_url
            raise DanubeClientError.from_grpc(f"lookup of {topic}", error) from None
        except TRANSPORT_ERRORS as error:
            raise DanubeClientError(f"cannot reach {self.service_url}: {error}") from None
        if response.response_type == pb.TopicLookupResponseLookupType.Failed:
            raise DanubeClientError(f"lookup of {topic} failed")
        return response.connect_url or self.service_url

    async def partitions(self, topic: str) -> list[str]:
        stub = pb.DiscoveryStub(self.channel(self.service_url))
        try:
            response = await stub.topic_partitions(
                pb.TopicLookupRequest(request_id=self.next_request_id(), topic=topic)
            )
        except GRPCError as error:
            raise DanubeClientError.from_grpc(f"partitions of {topic}", error) from None
        except TRANSPORT_ERRORS as error:
            raise DanubeClientError(f"cannot reach {self.service_url}: {error}") from None
        return list(response.partitions)

    async def with_retries(self, what: str, topic: str, call: Callable[[str], Awaitable[T]]) -> T:
        """Runs `call(connect_url)`, re-looking up the topic and backing off on retryable
        statuses and connection failures."""
        attempt = 0
        while True:
            try:
                url = await self.lookup(topic)
                return await call(url)
            except GRPCError as error:
                if error.status not in RETRYABLE or attempt >= self.retry.max_retries:
                    raise DanubeClientError.from_grpc(what, error) from None
            except (*TRANSPORT_ERRORS, DanubeClientError) as error:
                if attempt >= self.retry.max_retries:
                    if isinstance(error, DanubeClientError):
                        raise
                    raise DanubeClientError(f"{what}: cannot reach the broker: {error}") from None
            await asyncio.sleep(self.retry.delay(attempt))
            attempt += 1
