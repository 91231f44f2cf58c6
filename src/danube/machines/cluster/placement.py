"""Where a topic is served, decided from facts the broker read (pure; spec/cluster.md,
"Lookup, create and subscribe"). The broker gathers the facts from its core and the metadata
store (`danube.runtime.placement`); these rules decide what the client is told.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from danube import keys
from danube.metadata.model import Compare, Op, Put
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode, not_found
from danube.values.names import TopicName


class Answer(enum.Enum):
    CONNECT = "connect"
    REDIRECT = "redirect"


@dataclass(frozen=True, slots=True)
class Located:
    answer: Answer
    broker_url: str
    connect_url: str

    @property
    def proxy(self) -> bool:
        return self.broker_url != self.connect_url


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """What a broker knows of a topic it does not serve: whether the topic exists and
    which broker's claim it carries (None: nobody's, it is being assigned or moved)."""

    exists: bool
    owner: str | None


def unavailable(message: str) -> DanubeError:
    return DanubeError(ErrorCode.UNAVAILABLE, message)


class Settling(DanubeError):
    """UNAVAILABLE for a topic the view shows between owners: being assigned, or assigned
    to this broker and not served yet. The answer changes within moments without the client
    doing anything, so the request may wait for it (`holding.hold_until`)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, message)


def _owner_address(
    topic: str, facts: TopicFacts, me: str, registration: Mapping[str, Any] | None, field: str
) -> str:
    """The `field` address of the broker serving a topic this broker does not serve, from
    the owner's `/cluster/register/<id>` value; raises what the caller must hear when there
    is none to give."""
    if facts.owner is None:
        if not facts.exists:
            raise not_found(f"topic {topic} does not exist")
        raise unavailable(f"{topic} is being assigned to a broker; retry shortly")
    if facts.owner == me:
        raise unavailable(f"{topic} is loading or moving on this broker; retry shortly")
    if not isinstance(registration, Mapping) or not registration.get(field):
        raise unavailable(f"{topic} is owned by broker {facts.owner}, which is not registered")
    return str(registration[field])


def lookup(
    topic: str, facts: TopicFacts, me: str, registration: Mapping[str, Any] | None
) -> Located:
    """TopicLookup for a topic this broker does not serve."""
    broker_url = _owner_address(topic, facts, me, registration, "broker_url")
    connect_url = registration.get("connect_url") if registration else None
    return Located(Answer.REDIRECT, broker_url, str(connect_url or broker_url))


@dataclass(frozen=True, slots=True)
class ViewFacts:
    """What the broker's own view of `/cluster/` (the load manager's, followed on every
    broker) says of a topic it does not serve: the broker it is assigned to (None: none),
    whether an unassigned marker waits for the leader, and the assignee's registration."""

    assigned_to: str | None
    pending: bool
    registration: Mapping[str, Any] | None
    deleting: bool = False
    """The marker waiting is a deletion's (the topic is going, not coming)."""
    load_failed: bool = False
    """This broker's last load of the topic failed (its storage or metadata is unreadable):
    assigned here, it is not served until an operator acts, however long a request waits."""

    @property
    def settling(self) -> bool:
        """The topic between owners is about to have one: not going (`deleting`) and not
        stuck here (`load_failed`). Only then is its refusal `Settling` (may be held)."""
        return not self.deleting and not self.load_failed


def lookup_from_view(topic: str, facts: ViewFacts, me: str) -> Located | None:
    """TopicLookup answered from the view, without reading the store; None when the view
    cannot tell (no assignment and no marker: the topic may not exist, or the view lags)
    and the store must be asked (`lookup`).

    Why: during a failover every producer of the dead broker's topics looks its topic up
    again and again; three store reads each put hundreds of reads a second on the
    survivors while they load those very topics (issue 23). The view may lag the store by
    a watch event: a client sent to the previous assignee is told there to look up again,
    and ownership stays fenced by the claims whatever a lookup answered."""
    refuse = Settling if facts.settling else unavailable
    if facts.assigned_to is None:
        if facts.pending:
            raise refuse(f"{topic} is being assigned to a broker; retry shortly")
        return None
    if facts.assigned_to == me:
        raise refuse(f"{topic} is loading or moving on this broker; retry shortly")
    registration = facts.registration
    if not isinstance(registration, Mapping) or not registration.get("broker_url"):
        return None  # the assignee's registration not seen: the store decides
    broker_url = str(registration["broker_url"])
    connect_url = registration.get("connect_url")
    return Located(Answer.REDIRECT, broker_url, str(connect_url or broker_url))


def route_from_view(topic: str, facts: ViewFacts, me: str) -> None:
    """CreateProducer or Subscribe for a topic this broker does not serve, answered from the
    view when it shows the topic assigned or being assigned: the answer `route` gives from
    the store for an existing topic, without its two reads. Returns when the view cannot
    tell (no assignment, no marker, or a deletion's marker): the store decides.

    Why: during a failover each of the dead broker's producers sends CreateProducer again
    and again, to the broker it last reached (a lookup that fails keeps it), and each of
    those cost two store reads on a survivor that is loading the very topics (issue 23
    point 4). As with lookups, a lagging view only sends the client to look up again."""
    if facts.assigned_to == me or (facts.assigned_to is None and facts.pending):
        if facts.deleting:
            return None
        refuse = Settling if facts.settling else unavailable
        raise refuse(f"{topic} is being assigned to a broker; retry shortly")
    if facts.assigned_to is not None:
        raise unavailable(f"{topic} is served by another broker; look it up again")
    return None


def admin_route(
    topic: str, facts: TopicFacts, me: str, registration: Mapping[str, Any] | None
) -> str:
    """Where an admin question about a topic this broker does not serve goes: the owner's
    admin URL (the admin services ask it again there)."""
    return _owner_address(topic, facts, me, registration, "admin_addr")


def route(
    topic: str,
    facts: TopicFacts,
    me: str,
    *,
    create: DispatchStrategy | None,
    auto_create: bool,
) -> DispatchStrategy:
    """CreateProducer (`create`: its strategy) or Subscribe (`create` None) for a topic this
    broker does not serve: raises what the client must hear, or returns the strategy to
    create the topic with (`creation`), after which the client is told to look it up."""
    if facts.exists:
        if facts.owner is None or facts.owner == me:
            raise unavailable(f"{topic} is being assigned to a broker; retry shortly")
        raise unavailable(f"{topic} is served by another broker; look it up again")
    if create is None:
        raise not_found(f"topic {topic} does not exist")
    if not auto_create:
        raise not_found(f"topic {topic} does not exist and auto_create_topics is off")
    return create


def creation(
    names: Sequence[TopicName], strategy: DispatchStrategy
) -> tuple[tuple[Compare, ...], tuple[Op, ...]]:
    """One transaction creating every topic (the partitions of one topic together), each
    with a null unassigned marker for the leader; compared on none of them existing."""
    compares = tuple(Compare(keys.topic_delivery(n), "version", "==", 0) for n in names)
    ops: list[Op] = []
    for name in names:
        ops += [
            Put(keys.namespace_topic(name), None),
            Put(keys.topic_delivery(name), strategy.label),
            Put(keys.unassigned_key(name.full), None),
        ]
    return compares, tuple(ops)
