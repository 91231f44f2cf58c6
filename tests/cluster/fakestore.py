"""A metadata store small enough to trust, and a synchronous driver for the load manager.

`FakeStore` keeps etcd's revision rules (one revision per transaction, `version` reset on
delete, a missing key compares as version/revisions 0 and fails every value compare) and
records every change as a `WatchEvent` in revision order, which is all the load manager
relies on. `Driver` runs the
machine's transactions against it and feeds the resulting events back, one at a time, as the
trio driver does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from danube.cluster import keys
from danube.cluster.load_manager import Effect, LoadManager, ScheduleTick, Txn
from danube.metadata.model import Compare, Delete, DeletePrefix, KeyValue, Op, Put, WatchEvent

TXN_TYPES = Txn.__args__  # type: ignore[attr-defined]


@dataclass
class FakeStore:
    data: dict[str, KeyValue] = field(default_factory=dict)
    revision: int = 0
    events: list[WatchEvent] = field(default_factory=list)

    def value(self, key: str) -> Any:
        return self.data[key].value

    def holds(self, compare: Compare) -> bool:
        kv = self.data.get(compare.key)
        if compare.target == "value":
            if kv is None:
                return False  # etcd: no value compare holds on a missing key
            left, right = json.dumps(kv.value, sort_keys=True), json.dumps(compare.operand)
        else:
            left = 0 if kv is None else getattr(kv, compare.target)
            right = compare.operand
        return {
            "==": left == right,
            "!=": left != right,
            "<": left < right,
            ">": left > right,
        }[compare.op]

    def txn(self, compares: tuple[Compare, ...], ops: tuple[Op, ...]) -> bool:
        if not all(self.holds(c) for c in compares):
            return False
        revision = self.revision + 1
        changed = False
        for op in ops:
            if isinstance(op, Put):
                old = self.data.get(op.key)
                self.data[op.key] = KeyValue(
                    op.key,
                    op.value,
                    revision if old is None else old.create_revision,
                    revision,
                    1 if old is None else old.version + 1,
                    None,
                )
                self.events.append(WatchEvent("put", op.key, op.value, revision, None))
                changed = True
            elif isinstance(op, Delete) and op.key in self.data:
                old = self.data.pop(op.key)
                self.events.append(WatchEvent("delete", op.key, None, revision, old.value))
                changed = True
            elif isinstance(op, DeletePrefix):
                for key in sorted(k for k in self.data if k.startswith(op.prefix)):
                    old = self.data.pop(key)
                    self.events.append(WatchEvent("delete", key, None, revision, old.value))
                    changed = True
        if changed:
            self.revision = revision
        return True

    def put(self, key: str, value: Any) -> None:
        self.txn((), (Put(key, value),))

    def delete(self, key: str) -> None:
        self.txn((), (Delete(key),))

    def snapshot(self) -> list[KeyValue]:
        return list(self.data.values())

    def owners(self, topic: str) -> list[str]:
        """Brokers holding an assignment of `topic`."""
        found = []
        for key in self.data:
            parsed = keys.parse_assignment_key(key)
            if parsed is not None and parsed[1] == topic:
                found.append(parsed[0])
        return sorted(found)


@dataclass
class Driver:
    """Runs `manager`'s transactions on `store` at once and delivers every event in order."""

    manager: LoadManager
    store: FakeStore
    delivered: int = 0
    effects: list[Effect] = field(default_factory=list)
    committed: list[Txn] = field(default_factory=list)
    failed: list[Txn] = field(default_factory=list)
    tick_at: int | None = None

    def run(self, effects: list[Effect]) -> list[Effect]:
        for effect in effects:
            self.effects.append(effect)
            if isinstance(effect, TXN_TYPES):
                ok = self.store.txn(effect.compares, effect.ops)
                (self.committed if ok else self.failed).append(effect)
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
