"""An instant metadata store for tests of the cluster machines, and a synchronous driver of
the load manager over it.

`InstantStore` is `danube.metadata.state.MetadataState` (the etcd semantics every backend
shares: one revision per changing transaction, `version` reset on delete, a missing key
failing every value compare) with the conveniences tests want, and it answers the store
effects of `danube.effects` at once, so flows run against it with `run_now`. Every change is
kept as a `WatchEvent` in revision order, as a watch would deliver it.

`ManagerDriver` carries out the load manager's decisions as the broker's driver does
(`danube.machines.cluster.decisions.as_txn`, one transaction each) and feeds the events back one at
a time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from danube import keys
from danube.effects import Outcome, StoreList, StoreRead, StoreTxn, TxnAnswer
from danube.machines.cluster import decisions
from danube.machines.cluster.load_manager import Effect, LoadManager, ScheduleTick, Txn
from danube.metadata.model import Compare, Delete, KeyValue, Op, Put, WatchEvent
from danube.metadata.state import MetadataState

DECISIONS = Txn.__args__  # type: ignore[attr-defined]
"""The load manager's effects that are decisions (store transactions)."""


class InstantStore:
    def __init__(self) -> None:
        self.state = MetadataState()
        self.events: list[WatchEvent] = []

    @property
    def revision(self) -> int:
        return self.state.revision

    @property
    def data(self) -> dict[str, KeyValue]:
        """Every key, as it is now."""
        return {kv.key: kv for kv in self.state.scan("")}

    def value(self, key: str) -> Any:
        found = self.state.get(key)
        if found is None:
            raise KeyError(key)
        return found.value

    def txn(self, compares: tuple[Compare, ...] | list[Compare], ops: tuple[Op, ...]) -> bool:
        result, events = self.state.txn(list(compares), list(ops))
        self.events.extend(events)
        return result.succeeded

    def put(self, key: str, value: Any) -> None:
        self.txn((), (Put(key, value),))

    def delete(self, key: str) -> None:
        self.txn((), (Delete(key),))

    def snapshot(self) -> list[KeyValue]:
        return self.state.scan("")

    def owners(self, topic: str) -> list[str]:
        """Brokers holding an assignment of `topic`."""
        found = []
        for kv in self.state.scan(keys.BROKERS_PREFIX):
            parsed = keys.parse_assignment_key(kv.key)
            if parsed is not None and parsed[1] == topic:
                found.append(parsed[0])
        return sorted(found)

    def perform(self, effect: StoreRead | StoreList | StoreTxn) -> Any:
        """Answers a store effect at once (for `danube.effects.flow.run_now`)."""
        if isinstance(effect, StoreRead):
            return self.state.get(effect.key)
        if isinstance(effect, StoreList):
            return self.state.scan(effect.prefix)
        if self.txn(effect.compares, effect.ops):
            return TxnAnswer(Outcome.COMMITTED, revision=self.revision)
        found = {key: self.state.get(key) for key in effect.read_back}
        return TxnAnswer(Outcome.REFUSED, found)


@dataclass
class ManagerDriver:
    """Runs `manager`'s decisions on `store` at once and delivers every event in order."""

    manager: LoadManager
    store: InstantStore
    delivered: int = 0
    effects: list[Effect] = field(default_factory=list)
    committed: list[Txn] = field(default_factory=list)
    failed: list[Txn] = field(default_factory=list)
    tick_at: int | None = None

    def run(self, effects: list[Effect]) -> list[Effect]:
        for effect in effects:
            self.effects.append(effect)
            if isinstance(effect, DECISIONS):
                answer = self.store.perform(decisions.as_txn(effect))
                (self.committed if answer.committed else self.failed).append(effect)
            elif isinstance(effect, ScheduleTick):
                self.tick_at = effect.at
        return effects

    def settle(self, now: int) -> list[Effect]:
        """Delivers events until the machine has nothing more to say; returns its effects."""
        start = len(self.effects)
        while self.delivered < len(self.store.events):
            event = self.store.events[self.delivered]
            self.delivered += 1
            self.run(self.manager.observe(event, now))
        return self.effects[start:]

    def tick(self, now: int, unix_s: int = 1_700_000_000) -> list[Effect]:
        start = len(self.effects)
        self.tick_at = None  # it fired
        self.run(self.manager.tick(now, unix_s=unix_s))
        self.settle(now)
        return self.effects[start:]
