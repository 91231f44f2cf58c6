"""One broker's membership of a cluster, as a pure state machine (spec/cluster.md,
"Registration and leader election").

A broker is a member while a metadata lease it holds is alive: its registration
(`/cluster/register/<id>`) and, while it leads, the leader key (`/cluster/leader`) are put
with that lease, so both vanish when the broker stops renewing it. The machine decides when to
grant, register, renew, campaign and report load; the driver runs those requests against the
metadata store and reports each outcome back. Every input takes the monotonic clock in
milliseconds.

**Self-fencing.** The store expires a lease no earlier than `ttl` after it last saw a renewal,
and it saw that renewal after the broker sent it. So a renewal sent at `t` and answered OK
keeps the lease alive at least until `t + ttl` on the broker's own clock, less what the two
clocks can drift apart over `ttl` (`drift_ms`). Past that deadline the broker can no longer
know that it is a member: another broker may have been given its topics. It emits `Fenced`
(the driver stops acknowledging on every topic it owns and gives up leadership) and stays
fenced until a renewal proves the same lease alive again, or a new lease is granted and the
broker registers again (its topics were failed over by then; it starts empty).

**Leadership.** The leader key is created with compare-and-create (`version == 0`) under the
broker's lease, so at most one broker holds it at a time in the store's history, and it
disappears with its holder's lease. A broker campaigns whenever it sees no leader and it is
registered and unfenced, and leads from the moment its campaign succeeds until it is fenced or
the watch shows the key gone or held by another. Every write a leader makes also compares the
leader key with its id (`records.leader_compare`), so a leader that lost its lease without noticing
cannot write: the key is gone or someone else's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from danube.keys import LEADER_KEY, load_key, register_key, state_key
from danube.metadata.model import Compare, Op, Put

PAST_INCARNATION = "(a past incarnation of this broker)"
"""What the machine records as the leader when the key names this broker under another lease."""


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    broker_id: str
    registration: Mapping[str, Any]
    """The JSON of `/cluster/register/<id>`: broker_url, connect_url, admin_addr (Danube's)."""
    lease_ttl_ms: int = 10_000
    """Danube uses 32 s; a shorter lease is a faster failover. etcd rounds up to seconds."""
    renew_interval_ms: int = 2_000
    drift_ms: int = 1_000
    """Clock drift allowed between broker and store over one TTL (self-fencing margin)."""
    retry_ms: int = 500
    """Delay before a failed grant, registration or campaign is tried again."""
    load_report_interval_ms: int = 30_000

    def __post_init__(self) -> None:
        if not self.broker_id:
            raise ValueError("broker_id must not be empty")
        if self.lease_ttl_ms < 1_000:
            raise ValueError(f"lease_ttl_ms must be at least 1000, got {self.lease_ttl_ms}")
        if not 0 <= self.drift_ms < self.lease_ttl_ms:
            raise ValueError("drift_ms must be at least 0 and below lease_ttl_ms")
        if not 0 < self.renew_interval_ms < self.lease_ttl_ms - self.drift_ms:
            raise ValueError(
                "renew_interval_ms must be positive and below lease_ttl_ms - drift_ms, "
                "or the broker fences itself between two renewals"
            )
        if self.retry_ms <= 0 or self.load_report_interval_ms <= 0:
            raise ValueError("retry_ms and load_report_interval_ms must be positive")

    @property
    def lease_ttl_s(self) -> float:
        return self.lease_ttl_ms / 1000


# Effects -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrantLease:
    """Answer with `lease_granted(id, sent_at_ms=sent_at_ms)` or `request_failed`."""

    ttl_s: float
    sent_at_ms: int


@dataclass(frozen=True, slots=True)
class Register:
    """Run `ops` as one transaction; answer `registered(lease_id, revision=...)` (the
    transaction's revision) or `request_failed`."""

    lease_id: int
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Renew:
    """Keep the lease alive; answer `renewed(sent_at_ms)`, `lease_lost` (the store says it
    is gone) or `renew_failed` (no answer: the store was not reached)."""

    lease_id: int
    sent_at_ms: int


@dataclass(frozen=True, slots=True)
class Campaign:
    """One transaction: if every compare holds run `ops`; answer `campaign_done(won)`."""

    lease_id: int
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class ReportLoad:
    """Put this broker's load report at `key` with the lease."""

    key: str
    lease_id: int


@dataclass(frozen=True, slots=True)
class Fenced:
    """Stop acknowledging on every owned topic: membership can no longer be proven."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unfenced:
    """A renewal proved the same lease alive: owned topics may serve again."""


@dataclass(frozen=True, slots=True)
class LeadershipGained:
    pass


@dataclass(frozen=True, slots=True)
class LeadershipLost:
    reason: str


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Call `tick` at this time (the latest WakeAt replaces earlier ones)."""

    at_ms: int


Effect = (
    GrantLease
    | Register
    | Renew
    | Campaign
    | ReportLoad
    | Fenced
    | Unfenced
    | LeadershipGained
    | LeadershipLost
    | WakeAt
)


class Phase(enum.Enum):
    NO_LEASE = "no_lease"
    GRANTING = "granting"
    REGISTERING = "registering"
    MEMBER = "member"
    STOPPED = "stopped"


@dataclass(slots=True)
class _Timers:
    retry_at: int | None = None
    renew_at: int | None = None
    report_at: int | None = None


@dataclass(slots=True)
class Membership:
    config: MembershipConfig
    phase: Phase = Phase.NO_LEASE
    lease_id: int | None = None
    valid_until_ms: int | None = None
    """Local deadline up to which the lease is known to be alive (see self-fencing)."""
    registered_revision: int = 0
    """The store's revision of this lease's registration: assignments older than it belong to
    a past incarnation, which ownership must not claim (`Ownership.member`)."""
    fenced: bool = True
    leader: str | None = None
    """The leader as last seen by the watch (None: no leader key)."""
    leading: bool = False
    _campaigning: bool = False
    _timers: _Timers = field(default_factory=_Timers)

    # Inputs ----------------------------------------------------------------------------------

    def start(self, now_ms: int) -> list[Effect]:
        return self._grant(now_ms)

    def lease_granted(self, lease_id: int, *, sent_at_ms: int, now_ms: int) -> list[Effect]:
        if self.phase is not Phase.GRANTING:
            return []
        self.lease_id = lease_id
        self.valid_until_ms = self._deadline(sent_at_ms)
        self.phase = Phase.REGISTERING
        return [*self._register(), *self._wake(now_ms)]

    def registered(self, lease_id: int, now_ms: int, *, revision: int = 0) -> list[Effect]:
        if self.phase is not Phase.REGISTERING or lease_id != self.lease_id:
            return []
        self.phase = Phase.MEMBER
        self.registered_revision = revision
        self._timers.renew_at = now_ms + self.config.renew_interval_ms
        self._timers.report_at = now_ms
        effects: list[Effect] = []
        if self._lease_valid(now_ms):
            self.fenced = False
            effects.append(Unfenced())
        effects += self._maybe_campaign()
        return [*effects, *self.tick(now_ms)]

    def request_failed(self, now_ms: int) -> list[Effect]:
        """A grant or registration was not answered or refused: try again shortly."""
        if self.phase is Phase.GRANTING:
            self.phase = Phase.NO_LEASE
        if self.phase is Phase.REGISTERING and not self._lease_valid(now_ms):
            # The store may have expired the lease meanwhile: registering with it would fail
            # forever. Start over with a new one.
            self.lease_id = None
            self.valid_until_ms = None
            return [*self._grant(now_ms), *self._wake(now_ms)]
        if self.phase in (Phase.NO_LEASE, Phase.REGISTERING):
            self._timers.retry_at = now_ms + self.config.retry_ms
        return self._wake(now_ms)

    def renewed(self, lease_id: int, *, sent_at_ms: int, now_ms: int) -> list[Effect]:
        if lease_id != self.lease_id or self.phase is not Phase.MEMBER:
            return []
        self._timers.renew_at = max(now_ms, sent_at_ms + self.config.renew_interval_ms)
        deadline = self._deadline(sent_at_ms)
        self.valid_until_ms = max(self.valid_until_ms or deadline, deadline)
        effects: list[Effect] = []
        if self.fenced and self._lease_valid(now_ms):
            self.fenced = False
            effects.append(Unfenced())
            if self.leader == self.config.broker_id:
                # Fenced by the deadline while the renewals did land: the lease, and the
                # leader key under it, lived on. Nobody else campaigns while the key exists,
                # so this broker must lead again or the cluster has no leader.
                self.leading = True
                effects.append(LeadershipGained())
            effects += self._maybe_campaign()
        return [*effects, *self._wake(now_ms)]

    def renew_failed(self, lease_id: int, now_ms: int) -> list[Effect]:
        if lease_id != self.lease_id:
            return []
        self._timers.renew_at = now_ms + self.config.retry_ms
        return self.tick(now_ms)

    def lease_lost(self, lease_id: int, now_ms: int) -> list[Effect]:
        """The store no longer knows the lease: every key put with it is gone."""
        if lease_id != self.lease_id or self.phase is Phase.STOPPED:
            return []
        effects = self._fence("lease expired")
        if self.leader == self.config.broker_id:
            self.leader = None  # the leader key died with the lease
        self.lease_id = None
        self.valid_until_ms = None
        self._timers = _Timers()
        return [*effects, *self._grant(now_ms)]

    def leader_seen(
        self, leader: str | None, now_ms: int, *, lease: int | None = None
    ) -> list[Effect]:
        """The watch of the leader key (its value when the watch started, then each change),
        with the `lease` it was put with. A key naming this broker under another lease is a
        past incarnation's (a crash and a restart within the TTL, or that incarnation's
        campaign landing after the restart): it is somebody else's until it expires, never a
        reason to lead."""
        if leader == self.config.broker_id and lease is not None and lease != self.lease_id:
            leader = PAST_INCARNATION
        self.leader = leader
        effects: list[Effect] = []
        if self.leading and leader != self.config.broker_id:
            self.leading = False
            effects.append(LeadershipLost("leader key gone" if leader is None else "replaced"))
        elif not self.leading and leader == self.config.broker_id and self._lease_valid(now_ms):
            # Our own key, seen before the campaign's answer (or after a restart of the
            # watch): the store says we lead.
            self.leading = True
            effects.append(LeadershipGained())
        return [*effects, *self._maybe_campaign()]

    def campaign_done(self, lease_id: int, won: bool, now_ms: int) -> list[Effect]:
        """The answer to the `Campaign` made under `lease_id`: a win under a lease since lost
        (the answer came late) is no win, its key died with that lease."""
        self._campaigning = False
        effects: list[Effect] = []
        won = won and lease_id == self.lease_id
        if won and not self.leading and self._lease_valid(now_ms) and not self.fenced:
            self.leading = True
            self.leader = self.config.broker_id
            effects.append(LeadershipGained())
        elif not won and self.leader is None:
            self._timers.retry_at = now_ms + self.config.retry_ms
        return [*effects, *self._wake(now_ms)]

    def tick(self, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        timers = self._timers
        if self.phase is Phase.STOPPED:
            return []
        if not self.fenced and not self._lease_valid(now_ms):
            effects += self._fence("lease not renewed in time")
        if timers.retry_at is not None and now_ms >= timers.retry_at:
            timers.retry_at = None
            if self.phase is Phase.NO_LEASE:
                effects += self._grant(now_ms)
            elif self.phase is Phase.REGISTERING:
                effects += self._register()
            else:
                effects += self._maybe_campaign()
        if self.phase is Phase.MEMBER and timers.renew_at is not None and now_ms >= timers.renew_at:
            assert self.lease_id is not None
            timers.renew_at = None  # until the renewal is answered
            effects.append(Renew(self.lease_id, now_ms))
        if (
            self.phase is Phase.MEMBER
            and not self.fenced
            and timers.report_at is not None
            and now_ms >= timers.report_at
        ):
            assert self.lease_id is not None
            timers.report_at = now_ms + self.config.load_report_interval_ms
            effects.append(ReportLoad(load_key(self.config.broker_id), self.lease_id))
        return [*effects, *self._wake(now_ms)]

    def stop(self) -> list[Effect]:
        """A graceful stop: the driver revokes the lease after this. Fenced first: the
        revoke deletes the broker's claims at once, and an owner that went on acknowledging
        would do so under a claim etcd no longer holds (invariant r2, spec/replication.md)."""
        effects: list[Effect] = []
        if not self.fenced:
            self.fenced = True
            effects.append(Fenced("stopping"))
        if self.leading:
            self.leading = False
            effects.append(LeadershipLost("stopping"))
        self.phase = Phase.STOPPED
        self.valid_until_ms = None  # being revoked: no late answer may make it lead
        return effects

    # Rules -----------------------------------------------------------------------------------

    def _deadline(self, sent_at_ms: int) -> int:
        return sent_at_ms + self.config.lease_ttl_ms - self.config.drift_ms

    def _lease_valid(self, now_ms: int) -> bool:
        return self.valid_until_ms is not None and now_ms < self.valid_until_ms

    def _grant(self, now_ms: int) -> list[Effect]:
        self.phase = Phase.GRANTING
        return [GrantLease(self.config.lease_ttl_s, now_ms)]

    def _register(self) -> list[Effect]:
        assert self.lease_id is not None
        broker_id = self.config.broker_id
        return [
            Register(
                self.lease_id,
                (
                    Put(register_key(broker_id), dict(self.config.registration), self.lease_id),
                    Put(state_key(broker_id), {"mode": "active", "reason": "boot"}),
                ),
            )
        ]

    def _maybe_campaign(self) -> list[Effect]:
        if (
            self.phase is not Phase.MEMBER
            or self.fenced
            or self.leading
            or self.leader is not None
            or self._campaigning
        ):
            return []
        assert self.lease_id is not None
        self._campaigning = True
        return [
            Campaign(
                self.lease_id,
                (Compare(LEADER_KEY, "version", "==", 0),),
                (Put(LEADER_KEY, self.config.broker_id, self.lease_id),),
            )
        ]

    def _fence(self, reason: str) -> list[Effect]:
        effects: list[Effect] = []
        if self.leading:
            self.leading = False
            effects.append(LeadershipLost(reason))
        if not self.fenced:
            self.fenced = True
            effects.append(Fenced(reason))
        return effects

    def _wake(self, now_ms: int) -> list[Effect]:
        """The earliest moment something is due: a timer, or the self-fencing deadline."""
        timers = self._timers
        candidates = [t for t in (timers.retry_at, timers.renew_at) if t is not None]
        if not self.fenced and timers.report_at is not None:
            candidates.append(timers.report_at)
        if not self.fenced and self.valid_until_ms is not None:
            candidates.append(self.valid_until_ms)
        if self.phase is Phase.STOPPED or not candidates:
            return []
        return [WakeAt(max(now_ms, min(candidates)))]
