"""Patches of the cluster machines for `tests/sim/test_cluster_sim.py`; nothing outside the
tests can switch them on.

`MUTATIONS` are planted bugs the cluster run must catch. `PENDING_FIXES` are the other way
round: bugs the cluster run found in the real machines (each with a seed that shows it), fixed
here until the machines are, so that the sweep and the mutations run against a clean baseline.
`test_cluster_sim.py` replays each bug's seed without its fix and expects the violation; when
the machines are fixed, that test passes unexpectedly and the fix here must go.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from danube.cluster import keys
from danube.cluster.load_manager import Assign, LoadManager
from danube.cluster.membership import Campaign, Effect, Membership, Phase
from danube.metadata.model import Compare
from sim import cluster_node
from sim.cluster_faults import CLUSTER_PROFILES, ClusterFaults

Patch = Callable[[], contextlib.AbstractContextManager[None]]

# -- planted bugs ---------------------------------------------------------------------------------


@contextlib.contextmanager
def never_fence() -> Iterator[None]:
    """The membership deadline is never reached: a broker cut off from etcd goes on believing
    it is a member after its lease expired."""

    def deadline(self: Membership, sent_at_ms: int) -> int:
        return sent_at_ms + 1_000 * self.config.lease_ttl_ms

    with mock.patch.object(Membership, "_deadline", deadline):
        yield


@contextlib.contextmanager
def campaign_without_compare() -> Iterator[None]:
    """A campaign puts the leader key unconditionally instead of creating it."""
    original = Membership._maybe_campaign

    def maybe_campaign(self: Membership) -> list[Effect]:
        return [
            dataclasses.replace(e, compares=()) if isinstance(e, Campaign) else e
            for e in original(self)
        ]

    with mock.patch.object(Membership, "_maybe_campaign", maybe_campaign):
        yield


@contextlib.contextmanager
def assign_without_marker_compare() -> Iterator[None]:
    """`Assign` keeps the leader compare but not the marker's revision: a decision made again
    while the first one is still on its way assigns the topic a second time."""
    original = LoadManager._assign

    def assign(self: LoadManager, topic: str, *args: Any) -> Assign:
        effect = original(self, topic, *args)
        marker = keys.unassigned_key(topic)
        return dataclasses.replace(
            effect, compares=tuple(c for c in effect.compares if c.key != marker)
        )

    with mock.patch.object(LoadManager, "_assign", assign):
        yield


@contextlib.contextmanager
def failover_skips_dead_brokers() -> Iterator[None]:
    """Only a broker that registered again has its old assignments failed over; those of a
    broker that is gone (not registered) stay where they are."""
    original = LoadManager._check_owner

    def check_owner(self: LoadManager, broker: str, topic: str, now: int) -> None:
        if broker in self._registered:
            original(self, broker, topic, now)
        else:
            self._failing.pop((broker, topic), None)

    with mock.patch.object(LoadManager, "_check_owner", check_owner):
        yield


MUTATIONS: dict[str, Patch] = {
    "never_fence": never_fence,
    "campaign_without_compare": campaign_without_compare,
    "assign_without_marker_compare": assign_without_marker_compare,
    "failover_skips_dead_brokers": failover_skips_dead_brokers,
}

# -- fixes of bugs the cluster run found ----------------------------------------------------------


@contextlib.contextmanager
def past_incarnation_key() -> Iterator[None]:
    """The membership driver reads the leader key when its watch starts; a key naming this
    broker under another lease is a past incarnation's (a crash and a restart within the
    TTL), and the machine must not take it as its own (it leads from that read, and its
    transactions pass the leader compare, until the old lease expires and the key with it)."""
    original = cluster_node.BrokerProcess._synced

    def synced(self: cluster_node.BrokerProcess, name: str, result: Any) -> int:
        if (
            name == "leader"
            and result is not None
            and str(result.value) == self.name
            and result.lease != self.membership.lease_id
        ):
            result = dataclasses.replace(result, value=f"{self.name} (past incarnation)")
        return original(self, name, result)

    with mock.patch.object(cluster_node.BrokerProcess, "_synced", synced):
        yield


@contextlib.contextmanager
def lead_again_when_unfenced() -> Iterator[None]:
    """A leader fenced by its deadline whose lease was alive after all (its renewals landed,
    their answers did not) keeps the leader key; on the renewal that unfences it, it must lead
    again: nobody else campaigns while the key exists, so otherwise the cluster has no leader
    for as long as the broker lives. And a lost lease takes the leader key with it, so the
    machine must stop believing the key names it."""
    renewed, lease_lost = Membership.renewed, Membership.lease_lost

    def renewed_(self: Membership, lease_id: int, *, sent_at_ms: int, now_ms: int) -> list[Effect]:
        was_fenced = self.fenced
        effects = renewed(self, lease_id, sent_at_ms=sent_at_ms, now_ms=now_ms)
        if was_fenced and not self.fenced and self.leader == self.config.broker_id:
            effects = [*self.leader_seen(self.leader, now_ms), *effects]
        return effects

    def lease_lost_(self: Membership, lease_id: int, now_ms: int) -> list[Effect]:
        held = lease_id == self.lease_id and self.leader == self.config.broker_id
        effects = lease_lost(self, lease_id, now_ms)
        if held:
            self.leader = None
        return effects

    with (
        mock.patch.object(Membership, "renewed", renewed_),
        mock.patch.object(Membership, "lease_lost", lease_lost_),
    ):
        yield


@contextlib.contextmanager
def assign_compares_registration() -> Iterator[None]:
    """`Assign` also compares the target's registration with the revision the view has: a
    view that lags the store (a new leader acts on its /cluster/ watch before it has seen the
    expiry that made it leader) must not assign topics to a broker that is gone."""
    original = LoadManager._assign

    def assign(self: LoadManager, topic: str, pending: Any, broker: str, now: int) -> Assign:
        effect = original(self, topic, pending, broker, now)
        registered = self._registered[broker]
        compare = Compare(keys.register_key(broker), "mod_revision", "==", registered)
        return dataclasses.replace(effect, compares=(*effect.compares, compare))

    with mock.patch.object(LoadManager, "_assign", assign):
        yield


@contextlib.contextmanager
def register_with_a_new_lease() -> Iterator[None]:
    """A registration still failing once the granted lease's deadline passed asks for a new
    lease: retrying with the old one, which etcd has expired, fails forever."""
    original = Membership.request_failed

    def request_failed(self: Membership, now_ms: int) -> list[Effect]:
        if self.phase is Phase.REGISTERING and not self._lease_valid(now_ms):
            self.lease_id = None
            self.valid_until_ms = None
            return [*self._grant(now_ms), *self._wake(now_ms)]
        return original(self, now_ms)

    with mock.patch.object(Membership, "request_failed", request_failed):
        yield


@contextlib.contextmanager
def stopped_never_leads() -> Iterator[None]:
    """After `stop` the lease is being revoked: a campaign answered (or a leader key seen)
    afterwards must not make the stopping broker lead."""
    original = Membership.stop

    def stop(self: Membership) -> list[Effect]:
        effects = original(self)
        self.valid_until_ms = None
        return effects

    with mock.patch.object(Membership, "stop", stop):
        yield


@contextlib.contextmanager
def campaign_answer_of_its_lease() -> Iterator[None]:
    """A campaign won under a lease that has since been lost (the answer came late, after a
    new lease was granted) does not make the broker lead: its key died with that lease."""
    maybe_campaign, campaign_done = Membership._maybe_campaign, Membership.campaign_done
    leases: dict[int, int | None] = {}
    """id of the machine → lease of its campaign in flight (one at a time)."""

    def maybe_campaign_(self: Membership) -> list[Effect]:
        effects = maybe_campaign(self)
        if effects:
            leases[id(self)] = self.lease_id
        return effects

    def campaign_done_(self: Membership, won: bool, now_ms: int) -> list[Effect]:
        return campaign_done(self, won and leases.get(id(self)) == self.lease_id, now_ms)

    with (
        mock.patch.object(Membership, "_maybe_campaign", maybe_campaign_),
        mock.patch.object(Membership, "campaign_done", campaign_done_),
    ):
        yield


@dataclass(frozen=True, slots=True)
class Bug:
    fix: Patch
    seed: int
    faults: ClusterFaults
    invariant: str
    """The letter of the invariant the seed breaks without the fix (the others applied), with
    the default workload."""


DEFAULT, HEAVY = CLUSTER_PROFILES["default"], CLUSTER_PROFILES["heavy"]
PENDING_FIXES: dict[str, Bug] = {
    "past_incarnation_key": Bug(past_incarnation_key, 8, DEFAULT, "a"),
    "lead_again_when_unfenced": Bug(lead_again_when_unfenced, 81, DEFAULT, "d"),
    "assign_compares_registration": Bug(assign_compares_registration, 13, DEFAULT, "e"),
    "register_with_a_new_lease": Bug(register_with_a_new_lease, 131, DEFAULT, "d"),
    "stopped_never_leads": Bug(stopped_never_leads, 286, HEAVY, "a"),
    "campaign_answer_of_its_lease": Bug(
        campaign_answer_of_its_lease, 115, dataclasses.replace(HEAVY, slow=0.05), "a"
    ),
}


@contextlib.contextmanager
def pending_fixes(*, without: str | None = None) -> Iterator[None]:
    """Every pending fix but `without`."""
    with contextlib.ExitStack() as stack:
        for name, bug in PENDING_FIXES.items():
            if name != without:
                stack.enter_context(bug.fix())
        yield
