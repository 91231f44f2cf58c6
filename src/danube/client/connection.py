"""Channels to brokers, topic lookup and the retry policy shared by producers and consumers."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.protocol import H2Protocol

from danube.client.errors import RETRYABLE, TRANSPORT_ERRORS, DanubeClientError
from danube.client.security import ClientSecurity
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
    reconnect. With `security`: TLS, and the bearer token on every call (this is the one
    place every request of our client and tools goes through)."""

    def __init__(self, host: str, port: int, security: ClientSecurity | None = None) -> None:
        security = security or ClientSecurity()
        config = Configuration(ssl_target_name_override=security.domain)
        super().__init__(host, port, ssl=security.context(), config=config)
        self._security = security
        self._auth = security.metadata()
        self._dynamic = security.headers is not None

    def request(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        auth = self._security.metadata() if self._dynamic else self._auth
        if auth:
            metadata = {**dict(metadata or {}), **auth}
        return super().request(*args, metadata=metadata, **kwargs)

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
    min_elapsed_s: float = 30.0
    """Once a broker has answered, retries go on for at least this long, beyond
    `max_retries`: a topic is unavailable for a while when its broker dies (the lease's TTL,
    then the move), and a client that gave up after the official clients' ~3 s would fail
    every failover. A client that never reached a broker gives up after `max_retries`."""

    def exhausted(self, attempt: int, elapsed_s: float, reached: bool) -> bool:
        return attempt >= self.max_retries and (not reached or elapsed_s >= self.min_elapsed_s)

    def delay(self, attempt: int) -> float:
        limit = min(self.base_backoff_s * (attempt + 1), self.max_backoff_s)
        return random.uniform(limit / 2, limit)


CREATE_RETRYABLE = RETRYABLE - {Status.RESOURCE_EXHAUSTED}
"""What creating a producer or subscribing retries. A broker answers RESOURCE_EXHAUSTED there
for a topic's limit (max producers, consumers, subscriptions), which stays reached until
someone leaves: the caller hears of it at once rather than after half a minute of retries."""


class Connections:
    """One grpclib channel per broker address, shared by every producer and consumer of a
    client."""

    def __init__(
        self, service_url: str, retry: RetryPolicy, security: ClientSecurity | None = None
    ) -> None:
        self.service_urls = [url.strip() for url in service_url.split(",") if url.strip()]
        """Several brokers of a cluster (comma-separated): lookups go to the first that
        answers, so the client outlives any one broker."""
        if not self.service_urls:
            raise DanubeClientError("no broker address given")
        self.retry = retry
        self.security = security
        if security is not None:
            try:  # an unreadable CA or client certificate: say so now, not as "unreachable"
                security.context()
            except (OSError, ValueError) as error:
                raise DanubeClientError(f"TLS settings: {error}") from None
        self._channels: dict[tuple[str, int], BrokerChannel] = {}
        self.closed = False
        self._request_ids = itertools.count(1)
        self.reached = False
        """Some broker has answered a discovery call."""
        for url in self.service_urls:
            parse_address(url)

    @property
    def service_url(self) -> str:
        """The broker that answered the last discovery call (the first one to begin with)."""
        return self.service_urls[0]

    async def _discover(self, what: str, call: Callable[[pb.DiscoveryStub], Awaitable[T]]) -> T:
        return await self.on_any_broker(what, lambda channel: call(pb.DiscoveryStub(channel)))

    async def on_any_broker(self, what: str, call: Callable[[BrokerChannel], Awaitable[T]]) -> T:
        """Runs a call that any broker can answer (discovery, the schema registry) on the
        service brokers in turn until one is reached; the one reached goes first next
        time."""
        failures = []
        for url in list(self.service_urls):
            try:
                result = await call(self.channel(url))
            except TRANSPORT_ERRORS as error:
                failures.append(f"{url}: {error}")
                continue
            except GRPCError:
                self._answered(url)  # an error answer still proves the broker is up
                raise
            self._answered(url)
            return result
        raise DanubeClientError(f"{what}: cannot reach any broker ({'; '.join(failures)})")

    def _answered(self, url: str) -> None:
        self.reached = True
        if url != self.service_urls[0]:
            self.service_urls.remove(url)
            self.service_urls.insert(0, url)

    def next_request_id(self) -> int:
        return next(self._request_ids)

    def channel(self, url: str) -> BrokerChannel:
        if self.closed:
            raise DanubeClientError("the client is closed")
        address = parse_address(url)
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = BrokerChannel(*address, self.security)
        return channel

    def close(self) -> None:
        self.closed = True
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    async def lookup(self, topic: str) -> str:
        """The connect URL of the broker that serves `topic`. An unknown topic answers the
        service URL: a producer's create will make the topic there."""
        request = pb.TopicLookupRequest(request_id=self.next_request_id(), topic=topic)
        try:
            response = await self._discover(
                f"lookup of {topic}", lambda stub: stub.topic_lookup(request)
            )
        except GRPCError as error:
            if error.status is Status.NOT_FOUND:
                return self.service_url
            raise
        if response.response_type == pb.TopicLookupResponseLookupType.Failed:
            raise DanubeClientError(f"lookup of {topic} failed")
        return response.connect_url or self.service_url

    async def partitions(self, topic: str) -> list[str]:
        request = pb.TopicLookupRequest(request_id=self.next_request_id(), topic=topic)
        try:
            response = await self._discover(
                f"partitions of {topic}", lambda stub: stub.topic_partitions(request)
            )
        except GRPCError as error:
            raise DanubeClientError.from_grpc(f"partitions of {topic}", error) from None
        return list(response.partitions)

    async def with_retries(self, what: str, topic: str, call: Callable[[str], Awaitable[T]]) -> T:
        """Runs `call(connect_url)`, re-looking up the topic and backing off on retryable
        statuses and connection failures."""
        attempt = 0
        started = time.monotonic()
        while True:
            try:
                url = await self.lookup(topic)
                return await call(url)
            except GRPCError as error:
                elapsed = time.monotonic() - started
                exhausted = self.retry.exhausted(attempt, elapsed, self.reached)
                if error.status not in CREATE_RETRYABLE or exhausted:
                    raise DanubeClientError.from_grpc(what, error) from None
            except (*TRANSPORT_ERRORS, DanubeClientError) as error:
                if self.retry.exhausted(attempt, time.monotonic() - started, self.reached):
                    if isinstance(error, DanubeClientError):
                        raise
                    raise DanubeClientError(f"{what}: cannot reach the broker: {error}") from None
            await asyncio.sleep(self.retry.delay(attempt))
            attempt += 1
