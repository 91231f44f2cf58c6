"""Runs the load manager (`danube.machines.cluster.load_manager`) against the metadata store.

Every broker runs one, so its view of `/cluster/` is current on the day it is elected; the
membership driver tells it when leadership comes and goes. The view is a scan followed by a
watch; the decisions are transactions whose outcome shows up in that same watch.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import trio

from danube import keys
from danube.effects import Outcome, TxnAnswer
from danube.machines.cluster import decisions
from danube.machines.cluster.load_manager import (
    Assign,
    Effect,
    FailOver,
    LoadManager,
    Log,
    MarkDrained,
    Move,
    Release,
    ScheduleTick,
    Txn,
)
from danube.metadata import Delete, DeletePrefix, KeyValue, MetadataStore, Put, WatchEvent
from danube.runtime.store_port import perform_txns
from danube.runtime.watching import Alarm, follow

log = logging.getLogger("danube.runtime")

TXNS_IN_FLIGHT = 8
"""Decisions of one class run at once at most: a failover of hundreds of topics must not
queue hundreds of calls on the store, where they would time out waiting and be made again."""

URGENT = (FailOver, Assign, Release)
"""Decisions that bring a topic back into service. They have slots of their own: a broker's
death also makes the leader replace it as follower of every topic it followed (`SetFollowers`,
as many as the topics it owned), and a failover measured with 234 topics (issue 23,
`bench.cluster_e2e failover-many`) had its `Assign`s wait 15 s behind those in one shared
queue of 8."""


BATCH = 64
"""Decisions in one store request at most, on a store that takes several (`txn_many`):
etcd takes 128 nested transactions by default (`--max-txn-ops`)."""


def _decision_key(txn: Txn) -> tuple[str, str]:
    """Decisions with the same key are the same decision made again: a later one replaces an
    earlier one that is still waiting for a slot (it was decided on a newer view; the earlier
    one would only be refused, or repeat what the later one does)."""
    return type(txn).__name__, _subject(txn)


def _now_ns() -> int:
    return int(trio.current_time() * 1e9)


def _unix_s() -> int:
    return int(time.time())


class LoadManagerDriver:
    def __init__(self, store: MetadataStore, machine: LoadManager) -> None:
        self.store = store
        self.machine = machine
        self._nursery: trio.Nursery | None = None
        self._alarm = Alarm(lambda: self._apply(self.machine.tick(_now_ns(), unix_s=_unix_s())))
        self._urgent = trio.CapacityLimiter(TXNS_IN_FLIGHT)
        self._upkeep = trio.CapacityLimiter(TXNS_IN_FLIGHT)
        self._waiting: dict[bool, dict[tuple[str, str], Txn]] = {True: {}, False: {}}
        """Decisions made but not started (no slot yet), urgent or not, by `_decision_key`,
        in the order made."""
        self._batch = BATCH if hasattr(store, "txn_many") else 1
        self.replaced = 0
        """Decisions that replaced the same one still waiting for a slot (not run twice)."""
        self.synced = trio.Event()
        """Set once the view holds a whole snapshot of `/cluster/`."""
        self.moves: collections.Counter[str] = collections.Counter()
        """Topic moves this broker made as leader, by reason (`load_imbalance`, `manual`)."""
        self.move_failures = 0
        """Moves whose transaction failed or found the cluster changed (made again if due)."""
        self.on_snapshot: Callable[[list[KeyValue]], None] | None = None
        self.on_event: Callable[[WatchEvent], None] | None = None
        """Others who follow `/cluster/` through this view (the replication port): told of
        each whole read and each change after the machine."""

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._alarm.run)
            await follow(self.store, keys.CLUSTER_PREFIX, self._resync, self._observe)
            nursery.cancel_scope.cancel()

    def leadership(self, leading: bool) -> None:
        """From the membership driver: this broker won or lost the leader key."""
        now = _now_ns()
        self._apply(
            self.machine.became_leader(now) if leading else self.machine.lost_leadership(now)
        )

    def trigger_rebalance(self, max_moves: int | None) -> None:
        self._apply(self.machine.trigger_rebalance(max_moves, _now_ns(), unix_s=_unix_s()))

    def _apply(self, effects: list[Effect]) -> None:
        if self._nursery is None:
            return  # not running yet: the first snapshot brings the view up to date
        for effect in effects:
            if isinstance(effect, ScheduleTick):
                self._alarm.set(effect.at / 1e9)
            elif isinstance(effect, Log):
                log.info("event=%s %s", effect.event, effect.detail)
            else:
                key, urgent = _decision_key(effect), isinstance(effect, URGENT)
                waiting = self._waiting[urgent]
                if key in waiting:
                    self.replaced += 1
                else:  # one task per waiting decision: each batch takes at least one
                    self._nursery.start_soon(self._transact, urgent)
                waiting[key] = effect

    async def _transact(self, urgent: bool) -> None:
        """Runs the decisions (`danube.machines.cluster.decisions`) waiting when a slot comes,
        up to `BATCH` in one store request, each the latest made under its key. Outcomes are
        not reported: a decision that took effect shows in the watch, and one that did not
        (a compare failed, the store did not answer) is made again by the machine when it is
        still due."""
        async with self._urgent if urgent else self._upkeep:
            batch = self._take(self._waiting[urgent])
            if not batch:
                return  # an earlier batch took them
            answers = await perform_txns(self.store, [decisions.as_txn(t) for t in batch])
        for txn, answer in zip(batch, answers, strict=True):
            self._report(txn, answer)

    def _take(self, waiting: dict[tuple[str, str], Txn]) -> list[Txn]:
        """The oldest waiting decisions, up to the batch size, none writing a key another
        one writes (etcd refuses such a transaction as a whole)."""
        batch: list[Txn] = []
        written: set[str] = set()
        for key, txn in list(waiting.items()):
            if len(batch) == self._batch:
                break
            keys = {op.key for op in txn.ops if isinstance(op, Put | Delete)}
            whole = any(isinstance(op, DeletePrefix) for op in txn.ops)
            if keys & written or (whole and batch):
                continue
            batch.append(txn)
            del waiting[key]
            if whole:
                break
            written |= keys
        return batch

    def _report(self, txn: Txn, answer: TxnAnswer) -> None:
        self._count(txn, succeeded=answer.committed)
        if answer.committed:
            log.info("event=%s", _describe(txn))
        elif answer.outcome is Outcome.UNKNOWN:
            log.warning(
                "event=load_manager_txn_failed decision=%s %s error=no answer",
                type(txn).__name__, _subject(txn),
            )  # fmt: skip
        else:
            log.info(
                "event=load_manager_txn_stale decision=%s %s",
                type(txn).__name__, _subject(txn),
            )  # fmt: skip

    def _count(self, txn: Txn, *, succeeded: bool) -> None:
        if not isinstance(txn, Move):
            return
        if succeeded:
            self.moves["manual" if txn.manual else "load_imbalance"] += 1
        else:
            self.move_failures += 1

    async def _resync(self) -> int:
        snapshot = await self.store.scan(keys.CLUSTER_PREFIX)
        self._apply(self.machine.resync(snapshot, _now_ns()))
        if self.on_snapshot is not None:
            self.on_snapshot(list(snapshot))
        self.synced.set()
        return max((kv.mod_revision for kv in snapshot), default=0)

    def _observe(self, event: WatchEvent) -> None:
        self._apply(self.machine.observe(event, _now_ns()))
        if self.on_event is not None:
            self.on_event(event)


def _subject(txn: Txn) -> str:
    return f"broker={txn.broker}" if isinstance(txn, MarkDrained) else f"topic={txn.topic}"


def _describe(txn: Txn) -> str:
    if isinstance(txn, MarkDrained):
        return f"broker_drained broker={txn.broker}"
    name = type(txn).__name__.lower()
    fields = {
        "topic": txn.topic,
        **{
            attr: getattr(txn, attr)
            for attr in ("broker", "from_broker", "to_broker")
            if hasattr(txn, attr)
        },
    }
    return f"topic_{name} " + " ".join(f"{k}={v}" for k, v in fields.items())
