"""A topic's replica set (spec/replication.md, "Configuration and where it lives"): the value
under `/cluster/replicas/<ns>/<t>` (`danube.keys.replicas_key`), and the load manager's two
pure rules over it, follower placement and promotion.

The record is one etcd value written only by compare-and-set on its `mod_revision` (the
configuration version, PacificA's): the leader's load manager writes `followers`, the topic's
owner writes `epoch`, `owner`, `in_sync` and `epochs` (spec/replication.md, "Who writes what").
It lives under `/cluster/` rather than beside the topic's own keys because every broker's
load manager already watches `/cluster/`, and the promotion rule must read `in_sync` there
on whichever broker leads when an owner dies.

A value read from the store is checked whole (`ReplicaSet.from_json`): a malformed one raises
`ReplicaSetError` (a `ValueError`), never anything else, so a reader can log and skip it; the
load manager then leaves the topic alone rather than guess its in-sync set.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from danube import keys
from danube.machines.cluster import policies
from danube.machines.cluster.load_manager_effects import SetFollowers
from danube.metadata.model import Compare, JSONValue, Op, Put

FIELDS = ("epoch", "owner", "followers", "in_sync", "epochs")


class ReplicaSetError(ValueError):
    """A replica-set value that does not read as one (the message says which field)."""


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReplicaSetError(f"replica set: {what} must be a non-negative integer, got {value!r}")
    return value


def _broker(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or "/" in value:
        raise ReplicaSetError(
            f"replica set: {what} must be a broker id (non-empty, no '/'), got {value!r}"
        )
    return value


def _brokers(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ReplicaSetError(f"replica set: {what} must be a list of broker ids, got {value!r}")
    ids = tuple(_broker(item, f"{what}[{i}]") for i, item in enumerate(value))
    if len(set(ids)) != len(ids):
        raise ReplicaSetError(f"replica set: {what} names a broker twice: {list(ids)}")
    return ids


def _epochs(value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list | tuple):
        raise ReplicaSetError(f"replica set: epochs must be a list of pairs, got {value!r}")
    pairs = []
    for i, pair in enumerate(value):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise ReplicaSetError(
                f"replica set: epochs[{i}] must be [epoch, first offset], got {pair!r}"
            )
        pairs.append((_count(pair[0], f"epochs[{i}][0]"), _count(pair[1], f"epochs[{i}][1]")))
    for (e1, o1), (e2, o2) in pairwise(pairs):
        if e2 <= e1 or o2 < o1:
            raise ReplicaSetError(
                "replica set: epochs must grow strictly with non-decreasing first offsets, "
                f"got {[list(p) for p in pairs]}"
            )
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    """The value of `/cluster/replicas/<ns>/<t>`.

    - `epoch`: the owner's claim revision (the writer epoch, also in object keys); 0 until
      the first owner records itself.
    - `owner`: the broker that last recorded itself as owner (at assignment: the assignee).
    - `followers`: assigned by the load manager; may name the owner for a moment after a
      promotion, until the leader replaces it (the owner skips itself).
    - `in_sync`: the followers that hold everything the owner acknowledged (the owner is
      not listed: it always counts). Not necessarily a subset of `followers`: a follower the
      leader replaced stays a promotion candidate until the owner shrinks it away.
    - `epochs`: `(epoch, first offset)` of every epoch's records, epochs increasing.
    """

    epoch: int
    owner: str
    followers: tuple[str, ...] = ()
    in_sync: tuple[str, ...] = ()
    epochs: tuple[tuple[int, int], ...] = ()
    sealed: bool = False
    """The owner of `epoch` handed the topic over with everything it acknowledged sealed
    and indexed (a completed unload): any broker may take it (`promotion_candidates`)."""

    def __post_init__(self) -> None:
        _count(self.epoch, "epoch")
        _broker(self.owner, "owner")
        object.__setattr__(self, "followers", _brokers(self.followers, "followers"))
        object.__setattr__(self, "in_sync", _brokers(self.in_sync, "in_sync"))
        object.__setattr__(self, "epochs", _epochs(self.epochs))
        if self.epochs and self.epochs[-1][0] > self.epoch:
            raise ReplicaSetError(
                f"replica set: epochs reach epoch {self.epochs[-1][0]} beyond epoch {self.epoch}"
            )

    @classmethod
    def from_json(cls, value: JSONValue) -> ReplicaSet:
        """Reads a stored value; `ReplicaSetError` if any field is missing or malformed.
        Unknown fields are ignored, so that a later version may add some."""
        if not isinstance(value, dict):
            raise ReplicaSetError(f"replica set: expected a JSON object, got {value!r}")
        missing = [name for name in FIELDS if name not in value]
        if missing:
            raise ReplicaSetError(f"replica set: missing field(s) {', '.join(missing)}")
        sealed = value.get("sealed", False)
        if not isinstance(sealed, bool):
            raise ReplicaSetError(f"replica set: sealed must be true or false, got {sealed!r}")
        return cls(
            value["epoch"],
            value["owner"],
            _brokers(value["followers"], "followers"),
            _brokers(value["in_sync"], "in_sync"),
            _epochs(value["epochs"]),
            sealed,
        )

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "epoch": self.epoch,
            "owner": self.owner,
            "followers": list(self.followers),
            "in_sync": list(self.in_sync),
            "epochs": [[epoch, start] for epoch, start in self.epochs],
            **({"sealed": True} if self.sealed else {}),
        }


# -- the load manager's rules ------------------------------------------------------------------


def replication_factor(configured: int | None, active: int) -> int:
    """Replicas a topic should have, the owner included: `configured`, or by default 2 when
    at least two brokers are active and 1 otherwise; never more than the active brokers
    (a follower needs a broker of its own), never less than 1."""
    wanted = configured if configured is not None else (2 if active >= 2 else 1)
    return max(1, min(wanted, active))


def place_followers(
    owner: str,
    current: Sequence[str],
    alive: Iterable[str],
    factor: int,
    ranked: Sequence[str],
    *,
    most: int | None = None,
    in_sync: Iterable[str] = (),
) -> tuple[str, ...]:
    """The followers a topic owned by `owner` should have: the current ones that are still
    `alive` and not the owner (kept, in their order: a follower that has the data is worth
    more than a less loaded one), topped up to `factor` − 1 with the first brokers of
    `ranked` (least loaded first) that are neither. More than `most` − 1 live followers (the
    factor asked for went down; `most` is that factor before the cap by active brokers, so
    a broker that is draining or just died does not make a topic drop a copy) are trimmed
    to `most` − 1, the `in_sync` ones kept first: those hold everything and may be
    promoted. A follower dropped this way stays a promotion candidate until the owner
    shrinks it out of `in_sync` (spec/replication.md, "Replication factor")."""
    alive_set = set(alive)
    kept = [f for f in current if f != owner and f in alive_set]
    if most is not None and len(kept) > most - 1:
        synced = set(in_sync)
        chosen = set(sorted(kept, key=lambda f: f not in synced)[: max(most - 1, 0)])
        kept = [f for f in kept if f in chosen]
    for broker in ranked:
        if len(kept) >= factor - 1:
            break
        if broker != owner and broker not in kept:
            kept.append(broker)
    return tuple(kept)


def promotion_candidates(record: ReplicaSet | None, alive: Iterable[str]) -> frozenset[str] | None:
    """Who may own a topic that lost its owner (spec/replication.md, "Failover"): the `alive`
    members of `in_sync` and the owner recorded last (it holds everything it acknowledged,
    also what it acknowledged alone after shrinking the set to itself), and only them (empty:
    the topic is unavailable until one returns). None, any broker, when replication is not
    running for the topic: no record, or no in-sync member and no owner that ever replicated
    (`epochs` empty: an owner records its epoch there before it acknowledges anything), or
    its owner handed it over sealed (`sealed`: everything acknowledged is indexed). An owner
    that claimed the topic but never recorded its epoch (its load failed) leaves the last
    one's entry there: the topic still waits for a broker that may hold the tail."""
    if record is None or record.sealed:
        return None
    if not record.in_sync and not record.epochs:
        return None
    return frozenset((*record.in_sync, record.owner)) & frozenset(alive)


def rebalance_target(ranked: Sequence[str], source: str, in_sync: Iterable[str]) -> str:
    """Where a rebalancing move of a topic on `source` goes (`ranked`: the active brokers,
    least loaded first, `source` among them): the least loaded member of its `in_sync` set
    that is less loaded than the source, which takes it over from its own log without
    waiting for an upload of the tail (spec/replication.md, "Moves"); else, as Danube, the
    least loaded broker other than the source."""
    synced = set(in_sync)
    lighter = ranked[: ranked.index(source)] if source in ranked else ranked
    return next(
        (b for b in lighter if b in synced),
        next(b for b in ranked if b != source),
    )


def hand_over_target(
    ranked: Sequence[str],
    source: str | None,
    wanted: str | None,
    candidates: frozenset[str] | None,
    in_sync: Iterable[str],
) -> str | None:
    """Who gets a topic handed over by `source` (an unload, a rebalance towards `wanted`, a
    drain's redirect), among the active brokers `ranked` least loaded first, restricted to
    the promotion `candidates` when the replica set names some (None: anyone, the tail is
    indexed): `wanted` if it may; else the best ranked member of `in_sync` other than the
    source (its own log holds the topic: a promotion, not a load from the object tier);
    else the best ranked broker other than the source; else the source itself, the one
    broker left (as Danube, which would otherwise strand the topic; a source that handed
    over kept its files, and loads them again)."""
    pool = [b for b in ranked if candidates is None or b in candidates]
    if wanted is not None and wanted in pool:
        return wanted
    synced = set(in_sync)
    others = [b for b in pool if b != source]
    for broker in others:
        if broker in synced:
            return broker
    if others:
        return others[0]
    return pool[0] if pool else None


# -- the load manager's writes ------------------------------------------------------------------

Seen = tuple[ReplicaSet | None, int]
"""A replica set as the load manager's view holds it: the value (None: unreadable) and its
`mod_revision`."""


def at_assignment(
    topic: str, broker: str, seen: Seen | None, followers: Sequence[str]
) -> tuple[Compare, tuple[Op, ...]]:
    """What an `Assign` of `topic` to `broker` adds: a new record (epoch 0, `broker` as
    owner, `followers`, nothing in sync) required absent; or, when there is one, the record
    required unchanged and kept as it is (a move or a failover keeps it: its `in_sync` and
    `epochs` are what the next owner starts from)."""
    key = keys.replicas_key(topic)
    if seen is None:
        record = ReplicaSet(0, broker, tuple(followers))
        return Compare(key, "version", "==", 0), (Put(key, record.to_json()),)
    return Compare(key, "mod_revision", "==", seen[1]), ()


def refollow(
    topic: str, seen: Seen | None, followers: tuple[str, ...], leader: Compare
) -> SetFollowers | None:
    """The write that gives `topic` the `followers` placement chose, or None when it has them
    already, has no record (an assignment older than replica sets: its next `Assign` creates
    one) or an unreadable one (left alone: it was logged). Compares the record's
    `mod_revision` and the leader key, so a deposed leader, or a view the owner's writes
    overtook, changes nothing."""
    if seen is None or seen[0] is None or seen[0].followers == followers:
        return None
    key = keys.replicas_key(topic)
    record = dataclasses.replace(seen[0], followers=followers)
    compare = Compare(key, "mod_revision", "==", seen[1])
    return SetFollowers(topic, followers, (leader, compare), (Put(key, record.to_json()),))


GONE: Any = object()
"""The value `ReplicaView.set` takes for a deleted key (a put of JSON null is a value)."""


class ReplicaView:
    """The load manager's view of every topic's replica set, kept from its watch of
    `/cluster/` like the rest of its view, and the topics whose followers it must look at
    again (`due`: after a record or an assignment changed, or the brokers did)."""

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}
        self.followed: Counter[str] = Counter()
        """broker → topics it follows (by the records seen), to spread new followers."""
        self.pairs: Counter[tuple[str, str]] = Counter()
        """(owner, follower) → topics of that owner it follows, by the records seen and the
        placements decided since (`planned`): a broker's followers are spread over the
        others, so that its death hands its topics to several survivors, not all to the one
        that follows them (issue 23: 233 topics loaded by one broker, 21 s)."""
        self.planned: dict[str, tuple[str, tuple[str, ...]]] = {}
        """topic → (owner, followers) placed by a decision whose record is not seen yet:
        counted in `pairs` so that a burst of assignments in one step spreads too."""
        self.due: dict[str, int] = {}
        """Topics whose followers may have to change → when to (re)decide."""
        self.factors: dict[str, int] = {}
        """Policy name (`ns` or `/ns/topic`) → its own replication factor
        (`danube.machines.cluster.policies`, from `/cluster/policies/`)."""

    def clear(self) -> None:
        self.seen.clear()
        self.followed.clear()
        self.pairs.clear()
        self.planned.clear()
        self.due.clear()
        self.factors.clear()

    def set_policy(self, name: str, value: Any, now: int) -> str | None:
        """A policy record was put (`value`) or deleted (`GONE`); returns why it is
        unreadable (it then counts as absent: the namespace's or the cluster's factor
        applies). The topics it covers are looked at again."""
        self.factors.pop(name, None)
        problem = None
        if value is not GONE:
            try:
                self.factors[name] = policies.factor_from_json(value)
            except policies.PolicyError as error:
                problem = f"{keys.cluster_policy_key(name)}: {error}"
        for topic in self.seen:
            if topic == name or policies.namespace_of(topic) == name:
                self.due[topic] = now
        return problem

    def place(
        self,
        topic: str,
        owner: str,
        current: tuple[str, ...],
        scores: dict[str, int],
        alive: Iterable[str],
        configured: int | None,
    ) -> tuple[str, ...]:
        """Followers for `topic` on `owner` (`place_followers`) at the topic's factor: its
        own, its namespace's, the cluster's `configured` or the default rule
        (`policies.resolve`), capped by the active brokers (`scores`); trimmed only to a
        factor someone asked for: the default rule only adds followers."""
        wanted, _ = policies.resolve(topic, self.factors, configured)
        factor = replication_factor(wanted, len(scores))
        seen = self.seen.get(topic)
        in_sync = seen[0].in_sync if seen is not None and seen[0] is not None else ()
        ranked = self.ranked(scores, owner)
        placed = place_followers(
            owner, current, alive, factor, ranked, most=wanted, in_sync=in_sync
        )
        self._plan(topic, owner, tuple(f for f in placed if f not in current))
        return placed

    def _plan(self, topic: str, owner: str, new: tuple[str, ...]) -> None:
        """Counts the followers a decision adds until its record is seen (`set`)."""
        self._unplan(topic)
        if new:
            self.planned[topic] = (owner, new)
            self.pairs.update((owner, f) for f in new)

    def _unplan(self, topic: str) -> None:
        old = self.planned.pop(topic, None)
        if old is not None:
            self.pairs.subtract((old[0], f) for f in old[1])

    def set(self, topic: str, value: Any, revision: int, now: int) -> str | None:
        """A record was put (`value`) or deleted (`GONE`); returns why it is unreadable."""
        old = self.seen.pop(topic, None)
        self._unplan(topic)
        if old is not None and old[0] is not None:
            self.followed.subtract(old[0].followers)
            self.pairs.subtract((old[0].owner, f) for f in old[0].followers)
        self.due[topic] = now
        if value is GONE:
            return None
        try:
            record = ReplicaSet.from_json(value)
        except ReplicaSetError as error:
            self.seen[topic] = (None, revision)
            return f"{keys.replicas_key(topic)}: {error}"
        self.seen[topic] = (record, revision)
        self.followed.update(record.followers)
        self.pairs.update((record.owner, f) for f in record.followers)
        return None

    def touch_all(self, now: int) -> None:
        """The brokers changed: any topic may have lost a follower or may get one more."""
        for topic in self.seen:
            self.due.setdefault(topic, now)

    def wake(self, now: int) -> None:
        """Everything due is due now (this broker just became leader)."""
        for topic in self.due:
            self.due[topic] = now

    def ranked(self, scores: dict[str, int], owner: str = "") -> list[str]:
        """Brokers to place followers of `owner`'s topic on, best first: by how many of
        `owner`'s topics each already follows (so that a dead owner's topics go to several
        survivors, which load them in parallel), then by score, then by topics already
        followed (a burst of assignments spreads), then by id. An owner's topics spread
        evenly over the others also spreads the followers' load as evenly as the owners'."""
        pairs = self.pairs
        return sorted(scores, key=lambda b: (pairs[(owner, b)], scores[b], self.followed[b], b))

    def promotable(
        self, topic: str, failover: bool, active: Iterable[str]
    ) -> frozenset[str] | None:
        """Who may get `topic`: anyone (None) unless it lost its owner (`failover`) and its
        record has an in-sync set (`promotion_candidates`); nobody while it is unreadable."""
        seen = self.seen.get(topic)
        if not failover or seen is None:
            return None
        return frozenset() if seen[0] is None else promotion_candidates(seen[0], active)

    def in_sync(self, topic: str) -> tuple[str, ...]:
        """The topic's recorded in-sync followers (none: no readable record)."""
        seen = self.seen.get(topic)
        return () if seen is None or seen[0] is None else seen[0].in_sync

    def unavailable(self, topic: str) -> str:
        """Why `promotable` found nobody, for the operator's log."""
        record = self.seen[topic][0]
        if record is None:
            return "unavailable: its replica set is unreadable"
        in_sync = ", ".join(record.in_sync)
        return f"unavailable and under-replicated: no in-sync replica is active ({in_sync})"
