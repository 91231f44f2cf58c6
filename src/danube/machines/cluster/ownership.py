"""The broker side of topic ownership, as a pure state machine (spec/cluster.md, "Ownership
fencing" and "Topic moves").

The load manager decides which broker a topic belongs to; this machine decides what the broker
does about it. It sees its own assignments (`/cluster/brokers/<me>/<ns>/<topic>`) and the
unassigned markers, and for each topic:

- **assigned** → claim the topic (`Claim`): put `/topics/<ns>/<topic>/owner` under the broker's
  lease by compare-and-create (a claim found there that is this broker's own under the same
  lease, `own_claim`, is one whose answer was lost: it counts as done). The claim's revision
  is the fencing token of every write the broker later makes for the topic beyond its own
  disk (`Load` carries it). The previous
  owner's claim is gone by then: it deleted it when it unloaded, or it vanished with its lease
  on a failover. A claim that finds another broker's claim is retried after `retry_ms` while
  the topic is still assigned here; once it is not, the topic takes the release path.
- **claimed** → load it (`Load`); the driver answers `loaded` or `load_failed`.
- **assignment deleted** → unload it (`Unload`: stop accepting publishes, seal a reliable
  topic), then release it (`Release`): delete the claim, compared on its revision, and, if the
  leader posted a not-ready marker naming this broker, rewrite it `ready: true` in the same
  transaction, compared on the marker's revision. A marker that shows up only after the unload
  finished is marked ready when it shows up. When the marker is a `delete` naming this
  broker, the unload says so (`Unload.deleted`): the topic is dropped with its WAL, not
  sealed, and the admin's DeleteTopic removes its metadata and objects after the release.
- **restart** (the core stopped a served replicated topic after a repair rewound its log
  below what its followers may hold) → unload it, keeping its files, release it without
  marking the replica set sealed, and claim it again as a new stay while it is assigned
  here: the new claim revision is a new epoch (spec/replication.md, "A repair that
  rewinds").
- **a new lease** (the old one expired: the leader failed every topic over) → every topic is
  dropped at once (`Drop`, no seal: the claims died with the lease and another broker may own
  the topic already), and the assignments still in the view are claimed afresh.

One topic is in one phase at a time; an assignment deleted while the topic is still being
loaded, or once it is claimed, is unloaded as soon as the load answers (a claimed topic is
loaded first: its WAL may hold what no object holds yet; only a topic being deleted, or
whose load failed, is unloaded without), and one deleted before a claim landed has
nothing to unload, but still marks ready a marker that names this broker. A claim whose
answer was lost may have landed: the topic is claimed again, assigned or not, until an answer
says which (`claim_done(known=False)`). Inputs take the monotonic clock in milliseconds.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from danube import keys
from danube.keys import owner_key as owner_key
from danube.keys import topic_of_key as topic_of_key
from danube.keys import writer_key as writer_key
from danube.machines.cluster import records
from danube.machines.cluster.records import Marker, MarkerReason
from danube.machines.cluster.replicas import ReplicaSet, ReplicaSetError
from danube.metadata.model import Compare, Delete, KeyValue, Op, Put
from danube.values.names import parse_topic


class NotOwner(Exception):
    """A write for a topic this broker holds no claim on (any more)."""


def fence_compares(keys: Iterable[str], claims: Mapping[str, int] | None) -> list[Compare]:
    """Rule 2 of "Ownership fencing": a write that outlives the broker is made only while the
    broker's claim on each topic it touches still stands, so its transaction compares every
    such claim's revision. `claims` None is standalone mode (no fencing); a topic without a
    claim raises NotOwner before anything is sent."""
    if claims is None:
        return []
    compares = []
    for topic in sorted({t for t in map(topic_of_key, keys) if t is not None}):
        revision = claims.get(topic)
        if revision is None:
            raise NotOwner(f"{topic} is not owned by this broker")
        compares.append(_claim_compare(topic, revision))
    return compares


@lru_cache(maxsize=1024)
def _claim_compare(topic: str, revision: int) -> Compare:
    """The compare of one claim. A claim's revision stays for as long as the claim does, so
    nearly every fenced write (every index commit of every object) asks for one it asked for
    before; a `Compare` is frozen, so the one built then serves instead of a new one, its
    key and its checks per write (a pure function of its arguments: no state leaks)."""
    return Compare(owner_key(topic), "mod_revision", "==", revision)


def own_claim(found: KeyValue | None, broker_id: str, lease_id: int | None) -> bool:
    """A `Claim` whose compare failed found this claim in the store. It is this broker's own
    when it names this broker under the lease the machine claims with: an earlier claim whose
    answer was lost (a timeout) landed after all. The driver then reports the claim done at
    the claim's revision; otherwise the compare would fail on every retry, for as long as the
    lease lives, and the topic would be served by nobody."""
    if found is None or lease_id is None or found.lease != lease_id:
        return False
    value = found.value
    holder = value.get("broker_id") if isinstance(value, dict) else None
    return records.broker_id_from_json(holder) == broker_id


def release_done(effect: Release, found: KeyValue | None) -> bool:
    """A `Release` whose compare failed found this at the owner key. It is done when the
    claim it deletes is gone: its own answer was lost after it landed (it deleted the claim
    and marked the marker in one transaction), or the lease expired and took the claim. A
    release that deletes no claim, or whose claim still stands, must go again."""
    key = owner_key(effect.topic)
    claim = next((c.operand for c in effect.compares if c.key == key), None)
    return claim is not None and (found is None or found.mod_revision != claim)


def load_reads(topic: str) -> tuple[tuple[str, ...], str]:
    """What a `Load` reads before it adopts the topic: the prefixes to scan (the topic's keys,
    its object index) and its namespace's policy key."""
    name = parse_topic(topic)
    prefixes = (keys.topic_prefix(name), keys.index_prefix(name))
    return prefixes, keys.namespace_policy(name.namespace)


def load_entries(
    topic: str, scanned: Iterable[KeyValue], policy: KeyValue | None
) -> dict[str, Any]:
    """The reads of `load_reads` as `BrokerCore.adopt` takes them. LookupError: the topic has
    no metadata (it was deleted meanwhile), so there is nothing to load."""
    entries = {kv.key: kv.value for kv in scanned}
    if keys.topic_delivery(parse_topic(topic)) not in entries:
        raise LookupError(f"{topic} has no metadata (deleted?)")
    if policy is not None:
        entries[policy.key] = policy.value
    return entries


SETTLE_POLL_MS = 20
"""How often a driver's unload checks whether the topic's WAL and uploads are done
(`BrokerCore.settled`)."""


@dataclass(frozen=True, slots=True)
class Writer:
    """What loading a topic writes and decides besides the core's state (spec/cluster.md,
    "Topic moves", step 3)."""

    keep_local: bool
    """The WAL directory found here is still the topic's: nobody wrote it since this broker
    did. Otherwise another broker continued from the object index and the directory goes."""
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]
    """Record this broker as the writer, only while its claim stands."""


def become_writer(
    topic: str,
    broker_id: str,
    claim_revision: int,
    entries: Mapping[str, Any],
    replicas: KeyValue | None = None,
    landed: bool | None = None,
) -> Writer:
    """`entries`: the topic's metadata as read before the load; `replicas`: its replica set
    (`danube.machines.cluster.replicas`) as read then, None when it has none.

    The local WAL directory is kept when this broker wrote the topic last, or when the
    replica set records it in sync: its directory then holds the replicated log, with every
    acknowledged record (spec/replication.md, "Failover and moves"). The replica set is
    rewritten in the same transaction, compared on its revision: this claim's revision is the
    new epoch, this broker the owner, and it leaves the in-sync set (the owner always
    counts).

    `landed`: the decision of an earlier load under this claim whose writer transaction went
    unanswered (`Load.keep_local`). A replica set that names this broker owner at this
    claim's epoch is that transaction's, landed late: it already took this broker out of
    `in_sync`, and the writer key read may predate it, so neither says any more what the
    directory is; the earlier decision, made before it landed, still holds (nobody else
    wrote the topic under this claim). Seed 78 of the replicated cluster simulator lost a
    hand-over's 45 acknowledged records to it. Without a replica set the earlier decision
    holds too: the writer key alone cannot tell this broker's old record from this claim's
    late one, and nobody else can write it while the claim stands."""
    me = records.broker_id_to_json(broker_id)
    previous = entries.get(writer_key(topic))
    record = replica_set_of(replicas)
    in_sync_here = record is not None and broker_id in record.in_sync
    keep_local = (isinstance(previous, dict) and previous.get("broker_id") == me) or in_sync_here
    # Without a replica set only this claim writes the writer key while it stands: the
    # earlier decision holds whether its record landed or not (review: a late record made
    # the retry keep a directory the first attempt had decided to drop).
    ours = record is None or (record.owner, record.epoch) == (broker_id, claim_revision)
    if landed is not None and ours:
        keep_local = landed
    compares = [Compare(owner_key(topic), "mod_revision", "==", claim_revision)]
    ops: list[Op] = [Put(writer_key(topic), {"broker_id": me})]
    if replicas is not None and record is not None:
        claimed = dataclasses.replace(
            record,
            epoch=max(record.epoch, claim_revision),
            owner=broker_id,
            in_sync=tuple(b for b in record.in_sync if b != broker_id),
            sealed=False,
        )
        compares.append(Compare(replicas.key, "mod_revision", "==", replicas.mod_revision))
        ops.append(Put(replicas.key, claimed.to_json()))
    return Writer(keep_local, tuple(compares), tuple(ops))


def seal_replica_set(
    found: KeyValue | None, broker_id: str, epoch: int
) -> tuple[tuple[Compare, ...], tuple[Op, ...]]:
    """What a release after a completed unload that uploaded its tail adds
    (`Release.sealed_epoch`), when the replica set names this broker as owner of `epoch`:
    the set marked `sealed`, compared on its revision: everything acknowledged is indexed
    now, so the promotion rule lets any broker take the topic. A hand-over to the in-sync
    followers (the tail not uploaded) never comes here (`Ownership.unloaded`): whatever
    the store's `in_sync` says by its release (a shrink may land late), only its members
    and this broker, which kept its files, may take the topic. Nothing otherwise."""
    record = replica_set_of(found)
    if found is None or record is None or record.owner != broker_id or record.epoch != epoch:
        return (), ()
    compare = Compare(found.key, "mod_revision", "==", found.mod_revision)
    return (compare,), (Put(found.key, dataclasses.replace(record, sealed=True).to_json()),)


def replica_set_of(found: KeyValue | None) -> ReplicaSet | None:
    """A stored replica set, None when absent or unreadable (the load then keeps the local
    directory only by the writer rule, and writes no replica set)."""
    if found is None:
        return None
    try:
        return ReplicaSet.from_json(found.value)
    except ReplicaSetError:
        return None


@dataclass(frozen=True, slots=True)
class OwnershipConfig:
    broker_id: str
    retry_ms: int = 1_000

    def __post_init__(self) -> None:
        keys.register_key(self.broker_id)  # validates the id
        if self.retry_ms <= 0:
            raise ValueError(f"retry_ms must be positive, got {self.retry_ms}")


# Effects -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    """Run as one transaction; answer `claim_done(topic, succeeded, revision, known=...,
    token=token)`, where a failed compare still succeeded, at the found claim's revision, if
    `own_claim` says so of the lease the claim was made under (`lease_id`), and `known` is
    False when no answer says the claim did not land (the transaction or the read after its
    failed compare timed out)."""

    topic: str
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]
    lease_id: int
    """The lease the claim puts the owner key under."""
    token: int
    """Which claim this is (the machine numbers its claims): `claim_done` takes the answer
    only while it is the topic's claim in flight. The answer of a claim sent under an old
    lease may arrive after a new registration started a new stay and sent a new claim; taken
    for the new claim's, it would load the topic under the old claim's revision."""


@dataclass(frozen=True, slots=True)
class Load:
    """Load the topic and serve it; `claim_revision` fences its durable writes.

    `keep_local`: what an earlier load under this claim decided about the local WAL
    directory (`Writer.keep_local`) when its writer transaction went unanswered; None when
    none did. That transaction may have landed (`become_writer`)."""

    topic: str
    claim_revision: int
    keep_local: bool | None = None


@dataclass(frozen=True, slots=True)
class Unload:
    """Stop serving: refuse publishes, seal a reliable topic, end client streams; answer
    `unloaded(topic)`, if `unloading(topic, claim_revision)` still holds once sealed.

    `deleted`: the topic is being deleted (a `delete` marker names this broker), not moved:
    nothing is sealed or uploaded, the local WAL goes at once, and the clients are told the
    topic was deleted. The admin's DeleteTopic removes the metadata and objects after the
    release."""

    topic: str
    claim_revision: int
    deleted: bool = False
    restart: bool = False
    """The core stopped the topic to serve it again under a new epoch (`Ownership.restart`):
    its files are kept for the next claim's load."""


@dataclass(frozen=True, slots=True)
class Drop:
    """Stop serving at once, without sealing: the topic may be someone else's already."""

    topic: str


@dataclass(frozen=True, slots=True)
class Release:
    """Run as one transaction; answer `released(topic, succeeded)`, where a failed compare
    still succeeded if `release_done` says so of the owner key read afterwards."""

    topic: str
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]
    sealed_epoch: int | None = None
    """The claim revision of a stay this release ends after a completed unload (sealed,
    uploaded, indexed): the driver's flow also marks the topic's replica set `sealed` when
    it names this broker as owner of that epoch, so the next owner may be any broker."""


@dataclass(frozen=True, slots=True)
class WakeAt:
    at_ms: int


Effect = Claim | Load | Unload | Drop | Release | WakeAt


class Phase(enum.Enum):
    CLAIMING = "claiming"
    LOADING = "loading"
    SERVING = "serving"
    UNLOADING = "unloading"
    RELEASING = "releasing"


@dataclass(slots=True)
class _Topic:
    phase: Phase
    claim_revision: int | None = None
    busy: bool = False
    """A request of the current phase is out."""
    retry_at: int | None = None
    released_marker: int | None = None
    """Revision of the marker the `Release` in flight marks ready."""
    claim_unknown: bool = False
    """The last claim's answer was lost: it may have landed under the lease."""
    claim_token: int | None = None
    """The token of this stay's last claim (`Claim.token`); only its answer counts."""
    load_failed: bool = False
    """The last load of this claim failed (its storage or metadata is unreadable)."""
    keep_local: bool | None = None
    """A failed load's decision on the local WAL, its writer transaction unanswered
    (`Load.keep_local`)."""
    sealed: bool = False
    """The stay's unload completed with everything sealed and indexed: it served the topic
    (a load succeeded) and it was not a deletion."""
    deleting: bool = False
    served: bool = False
    """A load of this stay succeeded: its unload seals what the broker holds."""
    restarting: bool = False
    """The core asked for a new epoch (`restart`): the unload keeps the tail unsealed."""


@dataclass(slots=True)
class _Marker:
    marker: Marker
    revision: int


_OWED = (MarkerReason.UNLOAD, MarkerReason.REBALANCE, MarkerReason.DELETE)
"""Markers whose `ready` the broker named `from_broker` must write once it let go."""


class Ownership:
    def __init__(self, config: OwnershipConfig) -> None:
        self.config = config
        self.lease_id: int | None = None
        self.registered_at = 0
        """Revision of the registration under `lease_id`: the claim's floor (`_claim`)."""
        self._topics: dict[str, _Topic] = {}
        self._assigned: set[str] = set()
        self._markers: dict[str, _Marker] = {}
        self._claims = 0
        """Claims made so far: the next claim's token is one more."""

    # -- queries ------------------------------------------------------------------------------

    def phase(self, topic: str) -> Phase | None:
        state = self._topics.get(topic)
        return None if state is None else state.phase

    def unloading(self, topic: str, claim_revision: int) -> bool:
        """The `Unload` of this claim is still the topic's step. A driver asks before it
        forgets the topic: while it waited for the seal, a new lease may have dropped the
        topic and a new claim loaded it again, and that stay must not be forgotten."""
        return self._in_step(topic, Phase.UNLOADING, claim_revision)

    def loading(self, topic: str, claim_revision: int) -> bool:
        """The `Load` of this claim is still the topic's step. A driver asks before it adopts
        the topic: while the load read and wrote, a new lease may have dropped the topic and
        a new claim started loading it again; the earlier stay's load must not be adopted
        (under a claim that is gone) nor taken for the new stay's."""
        return self._in_step(topic, Phase.LOADING, claim_revision)

    def _in_step(self, topic: str, phase: Phase, claim_revision: int) -> bool:
        state = self._topics.get(topic)
        return state is not None and state.phase is phase and state.claim_revision == claim_revision

    def last_claim(self, topic: str) -> int | None:
        """The token of the topic's last claim in its current stay (`Claim.token`), None
        before its first."""
        state = self._topics.get(topic)
        return None if state is None else state.claim_token

    def failed_load(self, topic: str) -> bool:
        """The topic's last load here failed (`load_failed`); it is retried after
        `retry_ms`, but a request for it is not held (`placement.ViewFacts.load_failed`)."""
        state = self._topics.get(topic)
        return state is not None and state.load_failed

    def serving(self) -> list[str]:
        return sorted(t for t, s in self._topics.items() if s.phase is Phase.SERVING)

    # -- inputs -------------------------------------------------------------------------------

    def member(self, lease_id: int, now_ms: int, *, registered_at: int = 0) -> list[Effect]:
        """The broker is registered (again) with this lease, by a transaction at revision
        `registered_at` (`Membership.registered_revision`; 0 when unknown: any assignment
        may then be claimed, as before registrations carried it)."""
        if lease_id == self.lease_id:
            return []
        effects: list[Effect] = []
        if self.lease_id is not None:
            effects += [Drop(topic) for topic in sorted(self._topics)]
            self._topics.clear()
        self.lease_id = lease_id
        self.registered_at = registered_at
        for topic in sorted(self._assigned):
            self._topics[topic] = _Topic(Phase.CLAIMING)
        return [*effects, *self._step(now_ms)]

    def assignment_seen(self, topic: str, assigned: bool, now_ms: int) -> list[Effect]:
        """`/cluster/brokers/<me>/<topic>` put (True) or deleted (False). The leader deletes
        an assignment in the transaction that posts the topic's marker, but the two arrive by
        different watches: before reporting a deletion, the driver reads the marker and
        reports it (`marker_seen`), so whether the topic is sealed or dropped as deleted
        never depends on which watch spoke first."""
        if assigned:
            self._assigned.add(topic)
            self._topics.setdefault(topic, _Topic(Phase.CLAIMING))
        else:
            self._assigned.discard(topic)
            state = self._topics.get(topic)
            if state is not None and state.phase is Phase.CLAIMING and not state.claim_unknown:
                state.retry_at = None  # no claim to wait for any more
        return self._step(now_ms)

    def marker_seen(
        self, topic: str, marker: Marker | None, revision: int, now_ms: int
    ) -> list[Effect]:
        """`/cluster/unassigned/<topic>` put at `revision`, or deleted (None). A put older
        than the marker held changes nothing: the driver may report a marker it read as well
        as the watch's event for it, in either order."""
        if marker is None:
            self._markers.pop(topic, None)
            return []
        held = self._markers.get(topic)
        if held is not None and held.revision >= revision:
            return []  # seen already (a re-read, or the driver's read raced the watch)
        self._markers[topic] = _Marker(marker, revision)
        if topic not in self._topics and self._owes_ready(topic):
            # Unloaded and released before the marker showed: only the marker is left.
            self._topics[topic] = _Topic(Phase.RELEASING)
        return self._step(now_ms)

    def claim_done(
        self, topic: str, succeeded: bool, revision: int, now_ms: int, *, known: bool, token: int
    ) -> list[Effect]:
        """`known` False: the claim failed without an answer that says it did not land (the
        transaction or the read after its failed compare timed out). `token`: the answered
        `Claim.token`. The answer of any claim but the topic's claim in flight is ignored: a
        claim sent before a new lease (`member`) belongs to a stay that is gone. If it landed,
        its key lives under the old lease, which the new claim finds and does not take for
        its own (`own_claim`): the new claim is refused and retried until the old lease
        expires and takes the key, as any claim of an old lease."""
        state = self._topics.get(topic)
        if state is None or state.phase is not Phase.CLAIMING or not state.busy:
            return []
        if state.claim_token != token:
            return []
        state.busy = False
        state.claim_unknown = not succeeded and not known
        if succeeded:
            state.claim_revision = revision
            state.keep_local = None
            state.phase = Phase.LOADING
        elif topic in self._assigned or state.claim_unknown:
            state.retry_at = now_ms + self.config.retry_ms
        return self._step(now_ms)

    def loaded(self, topic: str, now_ms: int, claim_revision: int | None = None) -> list[Effect]:
        """The topic's `Load` ended with the topic adopted. `claim_revision`: the load's
        claim; the answer of another claim's load (an earlier stay's) is ignored."""
        state = self._topics.get(topic)
        if state is None or state.phase is not Phase.LOADING:
            return []
        if claim_revision is not None and claim_revision != state.claim_revision:
            return []
        state.busy = False
        state.phase = Phase.UNLOADING if state.restarting else Phase.SERVING
        state.served = True
        return self._step(now_ms)

    def load_failed(
        self,
        topic: str,
        now_ms: int,
        keep_local: bool | None = None,
        claim_revision: int | None = None,
    ) -> list[Effect]:
        """The topic cannot be served here (its storage is unreadable): keep the claim so no
        other broker writes over what an operator must look at, and try again later.
        `keep_local`: the load's decision on the local WAL when its writer transaction went
        unanswered (it may have landed): the retry carries it (`Load.keep_local`).
        `claim_revision`: as for `loaded`."""
        state = self._topics.get(topic)
        if state is None or state.phase is not Phase.LOADING:
            return []
        if claim_revision is not None and claim_revision != state.claim_revision:
            return []
        state.busy = False
        state.load_failed = True
        if keep_local is not None:
            state.keep_local = keep_local
        state.retry_at = now_ms + self.config.retry_ms
        return self._step(now_ms)

    def restart(self, topic: str, now_ms: int) -> list[Effect]:
        """The core stopped a served topic after a repair rewound its log below frames its
        followers may hold under this epoch (`TopicStopped.restart`). Serving it again takes
        a new epoch: the topic is unloaded and released without sealing (its tail was never
        uploaded), and, still assigned here, claimed again as a new stay; that load keeps the
        local WAL (`become_writer`: this broker wrote it last) and the followers reconcile
        by epoch (spec/replication.md, "A repair that rewinds")."""
        state = self._topics.get(topic)
        if state is not None and state.phase is Phase.LOADING:
            # Adopted, its load's answer not fed back yet (a batch of loads answers once
            # all are adopted): the restart waits for it (`loaded`).
            state.restarting = True
        if state is None or state.phase is not Phase.SERVING:
            return []  # already on its way out (or never served here): that path goes on
        state.restarting = True
        state.phase = Phase.UNLOADING
        return self._step(now_ms)

    def unloaded(self, topic: str, now_ms: int, *, handed_over: bool = False) -> list[Effect]:
        """The unload finished. A topic `handed_over` to its in-sync followers, stopped, or
        restarting left its tail unuploaded (`Lifecycle.tail_kept`): its release must not
        mark the replica set sealed (which would let any broker load it from objects); the
        promotion rule then picks an in-sync member, or this broker, which kept its files."""
        state = self._topics.get(topic)
        if state is None or state.phase is not Phase.UNLOADING:
            return []
        state.busy = False
        state.phase = Phase.RELEASING
        unsealed = handed_over or state.restarting
        state.sealed = state.served and not state.deleting and not unsealed
        return self._step(now_ms)

    def released(self, topic: str, succeeded: bool, now_ms: int) -> list[Effect]:
        state = self._topics.get(topic)
        if state is None or state.phase is not Phase.RELEASING:
            return []
        state.busy = False
        if succeeded:
            state.claim_revision = None
            seen = self._markers.get(topic)
            if seen is not None and seen.revision == state.released_marker:
                del self._markers[topic]  # marked ready; the watch brings the new value
            if not self._owes_ready(topic):
                self._released_all(topic)
        else:
            state.retry_at = now_ms + self.config.retry_ms
        return self._step(now_ms)

    def tick(self, now_ms: int) -> list[Effect]:
        return self._step(now_ms)

    # -- rules --------------------------------------------------------------------------------

    def _owes_ready(self, topic: str) -> bool:
        seen = self._markers.get(topic)
        return (
            seen is not None
            and seen.marker.reason in _OWED
            and not seen.marker.ready
            and seen.marker.from_broker == self.config.broker_id
        )

    def _step(self, now_ms: int) -> list[Effect]:
        if self.lease_id is None:
            return []
        effects: list[Effect] = []
        wake: list[int] = []
        for topic in sorted(self._topics):
            state = self._topics[topic]
            if state.busy:
                continue
            if state.retry_at is not None:
                if now_ms < state.retry_at:
                    wake.append(state.retry_at)
                    continue
                state.retry_at = None
            effect = self._next(topic, state)
            if effect is not None:
                self._topics[topic].busy = True  # a new stay's state, after a release
                effects.append(effect)
        if wake:
            effects.append(WakeAt(min(wake)))
        return effects

    def _next(self, topic: str, state: _Topic) -> Effect | None:
        if state.phase is Phase.CLAIMING:
            if topic in self._assigned or state.claim_unknown:
                # Unassigned, a claim that may have landed is settled by claiming again: the
                # retry finds it (`own_claim`) or lands, and unload and release delete it.
                # Left alone it would block the next owner for as long as the lease lives.
                return self._claim(topic)
            # Never held: nothing to unload, but a marker naming this broker still waits
            # for its `ready`, or nobody would ever assign the topic again.
            state.phase = Phase.RELEASING
            return self._release(topic, state)
        if state.phase is Phase.LOADING:
            assert state.claim_revision is not None
            if topic not in self._assigned and (state.load_failed or self._deleting(topic)):
                state.phase = Phase.UNLOADING
                return self._unload(topic, state.claim_revision)
            # Claimed and unassigned meanwhile, the topic is still loaded first: its local
            # WAL may hold acknowledged records no object holds yet (a replicated topic
            # waits for its last owner), which the unload's seal then uploads.
            return Load(topic, state.claim_revision, state.keep_local)
        if state.phase is Phase.SERVING:
            if topic in self._assigned:
                return None
            state.phase = Phase.UNLOADING
            assert state.claim_revision is not None
            return self._unload(topic, state.claim_revision)
        if state.phase is Phase.UNLOADING:
            assert state.claim_revision is not None
            return self._unload(topic, state.claim_revision)
        return self._release(topic, state)

    def _deleting(self, topic: str) -> bool:
        """The marker waiting for this broker is a `delete`: the topic goes with its WAL."""
        seen = self._markers.get(topic)
        return (
            self._owes_ready(topic) and seen is not None
            and seen.marker.reason is MarkerReason.DELETE
        )  # fmt: skip

    def _unload(self, topic: str, claim_revision: int) -> Unload:
        state = self._topics[topic]
        state.deleting = deleting = self._deleting(topic)
        return Unload(topic, claim_revision, deleting, state.restarting and not deleting)

    def _claim(self, topic: str) -> Claim:
        """Compares that the topic is free and still assigned here: a broker whose view of
        the assignments is stale (back from a partition, before its watch caught up) must
        not take a topic the leader has since given to another broker, which would then
        find it claimed, while this one served it from the index without the acknowledged
        tail a replica holds (spec/replication.md).

        The assignment must also be newer than this lease's registration: one written
        before it is a past incarnation's, which the leader fails over as soon as it sees
        the new registration (`LoadManager._check_owner`, the same rule). Claimed in that
        window, the topic would be served, acknowledged alone under a claim that stands,
        then dropped for a follower that lacks that tail (heavy seed 162)."""
        key = owner_key(topic)
        claim = {"broker_id": records.broker_id_to_json(self.config.broker_id)}
        assignment = keys.assignment_key(self.config.broker_id, topic)
        compares = (
            Compare(key, "version", "==", 0),
            Compare(assignment, "mod_revision", ">", self.registered_at),
        )
        assert self.lease_id is not None  # `_step` claims only as a member
        self._claims += 1
        self._topics[topic].claim_token = self._claims
        put = Put(key, claim, self.lease_id)
        return Claim(topic, compares, (put,), self.lease_id, self._claims)

    def _released_all(self, topic: str) -> bool:
        """Nothing of the topic's stay is left to release: forget it, or, if it was assigned
        back here meanwhile, start it over as a new stay (True: it is to be claimed)."""
        if topic not in self._assigned:
            del self._topics[topic]
            return False
        self._topics[topic] = _Topic(Phase.CLAIMING)
        return True

    def _release(self, topic: str, state: _Topic) -> Release | None:
        compares: list[Compare] = []
        ops: list[Op] = []
        if state.claim_revision is not None:
            key = owner_key(topic)
            compares.append(Compare(key, "mod_revision", "==", state.claim_revision))
            ops.append(Delete(key))
        if self._owes_ready(topic):
            seen = self._markers[topic]
            marker_key = keys.unassigned_key(topic)
            compares.append(Compare(marker_key, "mod_revision", "==", seen.revision))
            state.released_marker = seen.revision
            ready = dataclasses.replace(seen.marker, ready=True)
            ops.append(Put(marker_key, ready.to_json()))
        if not ops:
            return self._claim(topic) if self._released_all(topic) else None
        sealed = state.claim_revision if state.sealed else None
        return Release(topic, tuple(compares), tuple(ops), sealed)
