"""What the broker does with each effect of its `Ownership` machine, as sans-I/O flows
(`danube.effects.flow`): written once, run by the broker's ownership driver over etcd
(`danube.runtime.ownership`) and by the simulator's data plane over its simulated etcd
(`sim.cluster_data`), so the read-back after a refused or unanswered claim, the load's reads
and writer record, and the unload's order are the same code in both (spec/cluster.md,
"Ownership fencing" and "Topic moves").

Each flow returns the machine's answer: the effects of the machine input it ends with. The
flows yield `danube.effects` values for the store and these, for the broker's core:
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from danube import keys
from danube.effects import (
    Outcome,
    ReadManyAnswer,
    StoreList,
    StoreRead,
    StoreReadMany,
    StoreTxn,
    StoreTxns,
    StoreUnreachable,
)
from danube.effects.flow import Flow
from danube.machines.cluster import ownership as own
from danube.metadata.model import Put

Now = Callable[[], int]
"""The machine's clock (milliseconds), read when an answer is fed to it."""


@dataclass(frozen=True, slots=True)
class Adopt:
    """Register `claim_revision` as the fencing token of the topic's writes, then adopt the
    topic in the core (`BrokerCore.adopt`) and wait until its metadata is durable and its
    WAL loaded. Answered with None. A driver may answer a batch's (`load_many`) at once,
    once each is started in the core's order, and wait for them all before it feeds the
    flow's answer to the machine (`danube.runtime.ownership`); the simulator's answers at
    once."""

    topic: str
    entries: dict[str, Any]
    keep_local: bool
    claim_revision: int
    replica_set: tuple[Any, int] | None = None
    """The replica set the load's writer record wrote, as (value, revision): the runtime's
    replication port takes it as read, without reading it back (issue 23); None when the
    load wrote none."""


def _written_set(writer: own.Writer, topic: str, revision: int) -> tuple[Any, int] | None:
    key = keys.replicas_key(topic)
    value = next((op.value for op in writer.ops if isinstance(op, Put) and op.key == key), None)
    return None if value is None or revision <= 0 else (value, revision)


@dataclass(frozen=True, slots=True)
class Seal:
    """`BrokerCore.unload`: refuse publishes, seal the reliable topic. Answered with None."""

    topic: str


@dataclass(frozen=True, slots=True)
class AwaitSettled:
    """Answered once the core says the topic is settled (`BrokerCore.settled`: WAL idle,
    sealed segments indexed; or, replicated, handed over to its in-sync followers,
    spec/replication.md "Moves") and every metadata change so far is durable: True when it
    was handed over (its tail not uploaded: the release must not seal the replica set),
    else False."""

    topic: str


@dataclass(frozen=True, slots=True)
class Forget:
    """`BrokerCore.remove` (deleting the local files when `delete_files`) and drop the
    topic's fencing token. Answered with None."""

    topic: str
    reason: str
    delete_files: bool
    event: str
    """What the log calls it: `topic_unloaded` (moved), `topic_restarted`, `topic_deleted_here`,
    `topic_dropped` (ownership lost)."""


CoreRequest = Adopt | Seal | AwaitSettled | Forget


def claim(machine: own.Ownership, effect: own.Claim, now: Now) -> Flow[list[own.Effect]]:
    """One transaction. A refused or unanswered claim reads the owner key back: a claim of
    this broker under its lease found there landed after all (`own_claim`)."""
    topic, owner, token = effect.topic, own.owner_key(effect.topic), effect.token
    try:
        answer = yield StoreTxn(
            effect.compares, effect.ops, read_back=(owner,), purpose=f"claim {topic}"
        )
    except StoreUnreachable:
        return machine.claim_done(topic, False, 0, now(), known=False, token=token)
    if answer.committed:
        return machine.claim_done(topic, True, answer.revision, now(), known=True, token=token)
    read = owner in answer.found
    found = answer.found.get(owner)
    if read and own.own_claim(found, machine.config.broker_id, effect.lease_id):
        assert found is not None
        revision = found.mod_revision
        return machine.claim_done(topic, True, revision, now(), known=True, token=token)
    # An unanswered claim that is not found may still land: only a refusal is known.
    known = read and answer.outcome is not Outcome.UNKNOWN
    return machine.claim_done(topic, False, 0, now(), known=known, token=token)


def release(machine: own.Ownership, effect: own.Release, now: Now) -> Flow[list[own.Effect]]:
    """One transaction. A refused or unanswered release reads the owner key back: it is
    done when the claim it deletes is gone (`release_done`)."""
    topic, owner = effect.topic, own.owner_key(effect.topic)
    compares, ops = effect.compares, effect.ops
    try:
        if effect.sealed_epoch is not None:
            found = yield StoreRead(keys.replicas_key(topic))
            more = own.seal_replica_set(found, machine.config.broker_id, effect.sealed_epoch)
            compares, ops = (*compares, *more[0]), (*ops, *more[1])
        answer = yield StoreTxn(compares, ops, read_back=(owner,), purpose=f"release {topic}")
    except StoreUnreachable:
        return machine.released(topic, False, now())
    if answer.committed:
        return machine.released(topic, True, now())
    done = owner in answer.found and own.release_done(effect, answer.found[owner])
    return machine.released(topic, done, now())


def load(machine: own.Ownership, effect: own.Load, now: Now) -> Flow[list[own.Effect]]:
    """Read the topic's metadata, record this broker as its writer (compared on the claim,
    so a stale claim loads nothing), then adopt it. A topic without metadata (deleted
    meanwhile), a store that does not answer or a claim that is gone: `load_failed`. A load
    the machine no longer waits for (`Ownership.loading`: a new lease dropped the topic and a
    new claim loads it again) adopts nothing: its writer record may have landed before the
    new claim, and adopting would serve the topic under the claim that is gone."""
    topic = effect.topic
    prefixes, policy_key = own.load_reads(topic)
    decided: bool | None = None  # the writer transaction is out: it may land
    try:
        scanned = []
        for prefix in prefixes:
            scanned.extend((yield StoreList(prefix)))
        policy = yield StoreRead(policy_key)
        entries = own.load_entries(topic, scanned, policy)
        replicas = yield StoreRead(keys.replicas_key(topic))
        writer = own.become_writer(
            topic,
            machine.config.broker_id,
            effect.claim_revision,
            entries,
            replicas,
            effect.keep_local,
        )
        decided = writer.keep_local
        answer = yield StoreTxn(writer.compares, writer.ops, purpose=f"writer {topic}")
        if not answer.committed:
            raise LookupError(f"the claim on {topic} is gone")
    except (StoreUnreachable, LookupError):
        return machine.load_failed(topic, now(), decided, effect.claim_revision)
    if not machine.loading(topic, effect.claim_revision):
        return []
    written = _written_set(writer, topic, answer.revision)
    yield Adopt(topic, entries, writer.keep_local, effect.claim_revision, written)
    return machine.loaded(topic, now(), effect.claim_revision)


def load_many(
    machine: own.Ownership, effects: Sequence[own.Load], now: Now
) -> Flow[list[own.Effect]]:
    """`load` for a batch of topics (`request_batching.LoadQueue`): every topic's reads in
    one request (`StoreReadMany`), every writer record in one request of nested
    transactions (`StoreTxns`), then each topic adopted in turn. Each topic ends as its
    own `load` would: loaded, or failed (no metadata, a store that does not answer, a
    claim that is gone), and a failure fails only its topic. Why: a broker given a dead
    broker's 233 topics made six store requests per topic (issue 23); a batch makes two."""
    if len(effects) == 1:
        return (yield from load(machine, effects[0], now))
    reads = {effect.topic: own.load_reads(effect.topic) for effect in effects}
    keys_read = {policy for _, policy in reads.values()}
    keys_read.update(keys.replicas_key(topic) for topic in reads)
    prefixes = tuple(prefix for topic_prefixes, _ in reads.values() for prefix in topic_prefixes)
    failed: list[own.Load] = []
    writing: list[tuple[own.Load, dict[str, Any], own.Writer]] = []
    try:
        answer: ReadManyAnswer = yield StoreReadMany(tuple(sorted(keys_read)), prefixes)
    except StoreUnreachable:
        return _load_ends(machine, [], list(effects), now)
    for effect in effects:
        topic, (topic_prefixes, policy) = effect.topic, reads[effect.topic]
        scanned = [kv for prefix in topic_prefixes for kv in answer.scanned.get(prefix, ())]
        try:
            entries = own.load_entries(topic, scanned, answer.found.get(policy))
        except LookupError:
            failed.append(effect)
            continue
        replicas = answer.found.get(keys.replicas_key(topic))
        writer = own.become_writer(
            topic,
            machine.config.broker_id,
            effect.claim_revision,
            entries,
            replicas,
            effect.keep_local,
        )
        writing.append((effect, entries, writer))
    txns = tuple(StoreTxn(w.compares, w.ops, purpose=f"writer {e.topic}") for e, _, w in writing)
    decided = {e.topic: w.keep_local for e, _, w in writing}
    answers = (yield StoreTxns(txns)) if txns else []
    loaded = []
    for (effect, entries, writer), written in zip(writing, answers, strict=True):
        if not written.committed:
            failed.append(effect)
            continue
        if not machine.loading(effect.topic, effect.claim_revision):
            continue  # an earlier stay's load: see `load`
        replica_set = _written_set(writer, effect.topic, written.revision)
        yield Adopt(effect.topic, entries, writer.keep_local, effect.claim_revision, replica_set)
        loaded.append(effect)
    return _load_ends(machine, loaded, failed, now, decided)


def _load_ends(
    machine: own.Ownership,
    loaded: list[own.Load],
    failed: list[own.Load],
    now: Now,
    decided: Mapping[str, bool] | None = None,
) -> list[own.Effect]:
    """The machine's answers to a batch's loads, in one list for the driver to apply;
    `decided`: the local-WAL decision of each topic whose writer transaction went out."""
    effects: list[own.Effect] = []
    for load in loaded:
        effects += machine.loaded(load.topic, now(), load.claim_revision)
    for load in failed:
        keep_local = (decided or {}).get(load.topic)
        effects += machine.load_failed(load.topic, now(), keep_local, load.claim_revision)
    return effects


def unload(machine: own.Ownership, effect: own.Unload, now: Now) -> Flow[list[own.Effect]]:
    """A deleted topic is forgotten at once, with its files (the admin's DeleteTopic removes
    its metadata and objects). A moved one is sealed; once settled, and only while the
    machine still unloads it under the same claim, it is forgotten with its files (its
    successor continues from the object index). A replicated one handed over to its
    in-sync followers keeps its files (`Lifecycle.remove`): its successor continues from
    its own log, and the release leaves the replica set unsealed (`seal_replica_set`)."""
    topic = effect.topic
    if effect.deleted:
        yield Forget(topic, f"topic {topic} was deleted", True, "topic_deleted_here")
        return machine.unloaded(topic, now())
    yield Seal(topic)
    handed_over = yield AwaitSettled(topic)
    if not machine.unloading(topic, effect.claim_revision):
        return []  # overtaken: the machine moved on (another claim, a drop)
    if effect.restart:  # its files are the next claim's log (`Ownership.restart`)
        yield Forget(topic, "restarted under a new epoch", False, "topic_restarted")
    else:
        yield Forget(topic, "moved to another broker", True, "topic_unloaded")
    return machine.unloaded(topic, now(), handed_over=bool(handed_over))


def drop(effect: own.Drop) -> Flow[list[own.Effect]]:
    """The lease that held the claim is gone; another broker may own the topic already:
    forget it at once and keep its files."""
    reason = "this broker lost its ownership of the topic"
    yield Forget(effect.topic, reason, False, "topic_dropped")
    return []


def flow_of(machine: own.Ownership, effect: own.Effect, now: Now) -> Flow[list[own.Effect]] | None:
    """The flow that carries out `effect`; None for `WakeAt`, which is the driver's timer."""
    if isinstance(effect, own.Claim):
        return claim(machine, effect, now)
    if isinstance(effect, own.Release):
        return release(machine, effect, now)
    if isinstance(effect, own.Load):
        return load(machine, effect, now)
    if isinstance(effect, own.Unload):
        return unload(machine, effect, now)
    if isinstance(effect, own.Drop):
        return drop(effect)
    return None
