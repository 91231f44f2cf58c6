"""When a reliable topic's next tick can have work (`ReliableLogs.tick` schedules it in the
topic table, `topic_table`): the earliest deadline of its WAL, its `object` acknowledgement
batch, its subscriptions, its replication and its uploader. A lower bound: never later than
the first time a tick would find something to do while no input touches the topic.

Every input to these machines touches the topic (`TopicRecord.wal`,
`SubscriptionRecord.dispatcher`, `TopicRecord.touch` in `replica_owner`, `object_tier` and
`ReliableLogs.release_sealed`), so the next tick visits it and takes its new deadline. Until
issue 23 point 4 a replicated or tiered topic was visited at every tick: a failover's new
owner, adopting hundreds of replicated topics, spent 29 % of its main thread there with
nothing due."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from danube.machines.dispatch import reliable as rd
from danube.machines.wal.deadline import next_due_ms

if TYPE_CHECKING:
    from danube.machines.node.records import TopicRecord
    from danube.machines.node.replica_owner import OwnerReplicas


def _earlier(due: int | None, other: int | None) -> int | None:
    if other is None:
        return due
    return other if due is None or other < due else due


def next_due(record: TopicRecord, batch: int, replicas: OwnerReplicas) -> int | None:
    """Until when a tick would find nothing to do for the topic unless an input touches it
    (None: nothing until then). `batch`: the `object` acknowledgement batch window."""
    state = record.log
    log = state.wal
    if log is None or not record.phase.writable:
        return None  # a WAL that loads or a phase that changes touches the topic
    due = next_due_ms(log)
    since = state.ack_batch_since
    if since is not None:
        due = _earlier(due, since + batch)
    if state.replication is not None:
        due = _earlier(due, replicas.next_due(record))
    uploader = state.uploader
    if uploader is not None:
        due = _earlier(due, uploader.next_timer_ms)
    for sub in record.subscriptions.values():  # their inputs touch the topic
        due = _earlier(due, cast(rd.ReliableSubscription, sub.machine).next_timer_ms)
    return due
