"""Where a topic is served: the answer behind TopicLookup and TopicPartitions, and the gate a
CreateProducer or Subscribe passes before the core sees it.

Standalone, every topic is this broker's and the core answers. In cluster mode the core holds
only the topics this broker owns; for the others the metadata store tells who owns them (the
ownership claim `/topics/<ns>/<t>/owner`), and a new topic is created in the store with an
unassigned marker for the leader's load manager (danube-reference §1.2 step 5): the client is
told UNAVAILABLE and looks the topic up again once it is assigned.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio
import trio_asyncio

from danube.broker.watching import REQUEST_TIMEOUT_S
from danube.cluster import keys
from danube.cluster.ownership import owner_key
from danube.core.config import DispatchStrategy
from danube.core.errors import DanubeError, ErrorCode, not_found
from danube.core.names import TopicName, parse_topic, partition_index, partition_name
from danube.metadata import Compare, KeyValue, MetadataError, MetadataStore, Put, TxnResult
from danube.node import paths
from danube.node.core import BrokerCore, BrokerIdentity

T = TypeVar("T")


class Answer(enum.Enum):
    CONNECT = "connect"
    REDIRECT = "redirect"


@dataclass(frozen=True, slots=True)
class Located:
    answer: Answer
    broker: BrokerIdentity


class Placement(Protocol):
    async def lookup(self, topic: str) -> Located: ...

    async def partitions(self, topic: str) -> list[str]: ...

    async def route(self, topic: str, create: DispatchStrategy | None) -> None:
        """Returns when the core here should take the request for `topic`; raises the
        error the client must see otherwise. `create`: the strategy of a producer that
        may create the topic (None for a consumer)."""
        ...

    def check_served(self, topic: str) -> None:
        """Before an ack or nack: raises when another broker serves the topic now."""
        ...


class LocalPlacement:
    """Standalone: the core knows every topic."""

    def __init__(self, core: BrokerCore) -> None:
        self._core = core

    async def lookup(self, topic: str) -> Located:
        return Located(Answer.CONNECT, self._core.lookup(topic))

    async def partitions(self, topic: str) -> list[str]:
        return self._core.topic_partitions(topic)

    async def route(self, topic: str, create: DispatchStrategy | None) -> None:
        return None

    def check_served(self, topic: str) -> None:
        return None


def _unavailable(message: str) -> DanubeError:
    return DanubeError(ErrorCode.UNAVAILABLE, message)


async def _store_call(call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """A store request from a gRPC handler (asyncio), run in trio with a deadline; a store
    that does not answer is UNAVAILABLE to the client, who retries."""

    async def bounded() -> T:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            return await call(*args)

    try:
        return await trio_asyncio.trio_as_aio(bounded)()
    except (MetadataError, trio.TooSlowError) as error:
        raise _unavailable(f"the metadata store did not answer ({error or 'timeout'})") from None


class ClusterPlacement:
    def __init__(
        self,
        core: BrokerCore,
        store: MetadataStore,
        broker_id: str,
        *,
        auto_create_topics: bool,
    ) -> None:
        self._core = core
        self._store = store
        self._broker_id = broker_id
        self._auto_create = auto_create_topics

    async def lookup(self, topic: str) -> Located:
        name = parse_topic(topic)
        if self._core.serves(topic):
            return Located(Answer.CONNECT, self._core.identity)
        owner = await self._owner(topic)
        if owner is None:
            if not await self._exists(name):
                raise not_found(f"topic {topic} does not exist")
            raise _unavailable(f"{topic} is being assigned to a broker; retry shortly")
        if owner == self._broker_id:
            raise _unavailable(f"{topic} is loading or moving on this broker; retry shortly")
        registration = await self._get(keys.register_key(owner))
        value = registration.value if registration is not None else None
        if not isinstance(value, dict) or not value.get("broker_url"):
            raise _unavailable(f"{topic} is owned by broker {owner}, which is not registered")
        broker_url = str(value["broker_url"])
        connect_url = str(value.get("connect_url") or broker_url)
        return Located(Answer.REDIRECT, BrokerIdentity(broker_url, connect_url))

    def check_served(self, topic: str) -> None:
        if not self._core.serves(topic):
            raise _unavailable(
                f"{topic} is not served by this broker (it moved); the message will be "
                "delivered again by its owner"
            )

    async def partitions(self, topic: str) -> list[str]:
        name = parse_topic(topic)
        if await self._exists(name):
            return [topic]
        return await self._partitions_of(name)

    async def route(self, topic: str, create: DispatchStrategy | None) -> None:
        if self._core.serves(topic):
            return
        name = parse_topic(topic)
        if await self._exists(name):
            owner = await self._owner(topic)
            if owner is None or owner == self._broker_id:
                raise _unavailable(f"{topic} is being assigned to a broker; retry shortly")
            raise _unavailable(f"{topic} is served by another broker; look it up again")
        if create is None:
            raise not_found(f"topic {topic} does not exist")
        if not self._auto_create:
            raise not_found(f"topic {topic} does not exist and auto_create_topics is off")
        await self.create([name], create)
        raise _unavailable(f"{topic} was created and is being assigned; look it up again")

    async def create(self, names: list[TopicName], strategy: DispatchStrategy) -> None:
        """Creates topics in the store, each with an unassigned marker the leader assigns.
        One transaction: all of them (the partitions of one topic) or none."""
        first = names[0]
        if await self._get(paths.namespace_policy(first.namespace)) is None:
            raise not_found(
                f"namespace {first.namespace!r} does not exist; create it first "
                "(or list it in bootstrap_namespaces)"
            )
        await self._check_partition_conflicts(first)
        compares = [Compare(paths.topic_delivery(n), "version", "==", 0) for n in names]
        ops = []
        for n in names:
            ops += [
                Put(paths.namespace_topic(n), None),
                Put(paths.topic_delivery(n), strategy.label),
                Put(keys.unassigned_key(n.full), None),
            ]
        result: TxnResult = await _store_call(self._store.txn, compares, ops)
        if not result.succeeded:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"topic {first.full} already exists")

    async def create_partitioned(
        self, base: str, partitions: int, strategy: DispatchStrategy
    ) -> None:
        parse_topic(base)
        if not 1 <= partitions <= 10_000:
            raise DanubeError(
                ErrorCode.INVALID_ARGUMENT,
                f"partitions must be between 1 and 10000, got {partitions}",
            )
        names = [parse_topic(partition_name(base, i)) for i in range(partitions)]
        await self.create(names, strategy)

    async def _check_partition_conflicts(self, name: TopicName) -> None:
        partition = name.partition_of
        if partition is not None and await self._exists(parse_topic(partition[0])):
            raise DanubeError(
                ErrorCode.ALREADY_EXISTS,
                f"cannot create partition {name.full}: {partition[0]} exists as a "
                "non-partitioned topic",
            )
        if partition is None and await self._partitions_of(name):
            raise DanubeError(
                ErrorCode.ALREADY_EXISTS,
                f"cannot create topic {name.full}: it exists as a partitioned topic",
            )

    async def _exists(self, name: TopicName) -> bool:
        return await self._get(paths.topic_delivery(name)) is not None

    async def _partitions_of(self, base: TopicName) -> list[str]:
        prefix = paths.namespace_prefix(base.namespace) + "topics/"
        found = []
        scanned: list[KeyValue] = await _store_call(self._store.scan, prefix)
        for kv in scanned:
            full = "/" + kv.key[len(prefix) :]
            index = partition_index(full, base.full)
            if index is not None:
                found.append((index, full))
        return [full for _, full in sorted(found)]

    async def _owner(self, topic: str) -> str | None:
        claim = await self._get(owner_key(topic))
        if claim is None or not isinstance(claim.value, dict):
            return None
        return keys.broker_id_from_json(claim.value.get("broker_id"))

    async def _get(self, key: str) -> KeyValue | None:
        found: KeyValue | None = await _store_call(self._store.get, key)
        return found
