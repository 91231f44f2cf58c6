"""Invariant 19, "timers are never late", as judged after each tick of a simulated broker: a
tick visits only the topics touched since the last one or whose deadline came
(`danube.machines.node.topic_table`), so a timer the topic table does not know of waits for an
unrelated input. Judged for reliable subscriptions' timers (ack deadlines, redeliveries, cursor
flushes: the machine's own `next_timer_ms` must be past the tick), and for a replicated topic's
owner and a tiered topic's uploader (issue 23 point 4): one that has work due by then must be
queued for the next tick (touched, or woken no later than due).

The replication owner's work is restated here from its rules (`OwnerReplication.tick`,
`OwnerReplicas.tick`), not taken from the deadline the broker computed: a deadline computed
too late is caught as surely as an input that does not touch the topic. Everything is read
without touching (`sub.machine`, `record.log`)."""

from __future__ import annotations

from typing import cast

from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.node.core import BrokerCore
from danube.machines.node.records import TopicRecord
from danube.machines.node.replica_owner import REGISTER_RETRY_MS
from danube.machines.replication.owner import LinkState


def late_timers(core: BrokerCore, now_ms: int) -> list[str]:
    """What a tick at `now_ms` left due: reliable subscriptions whose next timer is not after
    it, and replicated or tiered topics with work due that the next tick would not visit."""
    late = []
    table = core.catalogue.topics_by_name
    for record in table.values():
        if record.log.wal is None or not record.phase.writable:
            continue
        for sub in record.subscriptions.values():
            due = cast(ReliableSubscription, sub.machine).next_timer_ms
            if due is not None and due <= now_ms:
                late.append(f"{record.name.full}/{sub.name} due at {due} ms")
        if record.name.full in table.touched:
            continue  # the next tick visits it
        woken = record.wake_ms if record.wake_ms is not None and record.wake_ms <= now_ms else None
        if woken is not None:
            continue
        work = replication_work(record, now_ms)
        if work is not None:
            late.append(f"{record.name.full}: replication, {work}")
        uploader = record.log.uploader
        due = uploader.next_timer_ms if uploader is not None else None
        if due is not None and due <= now_ms:
            late.append(f"{record.name.full}: the uploader due at {due} ms")
    return late


def replication_work(record: TopicRecord, now_ms: int) -> str | None:
    """What a tick at `now_ms` would do for the owner's replication of `record`, by the
    rules of `OwnerReplicas.tick` and `OwnerReplication.tick` (None: nothing)."""
    state = record.log
    machine = state.replication
    if machine is None or state.handing_over or machine.deposed:
        return None
    config = state.replica_config
    registered = config is not None and config.replicating and config.epoch == state.epoch
    if not registered and config is not None:
        if not state.registering:
            return "its registration is not made"
        if now_ms - state.registering_since >= REGISTER_RETRY_MS:
            return "its registration is not made again"
    if machine.pending is not None:
        return "a lost proposal is not made again" if machine.retry_pending else None
    for name in sorted(machine.in_sync):
        link = machine.links.get(name)
        if link is None or link.behind:
            return f"{name} is not shrunk away"
        if link.sends and now_ms - link.sends[0][1] > machine.lag_ms:
            return f"{name}, silent past lag_ms, is not shrunk away"
    for name, link in sorted(machine.links.items()):
        if name in machine.in_sync:
            continue
        if link.acked_end >= machine.durable_end:
            return f"{name}, caught up, is not proposed"
        if (
            link.state is LinkState.STREAMING
            and not link.behind
            and now_ms - max(link.last_heard_ms, link.probed_ms) > machine.lag_ms
        ):
            return f"{name}, catching up, is not probed"
    return None
