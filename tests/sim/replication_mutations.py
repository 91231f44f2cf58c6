"""Planted bugs of replication (spec/replication.md, issue 27) for
`tests/sim/test_cluster_replication_sim.py`: each must be caught by the cluster simulator with
replication (`python -m sim --cluster --replicated`) within 200 seeds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from typing import Any
from unittest import mock

from danube import keys
from danube.effects import Outcome, ReadManyAnswer, StoreReadMany, StoreTxn, TxnAnswer
from danube.interpreter import flows
from danube.machines.cluster import ownership, ownership_flows, replicas, request_batching
from danube.machines.cluster.ownership import Load, Ownership
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node import core_replication, replica_owner
from danube.machines.replication import follower as follower_module
from danube.machines.replication.follower import FollowerLog
from danube.machines.replication.messages import (
    FollowerEffect,
    Replicate,
    Replicated,
)
from danube.machines.replication.owner import OwnerReplication

Patch = Callable[[], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def acknowledge_before_followers() -> Iterator[None]:
    """The owner acknowledges a group commit once its own WAL has it, without waiting for
    the in-sync followers (what the cluster did before issue 27)."""
    original = replica_owner.OwnerReplicas.durable

    def durable(self: Any, record: Any, through: int, now_ms: int) -> list[Any]:
        out = original(self, record, through, now_ms)
        return [*out, *self._logs.acknowledge(record, through, now_ms)]

    with mock.patch.object(replica_owner.OwnerReplicas, "durable", durable):
        yield


@contextlib.contextmanager
def count_written_end() -> Iterator[None]:
    """The high watermark counts the owner's written end (the frames it sent as its WAL
    wrote them) instead of its durable end: a publish is acknowledged once the in-sync
    followers have it, before the owner's own fsync, so with the set empty (a follower shrunk
    away) an owner crash loses what it acknowledged alone."""
    original = OwnerReplication._target

    def target(self: OwnerReplication) -> int:
        durable, self.durable_end = self.durable_end, self.written_end
        try:
            return original(self)
        finally:
            self.durable_end = durable

    def written(self: OwnerReplication, end: int, frames: bytes, now_ms: int) -> list[Any]:
        return [*original_written(self, end, frames, now_ms), *self._advance()]

    original_written = OwnerReplication.written
    with (
        mock.patch.object(OwnerReplication, "_target", target),
        mock.patch.object(OwnerReplication, "written", written),
    ):
        yield


@contextlib.contextmanager
def promote_any_follower() -> Iterator[None]:
    """The promotion rule takes any live follower, also one that left the in-sync set (or
    never caught up)."""

    def candidates(record: ReplicaSet | None, alive: Any) -> frozenset[str] | None:
        if record is None or record.sealed:
            return None
        members = (*record.followers, *record.in_sync, record.owner)
        return frozenset(members) & frozenset(alive) or None

    with mock.patch.object(replicas, "promotion_candidates", candidates):
        yield


@contextlib.contextmanager
def accept_deposed_owner() -> Iterator[None]:
    """A follower takes a lower epoch's frames as if they were of its own epoch (no
    fencing of deposed owners) and answers them `Replicated` under the sender's epoch, so
    the deposed owner counts it."""
    original = FollowerLog.replicate

    def replicate(self: FollowerLog, msg: Replicate) -> list[FollowerEffect]:
        if msg.epoch >= self.epoch:
            return original(self, msg)
        sent = msg.epoch
        msg = Replicate(msg.topic, self.epoch, msg.prev_end, msg.frames, msg.record_count,
                        msg.commit)  # fmt: skip
        return [
            Replicated(e.topic, sent, e.end) if isinstance(e, Replicated) else e
            for e in original(self, msg)
        ]

    with mock.patch.object(follower_module.FollowerLog, "replicate", replicate):
        yield


@contextlib.contextmanager
def truncate_by_high_watermark() -> Iterator[None]:
    """Reconciliation cuts at the high watermark the follower last heard of (the `commit`
    of the owner's sends, which trails what was acknowledged) instead of at the end of its
    last epoch on the new owner's log: KIP-101's bug, which loses acknowledged records."""
    replicate, new_epoch = FollowerLog.replicate, FollowerLog.new_epoch
    heard: dict[int, int] = {}

    def replicate_noting(self: FollowerLog, msg: Replicate) -> list[FollowerEffect]:
        heard[id(self)] = max(heard.get(id(self), 0), msg.commit)
        return replicate(self, msg)

    def new_epoch_at_commit(self: FollowerLog, epoch: int, owner_end: int) -> list[FollowerEffect]:
        return new_epoch(self, epoch, min(owner_end, heard.get(id(self), 0)))

    with (
        mock.patch.object(follower_module.FollowerLog, "replicate", replicate_noting),
        mock.patch.object(follower_module.FollowerLog, "new_epoch", new_epoch_at_commit),
    ):
        yield


@contextlib.contextmanager
def move_before_caught_up() -> Iterator[None]:
    """An unloading owner hands the topic over as soon as its WAL is idle: it does not wait
    for the high watermark to reach its log end, nor for an in-sync follower to hold it
    (the set may be empty: the owner then acknowledged alone), and leaves without the
    upload of its tail."""

    def ready(self: Any, record: Any) -> bool:
        log = record.wal
        return record.log.replication is not None and log is not None and log.idle

    with mock.patch.object(replica_owner.OwnerReplicas, "hand_over_ready", ready):
        yield


@contextlib.contextmanager
def seal_after_hand_over() -> Iterator[None]:
    """The release of an unload handed over to the in-sync followers (its tail not
    uploaded) marks the replica set sealed as after an upload: any broker may then load the
    topic from objects, without that tail."""
    original = Ownership.unloaded

    def unloaded(self: Ownership, topic: str, now_ms: int, *, handed_over: bool = False) -> Any:
        return original(self, topic, now_ms)

    with mock.patch.object(Ownership, "unloaded", unloaded):
        yield


@contextlib.contextmanager
def seal_after_rewind() -> Iterator[None]:
    """The release of a topic stopped by a repair that rewound its log (its tail never
    uploaded, its followers holding frames its log lost) marks the replica set sealed, as
    after an upload: any broker may then load the topic from objects, without that tail."""
    original = Ownership.unloaded

    def unloaded(self: Ownership, topic: str, now_ms: int, *, handed_over: bool = False) -> Any:
        state = self._topics.get(topic)
        if state is None or not state.restarting:
            return original(self, topic, now_ms, handed_over=handed_over)
        state.restarting = False
        return original(self, topic, now_ms)

    with mock.patch.object(Ownership, "unloaded", unloaded):
        yield


@contextlib.contextmanager
def load_batch_forgets_replica_sets() -> Iterator[None]:
    """A batch of loads (`ownership_flows.load_many`) reads no replica set: the new owner
    of a failed-over topic, an in-sync follower, does not keep its replicated log (only
    the writer rule) nor record itself in the set, and continues from the object index
    without the acknowledged tail only the replicas held."""
    original = ownership_flows.load_many

    def load_many(machine: Any, effects: Any, now: Any) -> Generator[Any, Any, Any]:
        inner = original(machine, effects, now)
        request = next(inner)
        while True:
            try:
                answer = yield request
            except Exception as error:  # the port's failure, passed on
                try:
                    request = inner.throw(error)
                except StopIteration as stop:
                    return stop.value
                continue
            if isinstance(request, StoreReadMany) and isinstance(answer, ReadManyAnswer):
                found = {
                    k: None if k.startswith(keys.REPLICAS_PREFIX) else v
                    for k, v in answer.found.items()
                }
                answer = ReadManyAnswer(found, answer.scanned)
            try:
                request = inner.send(answer)
            except StopIteration as stop:
                return stop.value

    with mock.patch.object(ownership_flows, "load_many", load_many):
        yield


@contextlib.contextmanager
def loads_in_batches() -> Iterator[None]:
    """One load slot: loads wait and go in batches (`request_batching.LoadQueue`) even in
    the default workload's 24 topics, which never fill the 16 slots."""
    with mock.patch.dict(request_batching.FLOW_SLOTS, {Load: 1}):
        yield


@contextlib.contextmanager
def adopt_refused_proposal() -> Iterator[None]:
    """An owner's in-sync proposal is taken as written whatever the store answered: a
    refused or lost write is not read back (the rule is: only a committed write is the new
    value without a read-back, issue 23). The owner then acknowledges by an in-sync set etcd
    does not hold, and a promotion by etcd's set may pick a follower that lacks what it
    acknowledged."""
    original = flows.propose_in_sync

    def propose(proposal: Any, epoch_start: int = 0, known: Any = None) -> Generator[Any, Any, Any]:
        flow = original(proposal, epoch_start, known)
        effect = next(flow)
        while True:
            try:
                reply = yield effect
            except Exception as error:  # handed to the flow as it is
                try:
                    effect = flow.throw(error)
                except StopIteration as stop:
                    return stop.value
                continue
            if isinstance(effect, StoreTxn) and not reply.committed:
                reply = TxnAnswer(Outcome.COMMITTED, revision=proposal.expected_version + 1)
            try:
                effect = flow.send(reply)
            except StopIteration as stop:
                return stop.value

    with mock.patch.object(flows, "propose_in_sync", propose):
        yield


@contextlib.contextmanager
def register_again_under_another_epoch() -> Iterator[None]:
    """A registration answered by a value that names another epoch than the owner's is made
    again at once when the value is newer than the one it was made on, as before issue 23's
    fix: an owner whose set names another epoch (here, loaded by a batch that read no set,
    `load_batch_forgets_replica_sets`) has each registration commit without its epoch, a
    newer value every time, and loops on the store."""
    answered = core_replication.ReplicationRoutes.replica_proposal_answered

    def proposal_answered(self: Any, topic: str, config: Any, *, now_ms: int) -> Any:
        record = self._topics.get(topic)
        if record is not None and record.log.registering:
            held = record.log.replica_config
            newest = max(config.version, -1 if held is None else held.version)
            if newest > record.log.registering_on:  # newer: over, made again at once
                record.log.registering = False
        return answered(self, topic, config, now_ms=now_ms)

    with (
        load_batch_forgets_replica_sets(),
        mock.patch.object(
            core_replication.ReplicationRoutes, "replica_proposal_answered", proposal_answered
        ),
    ):
        yield


@contextlib.contextmanager
def registration_never_made_again() -> Iterator[None]:
    """An owner's registration that was lost (the store did not answer) or whose answer went
    astray is never made again: the owner holds back every acknowledgement until its epoch
    shows in the replica set, so its topic takes publishes it never acknowledges."""
    original = replica_owner.OwnerReplicas.proposal_lost
    answered = core_replication.ReplicationRoutes.replica_proposal_answered

    def proposal_lost(self: Any, record: Any) -> list[Any]:
        registering = record.log.registering
        out = original(self, record)
        record.log.registering = registering
        return out

    def proposal_answered(self: Any, topic: str, config: Any, *, now_ms: int) -> Any:
        record = self._topics.get(topic)
        if record is None or not record.log.registering:
            return answered(self, topic, config, now_ms=now_ms)
        return self.replicas_changed(topic, config, now_ms=now_ms)  # not over: never again

    with (
        mock.patch.object(replica_owner.OwnerReplicas, "proposal_lost", proposal_lost),
        mock.patch.object(
            core_replication.ReplicationRoutes, "replica_proposal_answered", proposal_answered
        ),
        mock.patch.object(replica_owner, "REGISTER_RETRY_MS", 1 << 62),
    ):
        yield


@contextlib.contextmanager
def lost_proposal_not_touched() -> Iterator[None]:
    """A lost proposal (the store did not answer) does not touch its topic: the broker ticks
    a replicated topic only when touched or at its deadline (issue 23 point 4), and with
    nothing else reaching the topic the retry waits for an unrelated input (invariant 19)."""
    original = replica_owner.OwnerReplicas.proposal_lost

    def proposal_lost(self: Any, record: Any) -> list[Any]:
        touched, name = record.touched, record.name.full
        before = touched is not None and name in touched
        out = original(self, record)
        if touched is not None and not before:
            touched.discard(name)
        return out

    with mock.patch.object(replica_owner.OwnerReplicas, "proposal_lost", proposal_lost):
        yield


@contextlib.contextmanager
def replication_deadline_too_late() -> Iterator[None]:
    """The owner's next deadline is computed `lag_ms` too late (issue 23 point 4): an in-sync
    member silent past `lag_ms` is shrunk away, and a catching-up follower probed, a lag late,
    while acknowledgements wait (invariant 19)."""
    original = OwnerReplication.next_timer_ms

    def late(self: OwnerReplication) -> int | None:
        due = original.fget(self)  # type: ignore[attr-defined]
        return due if not due else due + self.lag_ms

    with mock.patch.object(OwnerReplication, "next_timer_ms", property(late)):
        yield


@contextlib.contextmanager
def retry_forgets_writer_decision() -> Iterator[None]:
    """A load retried after its writer transaction went unanswered decides afresh on the
    local WAL, ignoring the earlier decision (`Load.keep_local`): when that transaction
    landed late, its replica set no longer lists this broker in sync and a hand-over's
    replicated tail is dropped (seed 78 of the default profile)."""
    original = ownership.become_writer

    def become_writer(
        topic: str,
        broker_id: str,
        claim_revision: int,
        entries: Any,
        replicas: Any = None,
        landed: bool | None = None,
    ) -> Any:
        return original(topic, broker_id, claim_revision, entries, replicas)

    with mock.patch.object(ownership, "become_writer", become_writer):
        yield


@contextlib.contextmanager
def deposed_owner_proposes_again() -> Iterator[None]:
    """An owner does not hear that a proposal of its was refused for its claim
    (`ReplicaConfig.claim_gone` ignored): it takes the read-back as an unresolved proposal
    and makes it again at every tick until something else tells it it was deposed."""
    original = OwnerReplication.replicas_seen

    def replicas_seen(self: OwnerReplication, in_sync: Any, version: int, epoch: int,
                      *, claim_gone: int | None = None) -> Any:  # fmt: skip
        return original(self, in_sync, version, epoch)

    with mock.patch.object(OwnerReplication, "replicas_seen", replicas_seen):
        yield


REPLICATION_MUTATIONS: dict[str, Patch] = {
    "acknowledge_before_followers": acknowledge_before_followers,
    "promote_any_follower": promote_any_follower,
    "accept_deposed_owner": accept_deposed_owner,
    "truncate_by_high_watermark": truncate_by_high_watermark,
    "move_before_caught_up": move_before_caught_up,
    "seal_after_hand_over": seal_after_hand_over,
    "seal_after_rewind": seal_after_rewind,
    "count_written_end": count_written_end,
    "load_batch_forgets_replica_sets": load_batch_forgets_replica_sets,
    "register_again_under_another_epoch": register_again_under_another_epoch,
    "adopt_refused_proposal": adopt_refused_proposal,
    "registration_never_made_again": registration_never_made_again,
    "lost_proposal_not_touched": lost_proposal_not_touched,
    "replication_deadline_too_late": replication_deadline_too_late,
    "retry_forgets_writer_decision": retry_forgets_writer_decision,
    "deposed_owner_proposes_again": deposed_owner_proposes_again,
}
