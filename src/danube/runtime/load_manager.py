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
    Effect,
    LoadManager,
    Log,
    MarkDrained,
    Move,
    ScheduleTick,
    Txn,
)
from danube.machines.cluster.request_batching import (
    BATCH,
    TXNS_IN_FLIGHT,
    DecisionQueue,
    is_urgent,
    subject,
)
from danube.metadata import KeyValue, MetadataStore, WatchEvent
from danube.runtime.store_port import perform_txns
from danube.runtime.watching import Alarm, follow

log = logging.getLogger("danube.runtime")


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
        self._decisions = DecisionQueue(BATCH if hasattr(store, "txn_many") else 1)
        """Decisions made but not started (no slot yet): which wait, which replace each
        other and which go together is `danube.machines.cluster.request_batching`'s."""
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

    @property
    def replaced(self) -> int:
        """Decisions that replaced the same one still waiting for a slot (not run twice)."""
        return self._decisions.replaced

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
            elif self._decisions.offer(effect):
                # one task per waiting decision: each batch takes at least one
                self._nursery.start_soon(self._transact, is_urgent(effect))

    async def _transact(self, urgent: bool) -> None:
        """Runs the decisions (`danube.machines.cluster.decisions`) waiting when a slot comes,
        as `DecisionQueue.take` batches them. Outcomes are not reported: a decision that took
        effect shows in the watch, and one that did not (a compare failed, the store did not
        answer) is made again by the machine when it is still due."""
        async with self._urgent if urgent else self._upkeep:
            batch = self._decisions.take(urgent)
            if not batch:
                return  # an earlier batch took them
            answers = await perform_txns(self.store, [decisions.as_txn(t) for t in batch])
        for txn, answer in zip(batch, answers, strict=True):
            self._report(txn, answer)

    def _report(self, txn: Txn, answer: TxnAnswer) -> None:
        self._count(txn, succeeded=answer.committed)
        if answer.committed:
            log.info("event=%s", _describe(txn))
        elif answer.outcome is Outcome.UNKNOWN:
            log.warning(
                "event=load_manager_txn_failed decision=%s %s error=no answer",
                type(txn).__name__, subject(txn),
            )  # fmt: skip
        else:
            log.info(
                "event=load_manager_txn_stale decision=%s %s",
                type(txn).__name__, subject(txn),
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
