"""The cluster ports' slots, as the production drivers keep them with trio, under simulated
time: the rules are `danube.machines.cluster.request_batching`'s, shared with
`danube.runtime.load_manager` and `danube.runtime.ownership`; here only their mechanics.

- `DecisionLanes`: the load manager's decisions. Each new decision (`DecisionQueue.offer`)
  adds a taker to its lane, as the driver starts a task; once the machine's call has returned
  (the driver's tasks start when its call gives the loop back) each taker waits for one of
  its lane's `TXNS_IN_FLIGHT` slots and takes a batch then. A batch of several is one store
  request, as etcd's nested transactions (`txn_many`): each with its own compares and
  outcome, applied one after the other where etcd gives them one revision.
- `FlowSlots`: ownership's claims and loads wait for one of `FLOW_SLOTS` (trio's
  `CapacityLimiter` is first come, first served: so is this)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from danube.effects import StoreTxn
from danube.machines.cluster import decisions
from danube.machines.cluster.load_manager import Txn
from danube.machines.cluster.request_batching import (
    BATCH,
    FLOW_SLOTS,
    TXNS_IN_FLIGHT,
    DecisionQueue,
    is_urgent,
)
from danube.metadata.model import Delete, DeletePrefix, Put
from sim.etcd import Origin
from sim.flow_runner import StoreHost, perform_store


class DecisionLanes:
    """One incarnation's load-manager port: `offer` each decision of a machine call, then
    `start` once the call's effects are all offered."""

    __slots__ = ("_busy", "_host", "_queue", "_takers")

    def __init__(self, host: StoreHost) -> None:
        self._host = host
        self._queue = DecisionQueue(BATCH)  # etcd takes several transactions in one request
        self._takers = {True: 0, False: 0}
        """Takers started (one per new decision) that have not had a slot yet, by lane."""
        self._busy = {True: 0, False: 0}
        """Slots held, by lane: batches whose request is under way."""

    @property
    def replaced(self) -> int:
        return self._queue.replaced

    def offer(self, txn: Txn) -> None:
        if self._queue.offer(txn):
            self._takers[is_urgent(txn)] += 1

    def start(self) -> None:
        for urgent in (True, False):
            self._next(urgent)

    def _next(self, urgent: bool) -> None:
        while self._takers[urgent] and self._busy[urgent] < TXNS_IN_FLIGHT:
            self._takers[urgent] -= 1
            batch = self._queue.take(urgent)
            if batch:  # else an earlier taker took them: the slot is free again at once
                self._busy[urgent] += 1
                self._run(batch, urgent)

    def _run(self, batch: list[Txn], urgent: bool) -> None:
        def done(_: Any = None, *, error: BaseException | None = None) -> None:
            self._busy[urgent] -= 1
            self._next(urgent)

        if len(batch) == 1:
            perform_store(self._host, decisions.as_txn(batch[0]), done)
            return
        txns = [decisions.as_txn(txn) for txn in batch]
        host = self._host
        what = f"{len(txns)} decisions: " + ", ".join(t.purpose for t in txns)
        host.call(what, lambda: _transact_all(host, txns), done)


ETCD_MAX_TXN_OPS = 128
"""etcd's `--max-txn-ops` default: nested transactions one request may hold."""


class RefusedBatch(AssertionError):
    """A batch etcd would refuse as a whole: the shared batching rule let it through (the
    production port would fall back to one request each; the simulator fails the run)."""


def refusal(txns: list[StoreTxn]) -> str | None:
    """Why etcd would refuse these nested transactions as one request, if it would: more
    than `ETCD_MAX_TXN_OPS`, two writing one key ("duplicate key given in txn request"),
    or a range deletion beside others (the batching rule sends one alone)."""
    if len(txns) > ETCD_MAX_TXN_OPS:
        return f"{len(txns)} nested transactions, etcd takes {ETCD_MAX_TXN_OPS}"
    written: set[str] = set()
    for txn in txns:
        for op in txn.ops:
            if isinstance(op, DeletePrefix):
                return f"a prefix deletion ({op.prefix}) beside other transactions"
            if isinstance(op, Put | Delete):
                if op.key in written:
                    return f"two transactions write {op.key}"
                written.add(op.key)
    return None


def _transact_all(host: StoreHost, txns: list[StoreTxn]) -> list[Any]:
    """At the store: each transaction of a batch, in order (its origin is its own kind, as
    `perform_store` names a lone one's, for the checker)."""
    why = refusal(txns)
    if why is not None:
        raise RefusedBatch(f"broker {host.name} sent a batch etcd refuses: {why}")
    etcd, name = host.etcd, host.name
    return [
        etcd.txn(t.compares, t.ops, Origin(name, t.purpose.split(" ", 1)[0] or "txn")) for t in txns
    ]


class FlowSlots:
    """Ownership's flows that wait for a slot (`FLOW_SLOTS`), per kind of effect, in the
    order they came; the others start at once."""

    __slots__ = ("_busy", "_waiting")

    def __init__(self) -> None:
        self._busy: dict[type, int] = dict.fromkeys(FLOW_SLOTS, 0)
        self._waiting: dict[type, deque[Callable[[], None]]] = {k: deque() for k in FLOW_SLOTS}

    def run(self, kind: type, start: Callable[[], None]) -> None:
        """Calls `start` now or once a slot of `kind` is free; its flow calls `finished(kind)`
        when it ends."""
        limit = FLOW_SLOTS.get(kind)
        if limit is None:
            start()
        elif self._busy[kind] < limit:
            self._busy[kind] += 1
            start()
        else:
            self._waiting[kind].append(start)

    def finished(self, kind: type) -> None:
        if kind not in FLOW_SLOTS:
            return
        waiting = self._waiting[kind]
        if waiting:
            waiting.popleft()()  # the slot passes on
        else:
            self._busy[kind] -= 1
