"""What the broker does with each request of its `Membership` machine, as sans-I/O flows
over `danube.effects`: run by the broker's membership driver over etcd
(`danube.runtime.membership`) and by the simulator's broker process over its simulated etcd
(`sim.cluster_node`), so both answer the machine the same way (spec/cluster.md,
"Registration and leader election").

Each flow returns the effects of the machine input it ends with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from danube.effects import (
    LeaseGone,
    LeaseGrant,
    LeaseRenew,
    StoreTxn,
    StoreUnreachable,
)
from danube.effects.flow import Flow
from danube.machines.cluster import membership as ms
from danube.metadata.model import JSONValue, Put

Now = Callable[[], int]


@dataclass(frozen=True, slots=True)
class MeasureLoad:
    """Answered with this broker's load report (`danube.machines.cluster.ranking.LoadReport` as
    JSON): what the broker measures of itself is the driver's, not a decision."""


def grant(machine: ms.Membership, effect: ms.GrantLease, now: Now) -> Flow[list[ms.Effect]]:
    try:
        lease = yield LeaseGrant(effect.ttl_s)
    except StoreUnreachable:
        return machine.request_failed(now())
    return machine.lease_granted(lease, sent_at_ms=effect.sent_at_ms, now_ms=now())


def register(machine: ms.Membership, effect: ms.Register, now: Now) -> Flow[list[ms.Effect]]:
    """The registration has no compares: only an answer says it landed."""
    answer = yield StoreTxn((), effect.ops, purpose=f"register lease {effect.lease_id}")
    if not answer.committed:
        return machine.request_failed(now())
    return machine.registered(effect.lease_id, now(), revision=answer.revision)


def renew(machine: ms.Membership, effect: ms.Renew, now: Now) -> Flow[list[ms.Effect]]:
    try:
        yield LeaseRenew(effect.lease_id)
    except LeaseGone:
        return machine.lease_lost(effect.lease_id, now())
    except StoreUnreachable:
        return machine.renew_failed(effect.lease_id, now())
    return machine.renewed(effect.lease_id, sent_at_ms=effect.sent_at_ms, now_ms=now())


def campaign(machine: ms.Membership, effect: ms.Campaign, now: Now) -> Flow[list[ms.Effect]]:
    """Won only when the store says so; an unanswered campaign is lost for now (the leader
    key's watch tells the machine who leads)."""
    answer = yield StoreTxn(effect.compares, effect.ops, purpose="campaign")
    return machine.campaign_done(effect.lease_id, answer.committed, now())


def report_load(effect: ms.ReportLoad) -> Flow[list[ms.Effect]]:
    """Best effort: the next report replaces a lost one."""
    report: JSONValue = yield MeasureLoad()
    yield StoreTxn((), (Put(effect.key, report, effect.lease_id),), purpose="load report")
    return []


def flow_of(machine: ms.Membership, effect: ms.Effect, now: Now) -> Flow[list[ms.Effect]] | None:
    """The flow of a request effect; None for the others (timers and announcements, which
    are the driver's)."""
    if isinstance(effect, ms.GrantLease):
        return grant(machine, effect, now)
    if isinstance(effect, ms.Register):
        return register(machine, effect, now)
    if isinstance(effect, ms.Renew):
        return renew(machine, effect, now)
    if isinstance(effect, ms.Campaign):
        return campaign(machine, effect, now)
    if isinstance(effect, ms.ReportLoad):
        return report_load(effect)
    return None
