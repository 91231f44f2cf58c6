"""The administrator's cluster writes, as pure decisions (spec/cluster.md, "Administration"):
unloading a topic, draining a broker, setting a broker's mode, deleting a topic.

Every write here is one that only the leader may make, so each transaction compares the leader
key with the leader's id (`records.leader_compare`) and the revision of the key the decision was
read from; the admin's driver (`danube.runtime.cluster_admin`) runs them on the leader's view
of `/cluster/` and retries from a fresh view when a compare fails.

A topic leaves its broker by the path every move takes (spec/cluster.md, "Topic moves"): one
transaction posts a marker naming the owner (`ready: false`) and deletes its assignment. An
unload's marker is `unload`; a deletion's is `delete`, which the owner recognises
(`danube.machines.cluster.ownership`: it drops the topic and its WAL instead of sealing it) and the
load manager never assigns. Once the marker is ready (the owner let go, or there was none),
one transaction removes the topic's metadata, its object index and the marker.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from danube import keys
from danube.keys import owner_key
from danube.machines.cluster import records
from danube.machines.cluster.records import Marker, MarkerReason
from danube.metadata.model import Compare, Delete, DeletePrefix, Op, Put
from danube.values.names import parse_topic


@dataclass(frozen=True, slots=True)
class Txn:
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


def set_mode(leader: str, broker: str, mode: str, reason: str) -> Txn:
    """`/cluster/brokers/<broker>/state` = {mode, reason}."""
    return Txn(
        (records.leader_compare(leader),),
        (Put(keys.state_key(broker), records.state_value(mode, reason)),),
    )


def unload(
    leader: str,
    topic: str,
    owner: str,
    assignment_revision: int,
    reason: MarkerReason = MarkerReason.UNLOAD,
) -> Txn:
    """Takes `topic` from `owner`: marker (not ready, naming the owner, who seals or drops
    the topic and then marks it ready) and the assignment's deletion, in one transaction,
    compared on the assignment as seen and on no other marker being in the way."""
    assignment = keys.assignment_key(owner, topic)
    marker_key = keys.unassigned_key(topic)
    marker = Marker(reason, owner, ready=False)
    return Txn(
        (
            records.leader_compare(leader),
            Compare(assignment, "mod_revision", "==", assignment_revision),
            Compare(marker_key, "version", "==", 0),
        ),
        (Put(marker_key, marker.to_json()), Delete(assignment)),
    )


def selected(topics: Iterable[str], include: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """UnloadBroker's namespace filters: `include` empty means every namespace. A namespace
    may be given as `ns`, `/ns` or `/ns/`."""
    wanted = {n.strip("/") for n in include}
    unwanted = {n.strip("/") for n in exclude}
    chosen = []
    for topic in sorted(topics):
        namespace = parse_topic(topic).namespace
        if (not wanted or namespace in wanted) and namespace not in unwanted:
            chosen.append(topic)
    return chosen


# -- deletion -----------------------------------------------------------------------------------


class Step(enum.Enum):
    POST = "post"
    """Post the delete marker (the transaction given)."""
    WAIT = "wait"
    """Something else is under way (the owner is letting go, or another move): look again
    once the view changed."""
    PURGE = "purge"
    """Remove the metadata and the marker (the transaction given), then the objects."""
    DONE = "done"
    """Nothing left to do for this topic."""


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    txn: Txn | None = None
    why: str = ""


def unload_step(
    leader: str,
    topic: str,
    broker: str,
    owner: tuple[str, int] | None,
    marker: tuple[Marker, int] | None,
) -> Decision:
    """The next step of moving `topic` off `broker` (UnloadTopic, a drain), from the
    leader's view: its assignment (broker, revision) and its unassigned marker. Nothing is
    remembered between steps: a posted unload deletes the assignment in its own
    transaction, so the view shows it, and one posted twice fails its compare."""
    if owner is not None and owner[0] == broker:
        if marker is not None:
            return Decision(Step.WAIT, why="a move of it is under way")
        return Decision(Step.POST, unload(leader, topic, broker, owner[1]))
    if owner is not None:
        return Decision(Step.DONE, why=f"broker {owner[0]} serves it")
    if marker is not None:
        return Decision(Step.WAIT, why="it is on its way to another broker")
    return Decision(Step.DONE, why="it was deleted")


def delete_step(
    leader: str,
    topic: str,
    owner: tuple[str, int] | None,
    marker: tuple[Marker, int] | None,
    brokers: Iterable[str],
) -> Decision:
    """The next step of deleting `topic`, from the leader's view: its assignment
    (broker, revision), its unassigned marker (marker, revision) and the registered
    `brokers` (a tombstone for a topic nobody owns must find none of them assigned it)."""
    if marker is not None and marker[0].reason is MarkerReason.DELETE:
        if not marker[0].ready:
            return Decision(Step.WAIT, why=f"broker {marker[0].from_broker} is letting it go")
        return Decision(Step.PURGE, purge(leader, topic, marker[1]))
    if owner is not None:
        if marker is not None:
            return Decision(Step.WAIT, why="a move of it is under way")
        return Decision(
            Step.POST, unload(leader, topic, owner[0], owner[1], reason=MarkerReason.DELETE)
        )
    marker_key = keys.unassigned_key(topic)
    tombstone = Marker(MarkerReason.DELETE).to_json()
    if marker is None:
        # Neither marker nor owner in the view: the topic must still exist when this lands.
        # A view that lags the store (or a request that lands late) could otherwise leave a
        # tombstone behind a purge that already happened, which nothing would ever remove.
        exists = Compare(keys.topic_delivery(parse_topic(topic)), "version", ">", 0)
        seen: tuple[Compare, ...] = (Compare(marker_key, "version", "==", 0), exists)
    elif marker[0].ready:
        seen = (Compare(marker_key, "mod_revision", "==", marker[1]),)  # a pending assignment
    else:
        return Decision(Step.WAIT, why=f"broker {marker[0].from_broker} is unloading it")
    # Nobody owns it: the tombstone is ready at once. No claim may stand either, and no
    # assignment: one made after the view this was decided on (a request that lands late
    # after the pending assignment it saw was made) would outlive the purge, a broker
    # assigned a topic whose metadata is gone (the cluster run's seed 31, heavy profile).
    claim = Compare(owner_key(topic), "version", "==", 0)
    unassigned = tuple(
        Compare(keys.assignment_key(broker, topic), "version", "==", 0)
        for broker in sorted(brokers)
    )
    return Decision(
        Step.POST,
        Txn(
            (records.leader_compare(leader), *seen, claim, *unassigned),
            (Put(marker_key, tombstone),),
        ),
    )


def purge(leader: str, topic: str, marker_revision: int) -> Txn:
    """The topic's metadata (its keys, its namespace entry, its object index, its replica
    set, its own replication factor) and its marker, once nobody holds a claim on it. The
    objects go after this, by the admin's driver: a crash in between leaves objects no index
    names, which a topic created again under the name never reads (its objects carry a
    newer claim's epoch)."""
    name = parse_topic(topic)
    marker_key = keys.unassigned_key(topic)
    return Txn(
        (
            records.leader_compare(leader),
            Compare(marker_key, "mod_revision", "==", marker_revision),
            Compare(owner_key(topic), "version", "==", 0),
        ),
        (
            DeletePrefix(keys.topic_prefix(name)),
            DeletePrefix(keys.index_prefix(name)),
            Delete(keys.namespace_topic(name)),
            Delete(keys.replicas_key(topic)),
            Delete(keys.cluster_policy_key(topic)),
            Delete(marker_key),
        ),
    )
