"""How the cluster's drivers put the machines' store requests on the wire: which of the load
manager's decisions wait for which slots, which replace each other, which go together in one
store request, and how many of each kind run at once.

These were the production ports' own (`danube.runtime.load_manager`, `danube.runtime.ownership`),
so the simulator ran the machines without them: a decision found in a driver is a bug, because
the simulator cannot see it. Both the ports and the simulator's (`sim.cluster_node`,
`sim.cluster_data`) now take them from here; the ports keep only the mechanics (trio's
limiters and tasks, the simulator's event queue), which carry out these rules as they are.

The load manager's decisions (`DecisionQueue`):

- two lanes of `TXNS_IN_FLIGHT` slots each: the decisions that bring a topic back into service
  (`URGENT`) and the upkeep (moves, followers, drained marks), so that a failover's `Assign`s
  never wait behind its `SetFollowers`;
- a decision made again while the same one still waits for a slot (`decision_key`) replaces
  it: it was decided on a newer view, and the earlier one would only be refused or repeat it;
- a slot takes the oldest waiting decisions, up to `BATCH` in one store request on a store that
  takes several (etcd's nested transactions), none writing a key another one writes and a
  prefix deletion alone (etcd refuses such a request as a whole).

Ownership's flows: claims and loads run `LOADS_IN_FLIGHT` at once each (`FLOW_SLOTS`); a
load slot takes the loads waiting when it comes, up to `LOAD_BATCH`, as one flow
(`LoadQueue`, `ownership_flows.load_many`)."""

from __future__ import annotations

from danube.machines.cluster import ownership as own
from danube.machines.cluster.load_manager import Assign, FailOver, MarkDrained, Release, Txn
from danube.metadata.model import Delete, DeletePrefix, Put

TXNS_IN_FLIGHT = 8
"""Decisions of one lane run at once at most: a failover of hundreds of topics must not queue
hundreds of calls on the store, where they would time out waiting and be made again."""

URGENT = (FailOver, Assign, Release)
"""Decisions that bring a topic back into service. They have slots of their own: a broker's
death also makes the leader replace it as follower of every topic it followed (`SetFollowers`,
as many as the topics it owned), and a failover measured with 234 topics (issue 23,
`bench.cluster_e2e failover-many`) had its `Assign`s wait 15 s behind those in one shared
queue of 8."""

BATCH = 64
"""Decisions in one store request at most, on a store that takes several (`txn_many`):
etcd takes 128 nested transactions by default (`--max-txn-ops`)."""

LOADS_IN_FLIGHT = 16
"""Claims, and loads, run at once at most (each its own bound). A broker given a dead
broker's hundreds of topics at once (issue 23: 234) otherwise starts every claim, then every
load (three scans, two reads, a transaction and a WAL load each) together: none finishes
before all have queued their calls on the store and the loop, so the first topic is served
as late as the last, and the membership's lease renewal waits in the same queues."""

LOAD_BATCH = 32
"""Loads in one flow at most (`ownership_flows.load_many`): its read request holds two
prefixes and the replica set of each, and the namespace policies (etcd takes 128
operations in one transaction by default, `--max-txn-ops`), and its writer request one
nested transaction each."""

FLOW_SLOTS: dict[type, int] = {own.Claim: LOADS_IN_FLIGHT, own.Load: LOADS_IN_FLIGHT}
"""Ownership effects whose flows wait for a slot, and how many run at once (each kind its own
slots); the others run at once."""


def is_urgent(txn: Txn) -> bool:
    return isinstance(txn, URGENT)


def subject(txn: Txn) -> str:
    """What the decision is about: its broker (`MarkDrained`) or its topic."""
    return f"broker={txn.broker}" if isinstance(txn, MarkDrained) else f"topic={txn.topic}"


def decision_key(txn: Txn) -> tuple[str, str]:
    """Decisions with the same key are the same decision made again: a later one replaces an
    earlier one that is still waiting for a slot (it was decided on a newer view; the earlier
    one would only be refused, or repeat what the later one does)."""
    return type(txn).__name__, subject(txn)


class DecisionQueue:
    """The load manager's decisions made but not started, by lane (urgent or not), each the
    latest made under its key, in the order first made.

    A driver `offer`s each decision; when it is new (True) the driver starts one more taker
    for its lane, which waits for one of the lane's `TXNS_IN_FLIGHT` slots and then `take`s a
    batch: the oldest waiting decisions at that moment (an earlier taker may have taken them
    all: an empty batch just gives the slot back). Taking when the slot comes, not when the
    decision is made, is what lets the decisions of one burst share a request."""

    __slots__ = ("_batch", "_waiting", "replaced")

    def __init__(self, batch: int = BATCH) -> None:
        """`batch`: decisions per store request (1 on a store without `txn_many`)."""
        if not 1 <= batch <= BATCH:
            raise ValueError(f"a batch holds 1 to {BATCH} decisions, not {batch}")
        self._batch = batch
        self._waiting: dict[bool, dict[tuple[str, str], Txn]] = {True: {}, False: {}}
        self.replaced = 0
        """Decisions that replaced the same one still waiting for a slot (not run twice)."""

    def offer(self, txn: Txn) -> bool:
        """Queues a decision; False when it replaced the same one still waiting (no new
        taker: the one that would have run the earlier runs this)."""
        key, waiting = decision_key(txn), self._waiting[is_urgent(txn)]
        new = key not in waiting
        if not new:
            self.replaced += 1
        waiting[key] = txn  # replacing keeps the place the first one took
        return new

    def waiting(self, urgent: bool) -> int:
        return len(self._waiting[urgent])

    def take(self, urgent: bool) -> list[Txn]:
        """The oldest waiting decisions of the lane, up to the batch size, none writing a key
        another one writes (etcd refuses such a transaction as a whole) or compares (etcd
        checks every compare of the request against the state before it, where applying
        them one after the other, as the simulated store does, would see the other's write:
        kept apart, both orders agree), a prefix deletion only alone; the rest keep their
        place."""
        waiting = self._waiting[urgent]
        batch: list[Txn] = []
        written: set[str] = set()
        compared: set[str] = set()
        for key, txn in list(waiting.items()):
            if len(batch) == self._batch:
                break
            keys = {op.key for op in txn.ops if isinstance(op, Put | Delete)}
            checks = {compare.key for compare in txn.compares}
            whole = any(isinstance(op, DeletePrefix) for op in txn.ops)
            if keys & written or keys & compared or checks & written or (whole and batch):
                continue
            batch.append(txn)
            del waiting[key]
            if whole:
                break
            written |= keys
            compared |= checks
        return batch


class LoadQueue:
    """Ownership's loads decided but not started, by topic (a later `Load` of a topic
    replaces an earlier one still waiting: it carries the newer claim), in the order first
    decided. As with `DecisionQueue`, a driver starts one taker per new load; a taker that
    gets a load slot `take`s the oldest waiting loads, up to `LOAD_BATCH`, and runs them as
    one flow (an empty batch gives the slot back). Why: a broker given a dead broker's
    hundreds of topics at once (issue 23) loads them a batch per slot, with two store
    requests a batch instead of six a topic."""

    __slots__ = ("_batch", "_waiting")

    def __init__(self, batch: int = LOAD_BATCH) -> None:
        if not 1 <= batch <= LOAD_BATCH:
            raise ValueError(f"a batch holds 1 to {LOAD_BATCH} loads, not {batch}")
        self._batch = batch
        self._waiting: dict[str, own.Load] = {}

    def offer(self, load: own.Load) -> bool:
        """Queues a load; False when it replaced one of the same topic still waiting."""
        new = load.topic not in self._waiting
        self._waiting[load.topic] = load
        return new

    def waiting(self) -> int:
        return len(self._waiting)

    def take(self) -> list[own.Load]:
        batch = []
        for topic in list(self._waiting)[: self._batch]:
            batch.append(self._waiting.pop(topic))
        return batch
