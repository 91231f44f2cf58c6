"""The membership machine: registration under a lease, renewal, self-fencing by the lease
deadline, and leader election by compare-and-create. Examples of each rule, then a
randomised run of several members against a model store with message delays and losses that
checks the two safety properties of spec/cluster.md: an unfenced broker's lease is alive in
the store, and at most one broker believes it leads."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.effects import Outcome, StoreTxn, TxnAnswer
from danube.machines.cluster import membership_flows
from danube.machines.cluster.keys import LEADER_KEY, register_key
from danube.machines.cluster.membership import (
    Campaign,
    Effect,
    Fenced,
    GrantLease,
    LeadershipGained,
    LeadershipLost,
    Membership,
    MembershipConfig,
    Phase,
    Register,
    Renew,
    ReportLoad,
    Unfenced,
    WakeAt,
)
from danube.metadata.model import Compare, Put

CONFIG = MembershipConfig(
    "b1",
    {"broker_url": "http://127.0.0.1:6650"},
    lease_ttl_ms=10_000,
    renew_interval_ms=2_000,
    drift_ms=1_000,
    retry_ms=500,
    load_report_interval_ms=30_000,
)


def of(effects: list[Effect], kind: type) -> list[Effect]:
    return [e for e in effects if isinstance(e, kind)]


def member(now: int = 0, lease: int = 7) -> tuple[Membership, list[Effect]]:
    """A member that has registered at `now` with lease `lease` (granted as sent at `now`)."""
    m = Membership(CONFIG)
    assert m.start(now) == [GrantLease(10.0, now)]
    effects = m.lease_granted(lease, sent_at_ms=now, now_ms=now)
    (register,) = of(effects, Register)
    assert isinstance(register, Register)
    assert register.ops[0] == Put(register_key("b1"), {"broker_url": "http://127.0.0.1:6650"}, 7)
    return m, m.registered(lease, now)


def test_the_registration_flow_records_the_registration_revision() -> None:
    """Ownership claims no assignment older than it (heavy seed 162, spec/replication.md)."""
    m = Membership(CONFIG)
    m.start(0)
    (register,) = of(m.lease_granted(7, sent_at_ms=0, now_ms=0), Register)
    assert isinstance(register, Register)
    flow = membership_flows.register(m, register, lambda: 0)
    assert isinstance(next(flow), StoreTxn)
    with pytest.raises(StopIteration) as done:
        flow.send(TxnAnswer(Outcome.COMMITTED, revision=42))
    assert of(done.value.value, Unfenced) and m.registered_revision == 42


def test_registration_unfences_campaigns_and_reports_load() -> None:
    m, effects = member()
    assert m.phase is Phase.MEMBER and not m.fenced
    assert of(effects, Unfenced) == [Unfenced()]
    assert of(effects, Campaign) == [
        Campaign(7, (Compare(LEADER_KEY, "version", "==", 0),), (Put(LEADER_KEY, "b1", 7),))
    ]
    assert of(effects, ReportLoad) == [ReportLoad("/cluster/load/b1", 7)]
    assert of(effects, WakeAt) == [WakeAt(2_000)]


def test_renewals_are_due_every_interval_and_only_one_at_a_time() -> None:
    m, _ = member()
    assert of(m.tick(1_999), Renew) == []
    assert of(m.tick(2_000), Renew) == [Renew(7, 2_000)]
    assert of(m.tick(4_500), Renew) == []  # the first has not been answered
    m.renewed(7, sent_at_ms=2_000, now_ms=4_600)
    assert of(m.tick(4_600), Renew) == [Renew(7, 4_600)]


def test_unanswered_renewals_fence_the_broker_at_sent_plus_ttl_minus_drift() -> None:
    m, _ = member()
    m.tick(2_000)
    assert of(m.renew_failed(7, 2_100), WakeAt) == [WakeAt(2_600)]  # retried soon
    assert of(m.tick(2_600), Renew) == [Renew(7, 2_600)]
    m.tick(8_999)
    assert not m.fenced
    assert of(m.tick(9_000), Fenced) == [Fenced("lease not renewed in time")]
    assert m.fenced


def test_a_leader_that_cannot_renew_gives_up_leadership_before_its_lease_can_expire() -> None:
    m, _ = member()
    assert m.campaign_done(7, True, 10) == [LeadershipGained(), WakeAt(2_000)]
    reason = "lease not renewed in time"
    assert m.tick(9_000)[:2] == [LeadershipLost(reason), Fenced(reason)]
    assert not m.leading


def test_a_late_renewal_of_a_live_lease_unfences() -> None:
    m, _ = member()
    m.tick(2_000)
    m.tick(9_000)
    assert m.fenced
    effects = m.renewed(7, sent_at_ms=8_500, now_ms=9_100)
    assert of(effects, Unfenced) == [Unfenced()]
    assert m.valid_until_ms == 17_500


def test_a_renewal_answered_after_its_own_deadline_does_not_unfence() -> None:
    m, _ = member()
    m.tick(2_000)
    m.tick(9_000)
    assert of(m.renewed(7, sent_at_ms=2_000, now_ms=11_000), Unfenced) == []
    assert m.fenced


def test_a_lost_lease_fences_and_starts_over_with_a_new_one() -> None:
    m, _ = member()
    m.campaign_done(7, True, 10)
    effects = m.lease_lost(7, 3_000)
    assert effects == [
        LeadershipLost("lease expired"),
        Fenced("lease expired"),
        GrantLease(10.0, 3_000),
    ]
    assert m.lease_id is None
    m.lease_granted(8, sent_at_ms=3_000, now_ms=3_050)
    assert of(m.registered(8, 3_100), Unfenced) == [Unfenced()]


def test_answers_about_an_old_lease_are_ignored() -> None:
    m, _ = member()
    m.lease_lost(7, 3_000)
    m.lease_granted(8, sent_at_ms=3_000, now_ms=3_050)
    assert m.renewed(7, sent_at_ms=3_000, now_ms=3_060) == []
    assert m.registered(7, 3_070) == []
    assert m.phase is Phase.REGISTERING


def test_a_seen_leader_stops_campaigns_and_its_disappearance_starts_one() -> None:
    m, _ = member()
    m.campaign_done(7, False, 10)
    assert of(m.leader_seen("b2", 20), Campaign) == []
    assert of(m.tick(600), Campaign) == []
    assert of(m.leader_seen(None, 700), Campaign) != []
    assert of(m.leader_seen(None, 710), Campaign) == []  # one campaign at a time


def test_a_lost_campaign_with_no_leader_seen_is_retried() -> None:
    m, _ = member()
    m.campaign_done(7, False, 10)
    assert of(m.tick(509), Campaign) == []
    assert of(m.tick(510), Campaign) != []


def test_leadership_ends_when_the_watch_shows_the_key_gone_or_replaced() -> None:
    m, _ = member()
    m.campaign_done(7, True, 10)
    assert of(m.leader_seen("b1", 20), LeadershipLost) == []
    assert of(m.leader_seen("b2", 30), LeadershipLost) == [LeadershipLost("replaced")]
    m2, _ = member()
    m2.campaign_done(7, True, 10)
    assert of(m2.leader_seen(None, 30), LeadershipLost) == [LeadershipLost("leader key gone")]


def test_a_fenced_broker_neither_campaigns_nor_takes_a_won_campaign() -> None:
    """The registration's campaign is answered (lost: b2 leads) before the fence, so the
    leader key vanishing afterwards would start a campaign, if fencing did not stop it."""
    m, _ = member()
    m.campaign_done(7, False, 10)
    m.leader_seen("b2", 20)
    m.tick(2_000)
    m.tick(9_000)
    assert m.fenced
    assert of(m.leader_seen(None, 9_001), Campaign) == []
    assert of(m.campaign_done(7, True, 9_002), LeadershipGained) == []
    assert not m.leading


def test_an_unfenced_member_campaigns_when_the_leader_key_vanishes() -> None:
    """The twin of the test above, so that its first refusal is fencing's doing."""
    m, _ = member()
    m.campaign_done(7, False, 10)
    m.leader_seen("b2", 20)
    assert of(m.leader_seen(None, 30), Campaign) != []


def test_stop_gives_up_leadership_and_silences_the_machine() -> None:
    m, _ = member()
    m.campaign_done(7, True, 10)
    assert m.stop() == [Fenced("stopping"), LeadershipLost("stopping")]
    assert m.tick(100_000) == []


def test_a_stopping_broker_is_fenced_before_its_lease_is_revoked() -> None:
    """The revoke deletes its claims at once: nothing may be acknowledged after it (a
    seed of the replicated cluster run acknowledged a publish 0.5 ms after its revoke)."""
    m, _ = member()
    assert m.stop() == [Fenced("stopping")]
    assert m.stop() == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"broker_id": ""}, "broker_id"),
        ({"lease_ttl_ms": 500}, "lease_ttl_ms"),
        ({"drift_ms": 10_000}, "drift_ms"),
        ({"renew_interval_ms": 9_500}, "renew_interval_ms"),
    ],
)
def test_bad_settings_are_refused(changes: dict[str, object], message: str) -> None:
    settings_ = {
        "broker_id": "b1",
        "registration": {},
        "lease_ttl_ms": 10_000,
        "drift_ms": 1_000,
        "renew_interval_ms": 2_000,
    } | changes
    with pytest.raises(ValueError, match=message):
        MembershipConfig(**settings_)  # type: ignore[arg-type]


# A model store and network ----------------------------------------------------------------


@dataclass
class ModelStore:
    """Leases expire `ttl` after the store last saw a grant or renewal; keys put with a
    lease vanish with it. Enough of etcd for membership."""

    now: int = 0
    leases: dict[int, int] = field(default_factory=dict)  # id -> expiry
    keys: dict[str, tuple[object, int | None]] = field(default_factory=dict)
    next_lease: int = 1

    def expire(self) -> list[int]:
        dead = sorted(i for i, deadline in self.leases.items() if deadline <= self.now)
        for lease in dead:
            del self.leases[lease]
            for key in [k for k, (_, owner) in self.keys.items() if owner == lease]:
                del self.keys[key]
        return dead

    def alive(self, lease: int | None) -> bool:
        return lease in self.leases

    def leader(self) -> object:
        entry = self.keys.get(LEADER_KEY)
        return None if entry is None else entry[0]


@dataclass
class Cluster:
    rng: random.Random
    loss: float
    store: ModelStore = field(default_factory=ModelStore)
    queue: list[tuple[int, int, Callable[[], None]]] = field(default_factory=list)
    members: list[Membership] = field(default_factory=list)
    seq: int = 0

    def at(self, when: int, action: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (when, self.seq, action))

    def hop(self) -> int:
        return self.rng.randint(1, 1_500)

    def execute(self, m: Membership, effects: list[Effect]) -> None:
        for effect in effects:
            self._execute(m, effect)

    def _request(self, m: Membership, handle: Callable[[], Callable[[], list[Effect]] | None],
                 lost: Callable[[], list[Effect]] | None) -> None:  # fmt: skip
        """The request reaches the store after a hop (or is lost); its answer comes back
        after another hop (or is lost, and the member hears `lost` if it has a timeout)."""
        now = self.store.now
        if self.rng.random() < self.loss:
            if lost is not None:
                self.at(now + 3_000, lambda: self.execute(m, lost()))
            return

        def arrive() -> None:
            answer = handle()
            if answer is None:
                return
            if self.rng.random() < self.loss:
                if lost is not None:
                    self.at(self.store.now + 3_000, lambda: self.execute(m, lost()))
                return
            self.at(self.store.now + self.hop(), lambda: self.execute(m, answer()))

        self.at(now + self.hop(), arrive)

    def _execute(self, m: Membership, effect: Effect) -> None:
        s = self.store
        if isinstance(effect, GrantLease):
            sent = effect.sent_at_ms

            def grant() -> Callable[[], list[Effect]]:
                lease = s.next_lease
                s.next_lease += 1
                s.leases[lease] = s.now + int(effect.ttl_s * 1000)
                return lambda: m.lease_granted(lease, sent_at_ms=sent, now_ms=s.now)

            self._request(m, grant, lambda: m.request_failed(s.now))
        elif isinstance(effect, Register):
            reg = effect

            def register() -> Callable[[], list[Effect]]:
                if not s.alive(reg.lease_id):
                    return lambda: m.request_failed(s.now)
                for op in reg.ops:
                    assert isinstance(op, Put)
                    s.keys[op.key] = (op.value, op.lease)
                return lambda: m.registered(reg.lease_id, s.now)

            self._request(m, register, lambda: m.request_failed(s.now))
        elif isinstance(effect, Renew):
            renew = effect

            def keepalive() -> Callable[[], list[Effect]]:
                if not s.alive(renew.lease_id):
                    return lambda: m.lease_lost(renew.lease_id, s.now)
                s.leases[renew.lease_id] = s.now + CONFIG.lease_ttl_ms
                return lambda: m.renewed(renew.lease_id, sent_at_ms=renew.sent_at_ms,
                                         now_ms=s.now)  # fmt: skip

            self._request(m, keepalive, lambda: m.renew_failed(renew.lease_id, s.now))
        elif isinstance(effect, Campaign):
            campaign = effect

            def run() -> Callable[[], list[Effect]]:
                won = LEADER_KEY not in s.keys and s.alive(campaign.lease_id)
                if won:
                    s.keys[LEADER_KEY] = (m.config.broker_id, campaign.lease_id)
                    self.notify_leader()
                return lambda: m.campaign_done(campaign.lease_id, won, s.now)

            self._request(m, run, lambda: m.campaign_done(campaign.lease_id, False, s.now))
        elif isinstance(effect, WakeAt):
            self.at(effect.at_ms, lambda: self.execute(m, m.tick(s.now)))

    def notify_leader(self) -> None:
        """The watch: each member hears the leader key's value as it is when the event
        arrives (watch events are delivered in order, so the last one wins)."""
        for m in self.members:
            self.at(
                self.store.now + self.hop(),
                lambda m=m: self.execute(m, m.leader_seen(self.store.leader(), self.store.now)),
            )

    def check(self) -> None:
        s = self.store
        for m in self.members:
            if not m.fenced:
                assert s.alive(m.lease_id), f"{m.config.broker_id} unfenced on a dead lease"
        leaders = [m.config.broker_id for m in self.members if m.leading]
        assert len(leaders) <= 1, f"two leaders at {s.now}: {leaders}"
        for name in leaders:
            assert s.leader() == name, f"{name} leads but the store says {s.leader()}"

    def run(self, until: int) -> None:
        while self.queue and self.queue[0][0] <= until:
            when, _, action = heapq.heappop(self.queue)
            self.store.now = max(self.store.now, when)
            if self.store.expire():
                self.notify_leader()
            self.check()
            action()
            self.check()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), loss=st.sampled_from([0.0, 0.05, 0.3]))
def test_unfenced_means_alive_and_there_is_at_most_one_leader(seed: int, loss: float) -> None:
    cluster = Cluster(random.Random(seed), loss)
    for name in ("b1", "b2", "b3"):
        m = Membership(
            MembershipConfig(
                name, {}, lease_ttl_ms=10_000, renew_interval_ms=2_000, drift_ms=1_000,
                retry_ms=500,
            )
        )  # fmt: skip
        cluster.members.append(m)
        cluster.at(cluster.rng.randint(0, 1_000), lambda m=m: cluster.execute(m, m.start(0)))
    cluster.run(120_000)
    if loss == 0.0:
        # With no losses, hops of at most 1.5 s and renewals every 2 s nobody is fenced for
        # good: everyone is a member and somebody leads.
        assert all(not m.fenced for m in cluster.members)
        assert sum(m.leading for m in cluster.members) == 1


# Bugs the cluster simulator found (tests/sim/cluster_mutations.py, FOUND_BUGS) --------------


def test_a_leader_key_of_a_past_incarnation_is_not_ours() -> None:
    m, _ = member()
    m.campaign_done(7, False, 15)  # the key exists: the campaign at registration lost
    effects = m.leader_seen("b1", 20, lease=3)  # our id, another lease: before a restart
    assert of(effects, LeadershipGained) == [] and of(effects, Campaign) == []
    assert not m.leading
    assert of(m.leader_seen(None, 30), Campaign) != []  # it expired: campaign


def test_a_leader_fenced_while_its_lease_lived_leads_again_when_unfenced() -> None:
    m, _ = member()
    m.campaign_done(7, True, 10)
    m.tick(2_000)
    m.tick(9_000)
    assert m.fenced and not m.leading
    effects = m.renewed(7, sent_at_ms=8_900, now_ms=9_100)
    assert of(effects, LeadershipGained) == [LeadershipGained()]
    assert m.leading


def test_a_lost_lease_takes_the_leader_key_with_it() -> None:
    m, _ = member()
    m.campaign_done(7, True, 10)
    m.lease_lost(7, 3_000)
    assert m.leader is None


def test_a_registration_failing_past_the_lease_deadline_asks_for_a_new_lease() -> None:
    m = Membership(CONFIG)
    m.start(0)
    m.lease_granted(7, sent_at_ms=0, now_ms=0)
    assert of(m.request_failed(100), GrantLease) == []  # the lease is still good: retry
    assert of(m.request_failed(9_000), GrantLease) == [GrantLease(10.0, 9_000)]
    assert m.lease_id is None and m.phase is Phase.GRANTING


def test_a_stopping_broker_never_leads() -> None:
    m, _ = member()
    m.stop()
    assert of(m.campaign_done(7, True, 20), LeadershipGained) == []
    assert of(m.leader_seen("b1", 30), LeadershipGained) == []
    assert not m.leading


def test_a_campaign_won_under_a_lost_lease_is_no_win() -> None:
    m, _ = member()
    m.lease_lost(7, 100)
    m.lease_granted(8, sent_at_ms=100, now_ms=150)
    m.registered(8, 200)
    assert of(m.campaign_done(7, True, 300), LeadershipGained) == []
    assert not m.leading
