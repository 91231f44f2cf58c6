"""Planted bugs of the cluster machines for `tests/sim/test_cluster_sim.py` (`MUTATIONS`,
switched on only by the tests), and the bugs the cluster run found in the real machines
(`FOUND_BUGS`, fixed in src/), each with the seed that showed it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock

from danube import keys as danube_keys
from danube.effects import StoreTxn, TxnAnswer
from danube.machines.cluster import admin_ops, holding, keys, ownership, ownership_flows
from danube.machines.cluster.load_manager import Assign, LoadManager
from danube.machines.cluster.membership import Campaign, Effect, Membership
from danube.machines.node import settings
from danube.machines.node.catalogue import Catalogue
from danube.machines.requests import admin as admin_flows
from danube.metadata.model import Compare
from danube.values.names import TopicName
from sim import flow_runner
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


@contextlib.contextmanager
def writes_without_claim_compare() -> Iterator[None]:
    """Fenced writes (metadata and index commits) still refuse a topic without a claim, but
    no longer compare the claim's revision: a deposed broker's late write lands."""

    def unfenced(keys: Iterable[str], claims: Mapping[str, int] | None) -> list[Compare]:
        ownership.fence_compares(keys, claims)
        return []

    with mock.patch.object(flow_runner, "fence_compares", unfenced):
        yield


@contextlib.contextmanager
def object_keys_without_epoch() -> Iterator[None]:
    """Object keys name the offsets alone again: a deposed owner's late upload replaces the
    object the new owner indexed for the same range (the loss seed 37 found)."""
    original = danube_keys.object_key

    def offsets_only(topic: TopicName, start: int, next_offset: int, epoch: int = 0) -> str:
        return original(topic, start, next_offset)

    # Patched where every key is built (the uploader calls `danube.keys.object_key`).
    with mock.patch.object(danube_keys, "object_key", offsets_only):
        yield


@contextlib.contextmanager
def claim_ignores_read_back() -> Iterator[None]:
    """The shared claim flow (`danube.machines.cluster.ownership_flows.claim`) no longer looks at
    what it read back after a refused or unanswered claim: a claim of its own that landed after
    its answer was lost reads as somebody else's, every retry's compare fails while the
    lease lives, and the topic is served by nobody."""
    original = ownership_flows.claim

    def claim(machine: Any, effect: Any, now: Any) -> Generator[Any, Any, Any]:
        inner = original(machine, effect, now)
        request = next(inner)
        while True:
            answer = yield request
            if isinstance(answer, TxnAnswer) and not answer.committed:
                answer = TxnAnswer(answer.outcome, {}, answer.revision)
            try:
                request = inner.send(answer)
            except StopIteration as stop:
                return stop.value

    with mock.patch.object(ownership_flows, "claim", claim):
        yield


@contextlib.contextmanager
def claim_answer_without_token() -> Iterator[None]:
    """`Ownership.claim_done` takes any answer for the topic's claim in flight, whatever claim
    it answers (the check of `Claim.token` dropped): the answer of a claim sent under an old
    lease, arriving after a new registration sent the new stay's claim, loads the topic under
    the old claim, whose key vanishes with the old lease."""
    original = ownership.Ownership.claim_done

    def claim_done(
        self: ownership.Ownership,
        topic: str,
        succeeded: bool,
        revision: int,
        now_ms: int,
        *,
        known: bool,
        token: int,
    ) -> list[ownership.Effect]:
        current = self.last_claim(topic)
        token = token if current is None else current
        return original(self, topic, succeeded, revision, now_ms, known=known, token=token)

    with mock.patch.object(ownership.Ownership, "claim_done", claim_done):
        yield


@contextlib.contextmanager
def hold_ignores_deadline() -> Iterator[None]:
    """`holding.hold_until` forgets `hold_ms`: a request for a topic between owners is held
    until the topic has one, however long that takes (a failover that outlasts the hold
    keeps the client waiting instead of sending it back to its retries)."""
    original = holding.hold_until

    def hold_until(
        error: Any, asked_at_ms: int, now_ms: int, hold_ms: int, **budget: int
    ) -> int | None:
        return original(error, now_ms, now_ms, hold_ms, **budget)

    with mock.patch.object(holding, "hold_until", hold_until):
        yield


DATA_MUTATIONS: dict[str, Patch] = {
    "hold_ignores_deadline": hold_ignores_deadline,
    "claim_answer_without_token": claim_answer_without_token,
    "claim_ignores_read_back": claim_ignores_read_back,
    "writes_without_claim_compare": writes_without_claim_compare,
    "object_keys_without_epoch": object_keys_without_epoch,
}
"""Planted bugs of the data planes, for the run with `--data`."""


@contextlib.contextmanager
def policy_merge_drops_a_field() -> Iterator[None]:
    """The admin flow's merge of a namespace's policies keeps only the fields asked for:
    every other field goes back to its default (`danube.machines.requests.admin`)."""

    def merged(stored: Any, changes: Mapping[str, Any]) -> dict[str, int]:
        return settings.merged_policies(None, changes)

    with mock.patch.object(admin_flows, "merged_policies", merged):
        yield


@contextlib.contextmanager
def delete_answered_before_release() -> Iterator[None]:
    """DeleteTopic's flow answers once the delete marker is posted, without waiting for the
    owner to let the topic go and purging its metadata."""
    original = admin_flows.delete_one

    def delete_one(me: str, topic: str, deadline: int, now: Callable[[], int]) -> Any:
        view = yield from admin_flows._leading(me)
        if view.marker(topic) is not None or view.owner(topic) is not None:
            step = admin_ops.delete_step(
                me, topic, view.owner(topic), view.marker(topic), view.registered()
            )
            if step.step is admin_ops.Step.POST and step.txn is not None:
                answer = yield StoreTxn(step.txn.compares, step.txn.ops, purpose=f"delete {topic}")
                if answer.committed:
                    return True
        return (yield from original(me, topic, deadline, now))

    with mock.patch.object(admin_flows, "delete_one", delete_one):
        yield


@contextlib.contextmanager
def rebalance_overshoots() -> Iterator[None]:
    """A rebalancing move no longer asks what the scores would be after it
    (`LoadManager._scores_after_move` answers nothing, so no move overshoots): with weighted
    load and a few topics a broker each, a move leaves its target heavier than its source and
    the next one moves a topic back, for ever (the rule of spec/cluster.md, "Rebalancing")."""

    def scores_after_move(self: LoadManager, *move: str) -> dict[str, int]:
        return {}

    with mock.patch.object(LoadManager, "_scores_after_move", scores_after_move):
        yield


QUIET_MUTATIONS: dict[str, Patch] = {"rebalance_overshoots": rebalance_overshoots}
"""Planted bugs that only a run going on once settled (`ClusterWorkload.quiet_s`) sees, with
the invariant (m) that the moves stop in a quiet cluster."""


MUTATIONS: dict[str, Patch] = {
    "never_fence": never_fence,
    "campaign_without_compare": campaign_without_compare,
    "assign_without_marker_compare": assign_without_marker_compare,
    "failover_skips_dead_brokers": failover_skips_dead_brokers,
    "policy_merge_drops_a_field": policy_merge_drops_a_field,
    "delete_answered_before_release": delete_answered_before_release,
}

# -- bugs the cluster run found ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FoundBug:
    seed: int
    faults: ClusterFaults
    invariant: str
    """The letter of the invariant the seed broke before the fix, with the default workload."""


DEFAULT, HEAVY = CLUSTER_PROFILES["default"], CLUSTER_PROFILES["heavy"]
FOUND_BUGS: dict[str, FoundBug] = {
    "past_incarnation_key": FoundBug(8, DEFAULT, "a"),
    "lead_again_when_unfenced": FoundBug(81, DEFAULT, "d"),
    "assign_compares_registration": FoundBug(13, DEFAULT, "e"),
    "register_with_a_new_lease": FoundBug(131, DEFAULT, "d"),
    "stopped_never_leads": FoundBug(286, HEAVY, "a"),
    "campaign_answer_of_its_lease": FoundBug(115, dataclasses.replace(HEAVY, slow=0.05), "a"),
    "assign_compares_mode": FoundBug(90, DEFAULT, "e"),
}
"""Bugs the cluster run found in the machines, each fixed in src/ with a unit test; the seed
that showed each is replayed by tests/sim/test_cluster_sim.py so that it stays fixed. Since
the operator (`sim.cluster_admin`) joined the default workload, the older seeds no longer
replay their original runs; they stay as runs that must pass. `assign_compares_mode` was found
by the operator: an Assign decided before a drain's mode write landed gave the draining broker
a topic (the Assign now compares the target's state key as seen)."""


@contextlib.contextmanager
def topic_overrides_not_stored() -> Iterator[None]:
    """SetTopicPolicies changes the owner's core and answers, but never writes the override
    to the metadata store: the topic's next owner (a move, a failover) does not know it."""
    original = Catalogue.set_topic_policies

    def set_topic_policies(self: Catalogue, topic: str, changes: Mapping[str, Any]) -> Any:
        step = original(self, topic, changes)
        return dataclasses.replace(step, effects=())

    with mock.patch.object(Catalogue, "set_topic_policies", set_topic_policies):
        yield


@contextlib.contextmanager
def topic_overrides_not_written_again() -> Iterator[None]:
    """A change of a topic's overrides whose write failed (or whose answer was lost) is
    answered UNAVAILABLE and stays in force at the owner, but the core's tick never writes
    it again (`Catalogue.overrides_to_write_again`): when the failed write never landed,
    memory and the store disagree."""

    def overrides_to_write_again(self: Catalogue, now_ms: int) -> list[Any]:
        return []

    with mock.patch.object(Catalogue, "overrides_to_write_again", overrides_to_write_again):
        yield


@contextlib.contextmanager
def admin_step_posted_at_every_poll() -> Iterator[None]:
    """An unload or deletion step answered on the leader's view is posted again at every
    poll while that view lags the store (`admin.Reposts` always lets it go)."""
    with mock.patch.object(admin_flows.Reposts, "may_post", lambda self, compares, now: True):
        yield


ADMIN_DATA_MUTATIONS: dict[str, Patch] = {
    "topic_overrides_not_stored": topic_overrides_not_stored,
    "topic_overrides_not_written_again": topic_overrides_not_written_again,
}
"""Planted bugs the operator's calls catch in a run with data planes (invariant l)."""
ADMIN_STEP_MUTATIONS: dict[str, Patch] = {
    "admin_step_posted_at_every_poll": admin_step_posted_at_every_poll,
}
"""Planted bugs of the admin flows' steps (invariant o)."""
