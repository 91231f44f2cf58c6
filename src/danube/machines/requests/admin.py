"""The administrator's operations as flows (`danube.effects.flow`), written once: draining a
broker, unloading a topic, deleting a topic (or a partitioned topic's partitions), setting
a broker's mode, merging namespace and topic policies, and routing a call to the leader or
to a topic's owner (spec/cluster.md, "Administration").

The decisions of each step are `danube.machines.cluster.admin_ops`'s; a flow holds their order, the
retries, the waits and what each store answer means. What it needs from the world it yields:
the store effects of `danube.effects` (every transaction with its read-back) and the admin
requests below, which a port answers from its own state. The gRPC admin services
(`danube.runtime.cluster_admin`, `danube.runtime.admin`) translate a request into a flow and
its end into a reply; the simulator's operator (`sim.cluster_admin`) runs the same flows
under faults, so what production decides is what the simulator checks.

Waits are bounded by the caller's clock (`Now`, milliseconds): a flow that ran out of time
answers UNAVAILABLE ("under way"), and the work it started goes on by the store's markers.
Pure: no trio, asyncio, grpclib, os or time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from danube import keys
from danube.effects import Outcome, Sleep, StoreList, StoreRead, StoreTxn
from danube.effects.flow import Flow
from danube.machines.cluster import admin_ops, placement, records
from danube.machines.cluster.admin_ops import Step
from danube.machines.cluster.records import Marker
from danube.machines.node.settings import merged_policies
from danube.metadata.model import Compare, Put
from danube.values.errors import DanubeError, ErrorCode, not_found, quoted
from danube.values.names import TopicName, parse_topic, partition_index

T = TypeVar("T")

Now = Callable[[], int]
"""The caller's clock, milliseconds: only differences are used (deadlines)."""

POLL_MS = 50
"""How long a waiting step pauses before it looks at the view again."""
MOVE_WAIT_MS = 30_000
"""How long UnloadTopic and DeleteTopic wait for the topic to leave its broker."""
MOVE_GIVE_UP_MS = 600_000
"""How long a drain keeps after one topic before it counts it failed."""
REPOST_MAX_MS = 1_000
"""The longest a step answered on a view waits before it is posted again on that same view
(`Reposts`)."""
POLICY_RACE_ATTEMPTS = 5
"""A namespace's policies changed meanwhile this many times in a row: UNAVAILABLE."""


class ClusterView(Protocol):
    """What the flows read of the leader's load manager (`danube.machines.cluster.load_manager`)."""

    def registered(self) -> list[str]: ...

    def active(self) -> list[str]: ...

    def owner(self, topic: str) -> tuple[str, int] | None: ...

    def assignments(self, broker: str) -> Mapping[str, int]: ...

    def marker(self, topic: str) -> tuple[Marker, int] | None: ...

    def in_sync(self, topic: str) -> tuple[str, ...]: ...


# -- the admin requests a port answers --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadView:
    """Answered with a `Seen`: this broker's view as it is now (each step reads it again)."""


@dataclass(frozen=True, slots=True)
class Seen:
    leader: str | None
    """The broker this broker believes leads (its membership), None without a leader."""
    view: ClusterView


@dataclass(frozen=True, slots=True)
class Forward:
    """Ask the same call of the broker whose admin port is `admin_url` (it arrives there
    marked forwarded, so it is never forwarded again); answered with its reply."""

    admin_url: str


@dataclass(frozen=True, slots=True)
class ServedHere:
    """Answered True when this broker answers for `topic` itself: its core serves the
    topic, or the broker runs standalone. Where else to ask is `at_owner`'s decision."""

    topic: str


@dataclass(frozen=True, slots=True)
class DeleteObjects:
    """The topic's metadata is gone: delete its objects in the background (neither the
    call's deadline nor its wait cuts it short). Answered with None at once."""

    topic: str


@dataclass(frozen=True, slots=True)
class NamespaceSeen:
    """This broker's core takes `policies` as the namespace's (the store's watch follows
    later). Answered with None."""

    namespace: str
    policies: dict[str, int]


@dataclass(frozen=True, slots=True)
class CorePolicies:
    """Standalone: the core merges `changes` into the namespace's policies and persists
    them; answered with the merged policies."""

    namespace: str
    changes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TopicPolicies:
    """The core sets (`changes`), clears (`clear`) or only reads the topic's overrides;
    answered with `(effective policies, overridden field names)` once the change is stored."""

    topic: str
    changes: dict[str, Any] = field(default_factory=dict)
    clear: bool = False
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class RunHere:
    """This broker answers the call itself (a routing flow found it is the one to):
    answered with its reply."""


AdminRequest = (
    ReadView | Forward | ServedHere | DeleteObjects | NamespaceSeen | CorePolicies | TopicPolicies
)
AdminRequest = AdminRequest | RunHere


def unavailable(message: str) -> DanubeError:
    return DanubeError(ErrorCode.UNAVAILABLE, message)


# -- routing --------------------------------------------------------------------------------------


def at_leader(me: str, local: Callable[[], Flow[T]]) -> Flow[Any]:
    """Runs `local` here if this broker leads, else forwards the call to the leader's admin
    port (its registration's `admin_addr`) and returns its reply."""
    seen = yield ReadView()
    if seen.leader == me:
        return (yield from local())
    if seen.leader is None:
        raise unavailable("the cluster has no leader right now; try again shortly")
    registration = yield StoreRead(keys.register_key(seen.leader))
    value = registration.value if registration is not None else None
    admin = value.get("admin_addr") if isinstance(value, dict) else None
    if not isinstance(admin, str) or not admin:
        raise unavailable(
            f"broker {seen.leader} leads the cluster but its admin address is not registered"
        )
    return (yield Forward(admin))


def at_owner(me: str, topic: str, local: Callable[[], Flow[T]]) -> Flow[Any]:
    """Runs `local` here when this broker answers for `topic`, else forwards the call to the
    owner's admin port: the broker whose claim the topic carries, at the admin address of
    its registration (`placement.admin_route` says what to answer when there is none: the
    topic does not exist, is being assigned, or its owner is not registered)."""
    if (yield ServedHere(topic)):
        return (yield from local())
    name = parse_topic(topic)
    claim = yield StoreRead(keys.owner_key(topic))
    owner = None
    if claim is not None and isinstance(claim.value, dict):
        owner = records.broker_id_from_json(claim.value.get("broker_id"))
    exists = owner is not None or (yield StoreRead(keys.topic_delivery(name))) is not None
    registration = None
    if owner is not None and owner != me:
        found = yield StoreRead(keys.register_key(owner))
        registration = found.value if found is not None else None
    facts = placement.TopicFacts(exists, owner)
    return (yield Forward(placement.admin_route(topic, facts, me, registration)))


def _leading(me: str) -> Flow[ClusterView]:
    """The view, while this broker still leads; UNAVAILABLE once it stopped."""
    seen = yield ReadView()
    if seen.leader != me:
        raise unavailable(
            "this broker stopped leading the cluster during the operation; run it again"
        )
    view: ClusterView = seen.view
    return view


# -- broker modes and drains ----------------------------------------------------------------------


def _known_broker(view: ClusterView, broker: str) -> None:
    if broker not in view.registered():
        raise not_found(f"no broker {broker} is registered (see `danube-admin brokers list`)")


def _other_active(view: ClusterView, broker: str, what: str) -> None:
    if not [b for b in view.active() if b != broker]:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"{what} needs another active broker to take the topics; activate or add one",
        )


def set_mode(me: str, broker: str, mode: str, reason: str) -> Flow[None]:
    """One leader-compared transaction; an unanswered one is read back and counts when the
    state found is the one written."""
    txn = admin_ops.set_mode(me, broker, mode, reason)
    state = keys.state_key(broker)
    answer = yield StoreTxn(txn.compares, txn.ops, read_back=(state,), purpose=f"mode {broker}")
    if answer.committed:
        return
    found = answer.found.get(state)
    written = records.state_value(mode, reason)
    if answer.outcome is Outcome.UNKNOWN and found is not None and found.value == written:
        return
    yield from _leading(me)
    raise unavailable(f"could not set broker {broker} {mode}; retry")


def activate(me: str, broker: str, reason: str) -> Flow[None]:
    view = yield from _leading(me)
    _known_broker(view, broker)
    yield from set_mode(me, broker, records.ACTIVE, reason or "admin_activate")


@dataclass(frozen=True, slots=True)
class DrainPlan:
    broker: str
    topics: list[str]
    """The broker's topics the drain moves, in name order."""


def plan_drain(
    me: str, broker: str, include: Sequence[str], exclude: Sequence[str], *, dry_run: bool
) -> Flow[DrainPlan]:
    """UnloadBroker's first part: the broker's topics, filtered by namespace; unless a dry
    run, the broker marked `draining` (it gets no new topic). Each topic then moves by
    `drain_topic`, as many at once as the caller allows."""
    view = yield from _leading(me)
    _known_broker(view, broker)
    _other_active(view, broker, f"unloading broker {broker}")
    topics = admin_ops.selected(view.assignments(broker), include, exclude)
    if not dry_run:
        yield from set_mode(me, broker, records.DRAINING, "admin_unload")
    return DrainPlan(broker, topics)


def drain_topic(me: str, broker: str, topic: str, now: Now) -> Flow[bool]:
    """One topic of a drain: True once another broker has it (or it is gone), False when it
    did not move within `MOVE_GIVE_UP_MS` or the store failed."""
    try:
        return (yield from move_away(me, topic, broker, now() + MOVE_GIVE_UP_MS, now))
    except DanubeError:
        return False


class Reposts:
    """When a step decided from the view may be posted again. The view lags the store: a step
    answered (committed or refused) and decided again from a view that has not caught up is
    the same transaction, refused. It goes again only after a wait that doubles with each
    answer on that same view (100 ms, 200 ms, ... up to `REPOST_MAX_MS`), since what refused
    it may be outside the view (a claim the store drops when its lease expires) and nothing
    else would say it is gone. A step decided from a changed view goes at once, as does one
    whose answer was lost."""

    __slots__ = ("_answers", "_compares", "_not_before")

    def __init__(self) -> None:
        self._compares: tuple[Compare, ...] | None = None
        self._answers = 0
        self._not_before = 0

    def may_post(self, compares: tuple[Compare, ...], now_ms: int) -> bool:
        return compares != self._compares or now_ms >= self._not_before

    def answered(self, compares: tuple[Compare, ...], outcome: Outcome, now_ms: int) -> None:
        if outcome is Outcome.UNKNOWN:
            return
        self._answers = self._answers + 1 if compares == self._compares else 1
        self._compares = compares
        self._not_before = now_ms + min(POLL_MS << self._answers, REPOST_MAX_MS)


def move_away(me: str, topic: str, broker: str, deadline: int, now: Now) -> Flow[bool]:
    """Unloads `topic` from `broker`: True once another broker has it (or it is gone), False
    at `deadline`. A compare that failed is decided again from the view as it is then.

    The leader may give the topic back to `broker` (a replicated topic with no other member
    in sync may only go to the broker that holds everything acknowledged,
    `replicas.hand_over_target`). Unloading it again then would bring it back again: the
    flow waits until an active broker other than `broker` is in sync, and unloads then; at
    the deadline, FAILED_PRECONDITION says why it could not move. It was unloaded again at
    every poll until the deadline: a simulated operator's unload bounced one topic 20 times
    a second, each a claim and one more epoch in its replica set (issue 23).

    An unload answered is posted again on the same view only after `Reposts`' wait: the
    view still lags the store, and deciding again from it at every poll was refused 26 times
    in 1.3 s in a drain of a simulated cluster (seed 12 of the `peers` swarm)."""
    unloaded: set[int] = set()
    """The assignment revisions of `broker` that an unload of this flow deleted."""
    reposts = Reposts()
    given_back = False
    while True:
        view = yield from _leading(me)
        owner = view.owner(topic)
        if unloaded and owner is not None and owner[0] == broker and owner[1] not in unloaded:
            given_back = True
        decision = admin_ops.unload_step(me, topic, broker, owner, view.marker(topic))
        if decision.step is Step.DONE:
            return True
        if now() >= deadline:
            if given_back:
                raise DanubeError(
                    ErrorCode.FAILED_PRECONDITION,
                    f"the leader gave {topic} back to broker {broker} after it was unloaded, "
                    "and no other active broker has come in sync with it since: no other "
                    "broker may take it now (none holds everything it acknowledged, or none "
                    "is active); try again once its followers have caught up",
                )
            return False
        active = set(view.active())
        taker = any(b != broker and b in active for b in view.in_sync(topic))
        if decision.step is Step.POST and (taker or not given_back):
            assert decision.txn is not None and owner is not None
            compares = decision.txn.compares
            if reposts.may_post(compares, now()):
                answer = yield StoreTxn(compares, decision.txn.ops, purpose=f"unload {topic}")
                if answer.outcome is not Outcome.REFUSED:  # committed, or perhaps (unknown)
                    unloaded.add(owner[1])
                reposts.answered(compares, answer.outcome, now())
        yield Sleep(POLL_MS)


def unload_topic(me: str, name: str, now: Now) -> Flow[None]:
    """UnloadTopic: the unload path, waiting until another broker was given the topic."""
    topic = parse_topic(name).full
    view = yield from _leading(me)
    owner = view.owner(topic)
    if owner is None:
        exists = (yield StoreRead(keys.topic_delivery(parse_topic(topic)))) is not None
        raise not_found(
            f"topic {topic} is not assigned to any broker right now (it is being moved)"
            if exists
            else f"topic {topic} does not exist"
        )
    _other_active(view, owner[0], f"unloading {topic}")
    if not (yield from move_away(me, topic, owner[0], now() + MOVE_WAIT_MS, now)):
        raise unavailable(
            f"the unload of {topic} is under way but not finished yet (no other broker took "
            f"it within {MOVE_WAIT_MS // 1000} s); `topics list-broker` shows where it is"
        )


# -- deletion -------------------------------------------------------------------------------------


def delete_topic(me: str, name: str, now: Now) -> Flow[list[str]]:
    """DeleteTopic (on the leader): the topic, or every partition of a partitioned one, each
    by `delete_one`; returns the topics deleted. A partition's name is the caller's to
    refuse (it is a bad argument, known before any I/O)."""
    topic = parse_topic(name)
    targets = yield from deletion_targets(me, topic)
    deadline = now() + MOVE_WAIT_MS
    for full in targets:
        if not (yield from delete_one(me, full, deadline, now)):
            raise unavailable(
                f"the deletion of {topic.full} is under way but not finished; run it again to "
                "finish"
            )
    return targets


def deletion_targets(me: str, name: TopicName) -> Flow[list[str]]:
    if (yield StoreRead(keys.topic_delivery(name))) is not None:
        return [name.full]
    found = []
    for kv in (yield StoreList(keys.namespace_topics_prefix(name.namespace))):
        topic = keys.parse_namespace_topic(kv.key)
        index = None if topic is None else partition_index(topic.full, name.full)
        if topic is not None and index is not None:
            found.append((index, topic.full))
    view = yield from _leading(me)
    if not found and view.marker(name.full) is None:
        raise not_found(f"topic {name.full} does not exist")
    return [full for _, full in sorted(found)] or [name.full]


def delete_one(me: str, topic: str, deadline: int, now: Now) -> Flow[bool]:
    """Deletes one topic by `admin_ops.delete_step`, each step decided from the view as it
    is then: True once its metadata and marker are gone (its objects go in the background),
    False at `deadline`. A purge whose answer was lost is read back: the marker gone means
    it landed (a delete marker is never assigned, only purged); gone after a refusal, another
    deletion's purge landed (a second deletion of one topic decided from its stale view
    purged again at every poll, seed 2 of the `peers` swarm).

    Any other step answered is posted again on the same view only after `Reposts`' wait. A
    step refused or unanswered where the topic's record is gone finds it deleted meanwhile: a
    second deletion of one topic, its first step lost, posted its tombstone (compared on the
    record) at every poll until the deadline and then failed the call (seed 11 of the
    `peers` swarm)."""
    marker_key = keys.unassigned_key(topic)
    record_key = keys.topic_delivery(parse_topic(topic))
    reposts = Reposts()
    while True:
        view = yield from _leading(me)
        decision = admin_ops.delete_step(
            me, topic, view.owner(topic), view.marker(topic), view.registered()
        )
        if decision.step is Step.DONE:
            return True
        if decision.step is Step.PURGE:
            assert decision.txn is not None
            compares = decision.txn.compares
            if reposts.may_post(compares, now()):
                answer = yield StoreTxn(
                    compares, decision.txn.ops, read_back=(marker_key,), purpose=f"purge {topic}"
                )
                gone = marker_key in answer.found and answer.found[marker_key] is None
                if answer.committed or (answer.outcome is Outcome.UNKNOWN and gone):
                    yield DeleteObjects(topic)
                    return True
                if gone:  # another deletion's purge: it deletes the objects
                    return True
                reposts.answered(compares, answer.outcome, now())
        elif decision.step is Step.POST:
            assert decision.txn is not None
            compares = decision.txn.compares
            if reposts.may_post(compares, now()):
                answer = yield StoreTxn(
                    compares, decision.txn.ops, read_back=(record_key,), purpose=f"delete {topic}"
                )
                if record_key in answer.found and answer.found[record_key] is None:
                    return True
                reposts.answered(compares, answer.outcome, now())
        if now() >= deadline:
            return False
        yield Sleep(POLL_MS)


# -- policies -------------------------------------------------------------------------------------


def namespace_policies(
    namespace: str, changes: Mapping[str, Any], *, clustered: bool
) -> Flow[dict[str, int]]:
    """SetNamespacePolicies: standalone, the core's; in cluster mode merged with the store's
    value under a compare on its revision, so a change made meanwhile through another broker
    is read again, not written over (this broker's copy follows the watch and may lag). An
    unanswered write is read back: the merge found there is ours."""
    if not clustered:
        merged: dict[str, int] = yield CorePolicies(namespace, dict(changes))
        return merged
    key = keys.namespace_policy(namespace)
    for _ in range(POLICY_RACE_ATTEMPTS):
        found = yield StoreRead(key)
        if found is None:
            raise not_found(f"namespace {quoted(namespace)} does not exist")
        policies = merged_policies(found.value, changes)
        seen = Compare(key, "mod_revision", "==", found.mod_revision)
        answer = yield StoreTxn(
            (seen,),
            (Put(key, policies),),
            read_back=(key,),
            purpose=f"policies {namespace}",
        )
        now_there = answer.found.get(key)
        landed = answer.outcome is Outcome.UNKNOWN and now_there is not None
        if answer.committed or (landed and now_there.value == policies):
            yield NamespaceSeen(namespace, policies)
            return policies
    raise unavailable(f"the policies of {quoted(namespace)} kept changing meanwhile; retry")


def topic_policies(
    me: str, topic: str, changes: Mapping[str, Any] | None = None, *, clear: bool = False
) -> Flow[tuple[dict[str, int], list[str]]]:
    """Set, clear or read a topic's overrides: the core's decision, at the topic's owner."""
    request = TopicPolicies(
        topic, dict(changes or {}), clear=clear, read_only=changes is None and not clear
    )
    return (yield from at_owner(me, topic, lambda: core_topic_policies(request)))


def core_topic_policies(request: TopicPolicies) -> Flow[tuple[dict[str, int], list[str]]]:
    """At the owner (the services route topic-scoped calls before they run this)."""
    answer: tuple[dict[str, int], list[str]] = yield request
    return answer


def run_here() -> Flow[Any]:
    """The local branch of a routing flow when the call itself is the port's."""
    return (yield RunHere())
