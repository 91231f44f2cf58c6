"""Where a topic is served: the answer behind TopicLookup and TopicPartitions, and the gate a
CreateProducer or Subscribe passes before the core sees it.

Standalone, every topic is this broker's and the core answers. In cluster mode the core holds
only the topics this broker owns; for the others the metadata store tells who owns them (the
ownership claim `/topics/<ns>/<t>/owner`), and a new topic is created in the store with an
unassigned marker for the leader's load manager (danube-reference §1.2 step 5): the client is
told UNAVAILABLE and looks the topic up again once it is assigned. What each case answers
is decided by the pure rules of `danube.machines.cluster.placement`; this module reads the facts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from danube import keys
from danube.keys import owner_key
from danube.machines.cluster import holding, records
from danube.machines.cluster import placement as rules
from danube.machines.cluster.placement import Answer, Located
from danube.machines.node.core import BrokerCore
from danube.metadata import KeyValue, MetadataStore, TxnResult
from danube.runtime.watching import store_call_from_grpc
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode, not_found, quoted
from danube.values.names import (
    TopicName,
    check_partition_conflict,
    parse_topic,
    partition_index,
    partition_names,
)

_T = TypeVar("_T")


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Placement(Protocol):
    async def lookup(self, topic: str) -> Located: ...

    async def partitions(self, topic: str) -> list[str]: ...

    async def route(self, topic: str, create: DispatchStrategy | None) -> None:
        """Returns when the core here should take the request for `topic`; raises the
        error the client must see otherwise. `create`: the strategy of a producer that
        may create the topic (None for a consumer)."""
        ...


def _here(core: BrokerCore) -> Located:
    return Located(Answer.CONNECT, core.identity.broker_url, core.identity.connect_url)


class LocalPlacement:
    """Standalone: the core knows every topic."""

    def __init__(self, core: BrokerCore) -> None:
        self._core = core

    async def lookup(self, topic: str) -> Located:
        self._core.lookup(topic)  # raises for a bad or unknown name
        return _here(self._core)

    async def partitions(self, topic: str) -> list[str]:
        return self._core.topic_partitions(topic)

    async def route(self, topic: str, create: DispatchStrategy | None) -> None:
        return None


class ClusterPlacement:
    def __init__(
        self,
        core: BrokerCore,
        store: MetadataStore,
        broker_id: str,
        *,
        auto_create_topics: bool,
        hold_ms: int = 0,
        hold_max: int = holding.MAX_HELD,
    ) -> None:
        self._core = core
        self._store = store
        self._broker_id = broker_id
        self._auto_create = auto_create_topics
        self._hold_ms = hold_ms
        """`cluster.lookup_hold_ms`: how long a request for a topic between owners waits
        for it (`holding.hold_until`)."""
        self._hold_max = hold_max
        """`cluster.lookup_hold_max`: requests held at once; past it, answered at once."""
        self.holding = 0
        """Requests held now (counted here, capped by `holding.hold_until`)."""
        self.view: Callable[[str], rules.ViewFacts | None] | None = None
        """The cluster member's view of `/cluster/` (None until it is read): lookups are
        answered from it when it can tell (`rules.lookup_from_view`)."""

    async def lookup(self, topic: str) -> Located:
        return await self._held(self._lookup, topic)

    async def _held(self, ask: Callable[[str], Awaitable[_T]], topic: str) -> _T:
        """`ask`, asked again while `holding.hold_until` holds its refusal."""
        asked_at = _monotonic_ms()
        held = False
        try:
            while True:
                try:
                    return await ask(topic)
                except DanubeError as error:
                    now = _monotonic_ms()
                    until = holding.hold_until(
                        error,
                        asked_at,
                        now,
                        self._hold_ms,
                        others_held=self.holding - held,
                        max_held=self._hold_max,
                    )
                    if until is None:
                        raise
                if not held:
                    held = True
                    self.holding += 1
                await asyncio.sleep((until - now) / 1000)
        finally:
            if held:
                self.holding -= 1

    async def _lookup(self, topic: str) -> Located:
        if self._core.serves(topic):
            return _here(self._core)
        seen = None if self.view is None else self.view(topic)
        if seen is not None:
            located = rules.lookup_from_view(topic, seen, self._broker_id)
            if located is not None:
                return located
        facts, registration = await self._owner(topic)
        return rules.lookup(topic, facts, self._broker_id, registration)

    async def _owner(self, topic: str) -> tuple[rules.TopicFacts, Any]:
        """The topic's facts and, when another broker owns it, that broker's registration."""
        facts = await self._facts(parse_topic(topic))
        registration = None
        if facts.owner is not None and facts.owner != self._broker_id:
            found = await self._get(keys.register_key(facts.owner))
            registration = found.value if found is not None else None
        return facts, registration

    async def partitions(self, topic: str) -> list[str]:
        name = parse_topic(topic)
        if await self._exists(name):
            return [topic]
        return await self._partitions_of(name)

    async def route(self, topic: str, create: DispatchStrategy | None) -> None:
        async def ask(topic: str) -> None:
            return await self._route(topic, create)

        await self._held(ask, topic)

    async def _route(self, topic: str, create: DispatchStrategy | None) -> None:
        if self._core.serves(topic):
            return
        name = parse_topic(topic)
        seen = None if self.view is None else self.view(topic)
        if seen is not None:
            rules.route_from_view(topic, seen, self._broker_id)
        facts = await self._facts(name)
        strategy = rules.route(
            topic, facts, self._broker_id, create=create, auto_create=self._auto_create
        )
        await self.create([name], strategy)
        raise rules.unavailable(f"{topic} was created and is being assigned; look it up again")

    async def create(self, names: list[TopicName], strategy: DispatchStrategy) -> None:
        """Creates topics in the store for the leader to assign (`rules.creation`)."""
        first = names[0]
        if await self._get(keys.namespace_policy(first.namespace)) is None:
            raise not_found(
                f"namespace {quoted(first.namespace)} does not exist; create it first "
                "(or list it in bootstrap_namespaces)"
            )
        partition = first.partition_of
        check_partition_conflict(
            first,
            base_exists=partition is not None and await self._exists(parse_topic(partition[0])),
            partitioned=partition is None and bool(await self._partitions_of(first)),
        )
        compares, ops = rules.creation(names, strategy)
        result: TxnResult = await store_call_from_grpc(self._store.txn, compares, ops)
        if not result.succeeded:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"topic {first.full} already exists")

    async def create_partitioned(
        self, base: str, partitions: int, strategy: DispatchStrategy
    ) -> None:
        await self.create(partition_names(base, partitions), strategy)

    async def _facts(self, name: TopicName) -> rules.TopicFacts:
        claim = await self._get(owner_key(name.full))
        owner = None
        if claim is not None and isinstance(claim.value, dict):
            owner = records.broker_id_from_json(claim.value.get("broker_id"))
        return rules.TopicFacts(await self._exists(name), owner)

    async def _exists(self, name: TopicName) -> bool:
        return await self._get(keys.topic_delivery(name)) is not None

    async def _partitions_of(self, base: TopicName) -> list[str]:
        prefix = keys.namespace_topics_prefix(base.namespace)
        found = []
        scanned: list[KeyValue] = await store_call_from_grpc(self._store.scan, prefix)
        for kv in scanned:
            topic = keys.parse_namespace_topic(kv.key)
            index = None if topic is None else partition_index(topic.full, base.full)
            if topic is not None and index is not None:
                found.append((index, topic.full))
        return [full for _, full in sorted(found)]

    async def _get(self, key: str) -> KeyValue | None:
        found: KeyValue | None = await store_call_from_grpc(self._store.get, key)
        return found
