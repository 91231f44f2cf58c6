"""What the load manager decides (spec/cluster.md, "Load manager"): one transaction effect per
kind of decision (compares plus operations the driver runs as one transaction, whose outcome
shows in the watch), and the proposals a dry-run rebalance answers with. Apart from the
machine (`danube.machines.cluster.load_manager`, which re-exports them) because the drivers, the
simulator and the tests match on these, not on the machine's internals."""

from __future__ import annotations

from dataclasses import dataclass

from danube.machines.cluster.records import MarkerReason
from danube.metadata.model import Compare, Op


@dataclass(frozen=True, slots=True)
class Assign:
    """Give `topic` to `broker`: put its assignment key, delete the unassigned marker, and
    create the topic's replica set (`danube.machines.cluster.replicas`) if it has none, or
    require it unchanged since the decision (a failover's choice among its in-sync members
    must not survive a shrink)."""

    topic: str
    broker: str
    reason: MarkerReason
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Move:
    """Rebalance `topic` from `from_broker` to `to_broker`: post a `rebalance` marker (not
    ready), delete the source's assignment (the source then unloads the topic and marks it
    ready, and an `Assign` to `to_broker` follows), and write the audit record."""

    topic: str
    from_broker: str
    to_broker: str
    manual: bool
    estimated_load: float
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class FailOver:
    """The assignment of `topic` belongs to a past incarnation of `broker` (spec/cluster.md,
    "Fail-over"): delete it and post a null marker."""

    topic: str
    broker: str
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """The broker that was unloading `topic` (`from_broker`) is gone and will never mark it
    ready: rewrite the marker as null so the topic is assigned again."""

    topic: str
    from_broker: str | None
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class ScheduleTick:
    """Call `tick` at `at` (monotonic ns); a later `ScheduleTick` replaces an earlier one."""

    at: int


@dataclass(frozen=True, slots=True)
class Log:
    """Something an operator should see that no other effect shows."""

    event: str
    detail: str


@dataclass(frozen=True, slots=True)
class MarkDrained:
    """A `draining` broker holds no topic any more and owes no unload: set it `drained`
    (Danube's automatic transition once an UnloadBroker's last topic left)."""

    broker: str
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class SetFollowers:
    """Rewrite the followers of `topic`'s replica set (one gone, the owner among them after
    a promotion, or too few for the replication factor), comparing the record's
    `mod_revision`; its other fields stay as the owner wrote them."""

    topic: str
    followers: tuple[str, ...]
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


Txn = Assign | Move | FailOver | Release | MarkDrained | SetFollowers
"""Run `compares` and `ops` as one transaction; its outcome needs no report."""
Effect = Txn | ScheduleTick | Log


@dataclass(frozen=True, slots=True)
class Proposal:
    """The move a rebalancing step would make (what a TriggerRebalance dry run answers)."""

    topic: str
    from_broker: str
    to_broker: str
    estimated_load: float
    revision: int
    """`mod_revision` of the source's assignment the proposal was read from."""
