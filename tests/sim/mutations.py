"""Planted bugs the simulator must catch. Each patches the real broker code for the
duration of a `with` block; nothing outside the tests can switch them on."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Generator, Iterator
from typing import Any
from unittest import mock

from danube.effects import Backoff
from danube.interpreter import flows
from danube.interpreter.waiters import Publishes
from danube.machines.dispatch import reliable
from danube.machines.node import reliable_log, topic_deadline
from danube.machines.node.core import BrokerCore
from danube.machines.node.deferred_loads import DeferredLoads
from danube.machines.node.effects import LoadWal
from danube.machines.node.records import SubscriptionRecord
from danube.machines.node.reliable_log import ReliableLogs
from danube.machines.node.topic_table import TopicTable
from danube.machines.requests import publish
from danube.machines.requests.effects import AwaitStored
from danube.machines.tiering.uploader import AllowLocalDelete, Uploader
from danube.machines.wal import recovery
from danube.machines.wal.machine import Acknowledge, Durability, WalMachine


@contextlib.contextmanager
def ack_before_fsync() -> Iterator[None]:
    """`fsync` mode acknowledges as soon as the write completes (Danube's mistake)."""
    original = WalMachine.write_done

    def write_done(self: WalMachine, write_id: int, now_ms: int) -> list[Any]:
        pending = self._write
        effects = original(self, write_id, now_ms)
        if self.config.durability is Durability.FSYNC and pending is not None:
            effects.append(Acknowledge(pending.end_offset - 1))
        return effects

    with mock.patch.object(WalMachine, "write_done", write_done):
        yield


@contextlib.contextmanager
def cursor_past_unacked() -> Iterator[None]:
    """An ack moves the cursor to its own offset, over unacknowledged ones below it."""

    def settle(self: Any, offset: int, entry: Any, consumer_id: int) -> None:
        original_settle(self, offset, entry, consumer_id)
        self.cursor = max(self.cursor, offset)

    original_settle = reliable.ReliableSubscription._settle
    with mock.patch.object(reliable.ReliableSubscription, "_settle", settle):
        yield


@contextlib.contextmanager
def no_redelivery_on_disconnect() -> Iterator[None]:
    """A consumer's in-flight messages are forgotten when it disconnects."""

    def disconnect(self: Any, consumer_id: int) -> None:
        consumer = self._consumers[consumer_id]
        if not consumer.connected:
            return
        consumer.connected = False
        self._connected -= 1
        self._ring.remove(consumer_id)
        if self._active == consumer_id:
            self._active = next((c for c, v in self._consumers.items() if v.connected), None)
        consumer.in_flight.clear()

    with mock.patch.object(reliable.ReliableSubscription, "_disconnect", disconnect):
        yield


@contextlib.contextmanager
def truncate_valid_data_at_recovery() -> Iterator[None]:
    """Recovery cuts the newest segment's last whole frame as if it were torn."""
    original = recovery.plan_recovery

    def plan(topic: str, scans: Any, *evidence: Any) -> recovery.RecoveryPlan:
        result = original(topic, scans, *evidence)
        if not result.segments or len(result.segments[-1].positions) < 2:
            return result
        newest = result.segments[-1]
        cut = newest.positions[-1]
        kept = dataclasses.replace(
            newest,
            size=cut,
            next_offset=newest.base_offsets[-1],
            positions=newest.positions[:-1],
            base_offsets=newest.base_offsets[:-1],
        )
        return dataclasses.replace(
            result,
            actions=(*result.actions, recovery.TruncateSegment(newest.base_offset, cut)),
            segments=(*result.segments[:-1], kept),
            next_offset=kept.next_offset,
        )

    with (
        mock.patch.object(recovery, "plan_recovery", plan),
    ):
        yield


@contextlib.contextmanager
def two_exclusive_consumers() -> Iterator[None]:
    """Exclusive and Failover subscriptions send to every connected consumer in turn."""
    original = reliable.ReliableSubscription._dispatch_single

    def dispatch(self: Any, batches: dict[int, list[int]]) -> None:
        connected = [c for c, v in self._consumers.items() if v.connected]
        if len(connected) > 1 and self._ready and not self._rewind_at:
            ready = self._ready
            turn = 0
            while ready:
                self._send(ready.popleft(), connected[turn % len(connected)], batches)
                turn += 1
            return
        original(self, batches)

    with mock.patch.object(reliable.ReliableSubscription, "_dispatch_single", dispatch):
        yield


@contextlib.contextmanager
def reuse_offset_after_restart() -> Iterator[None]:
    """After recovery the next offset is one too low: the last offset is assigned again."""
    original = WalMachine.__init__

    def init(self: WalMachine, topic: str, config: Any, recovered: Any = None, **kw: Any) -> None:
        original(self, topic, config, recovered, **kw)
        if recovered is not None and recovered.segments:
            self._next_offset -= 1
            self._written = self._durable = self._readable = self._next_offset

    with mock.patch.object(WalMachine, "__init__", init):
        yield


@contextlib.contextmanager
def synced_writes_assumed() -> Iterator[None]:
    """The WAL machine counts writes as synced (`synced_writes`) while its driver does not
    fsync them: the broker's write-and-sync shortcut with the sync left out."""
    original = WalMachine.__init__

    def init(self: WalMachine, topic: str, config: Any, recovered: Any = None, **kw: Any) -> None:
        original(self, topic, dataclasses.replace(config, synced_writes=True), recovered, **kw)

    with mock.patch.object(WalMachine, "__init__", init):
        yield


@contextlib.contextmanager
def local_delete_before_commit() -> Iterator[None]:
    """Local retention may delete a segment once its upload landed, before its index entry is
    committed: a crash in between loses the history, and until the commit no tier serves it."""
    original = Uploader.upload_done

    def upload_done(self: Uploader, key: str, *args: Any, **kwargs: Any) -> list[Any]:
        segment = self._by_key.get(key)
        effects = original(self, key, *args, **kwargs)
        if segment is not None:
            effects.insert(0, AllowLocalDelete(segment.base, segment.next_offset))
        return effects

    with mock.patch.object(Uploader, "upload_done", upload_done):
        yield


@contextlib.contextmanager
def smaller_window_acks_the_overflow() -> Iterator[None]:
    """An operator's smaller window 'trims' the offsets in flight beyond it by treating them
    as acknowledged, so they are never redelivered if their consumer fails."""
    original = reliable.ReliableSubscription.configure

    def configure(self: Any, now_ms: int, **changes: Any) -> list[Any]:
        window = changes.get("max_unacked_messages")
        if window is not None:
            for offset in sorted(self._entries)[window:]:
                entry = self._entries.pop(offset)
                if entry.consumer is not None:
                    self._consumers[entry.consumer].in_flight.discard(offset)
                self._acked.add(offset)
        return original(self, now_ms, **changes)

    with mock.patch.object(reliable.ReliableSubscription, "configure", configure):
        yield


@contextlib.contextmanager
def ignore_recovery_evidence() -> Iterator[None]:
    """Recovery trusts the segment files alone, as before issue 20: a damaged last frame is
    a torn tail, a deleted or zeroed newest segment an honest end, whatever the checkpoint,
    the cursors and the object index say."""

    def check_evidence(plan: recovery.RecoveryPlan, *_: Any) -> recovery.RecoveryPlan:
        return plan

    with mock.patch.object(recovery, "check_evidence", check_evidence):
        yield


@contextlib.contextmanager
def batched_publish_answered_before_stored() -> Iterator[None]:
    """The batch flow answers a `PublishBatch` once the core took it, without waiting for
    the WAL: a crash then loses batches their producers were told are stored."""
    original = publish.publish_batch

    def publish_batch(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        flow = original(*args, **kwargs)
        outcome: tuple[bool, Any] = (False, None)  # (thrown, answer or error)
        while True:
            thrown, value = outcome
            try:
                request = flow.throw(value) if thrown else flow.send(value)
            except StopIteration as done:
                return done.value
            if isinstance(request, AwaitStored):
                outcome = (False, None)  # answered at once: "stored"
                continue
            try:
                outcome = (False, (yield request))
            except Exception as error:
                outcome = (True, error)

    with mock.patch.object(publish, "publish_batch", publish_batch):
        yield


@contextlib.contextmanager
def ack_fails_inside_the_core() -> Iterator[None]:
    """Acknowledging some offsets raises `KeyError` inside the core (a dispatcher's state
    out of step with itself): production answers INTERNAL, the simulator reports it."""
    original = BrokerCore.ack

    def ack(self: BrokerCore, topic: str, subscription: str, offset: int, **kw: Any) -> Any:
        if offset % 97 == 96:
            raise KeyError(offset)
        return original(self, topic, subscription, offset, **kw)

    with mock.patch.object(BrokerCore, "ack", ack):
        yield


REQUEST_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "batched_publish_answered_before_stored": batched_publish_answered_before_stored,
    "ack_fails_inside_the_core": ack_fails_inside_the_core,
}
"""Bugs of the request flows (`danube.machines.requests`), each caught within 50 seeds."""

OPERATOR_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "smaller_window_acks_the_overflow": smaller_window_acks_the_overflow,
}
"""Bugs in applying an operator's change, caught by runs with `--operator`."""


@contextlib.contextmanager
def tick_forgets_touched_topics() -> Iterator[None]:
    """A tick visits only the topics whose deadline came, not those an input touched since
    the last tick (`TopicTable.due`): a subscription's timers never start."""
    original = TopicTable.due

    def due(self: TopicTable, now_ms: int, *, every: bool = False) -> Any:
        self.touched.clear()
        return original(self, now_ms, every=every)

    with mock.patch.object(TopicTable, "due", due):
        yield


@contextlib.contextmanager
def subscription_timers_not_scheduled() -> Iterator[None]:
    """A topic's next tick ignores its subscriptions' timers (`topic_deadline.next_due`): an
    ack deadline or a cursor flush waits for an input that touches the topic again."""
    original = topic_deadline.next_due

    def next_due(record: Any, batch: int, replicas: Any) -> int | None:
        subscriptions, record.subscriptions = record.subscriptions, {}
        try:
            return original(record, batch, replicas)
        finally:
            record.subscriptions = subscriptions

    with mock.patch.object(reliable_log, "next_due", next_due):
        yield


@contextlib.contextmanager
def dispatcher_use_forgets_its_topic() -> Iterator[None]:
    """An input to a subscription's dispatcher does not touch its topic
    (`SubscriptionRecord.dispatcher`): the timers it starts are not scheduled."""
    untouched = property(
        lambda sub: sub.machine,
        lambda sub, machine: setattr(sub, "machine", machine),
    )
    with mock.patch.object(SubscriptionRecord, "dispatcher", untouched):
        yield


MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "ack_before_fsync": ack_before_fsync,
    "cursor_past_unacked": cursor_past_unacked,
    "no_redelivery_on_disconnect": no_redelivery_on_disconnect,
    "truncate_valid_data_at_recovery": truncate_valid_data_at_recovery,
    "two_exclusive_consumers": two_exclusive_consumers,
    "reuse_offset_after_restart": reuse_offset_after_restart,
    "synced_writes_assumed": synced_writes_assumed,
    "tick_forgets_touched_topics": tick_forgets_touched_topics,
    "subscription_timers_not_scheduled": subscription_timers_not_scheduled,
    "dispatcher_use_forgets_its_topic": dispatcher_use_forgets_its_topic,
}


@contextlib.contextmanager
def object_read_gives_up() -> Iterator[None]:
    """The interpreter's object-read flow stops the topic after 6 failed attempts (the old
    simulator's policy, which production never had)."""
    original = flows.read_object

    def read_object(plan: Any, live: Any, backoff: Any = None, failed: Any = None) -> Any:
        bounded = Backoff(first_ms=200, cap_ms=5_000, attempts=6)
        return original(plan, live, bounded, failed)

    with mock.patch.object(flows, "read_object", read_object):
        yield


@contextlib.contextmanager
def waiting_publish_answered_twice() -> Iterator[None]:
    """The waiter table answers the first publish an acknowledgement covers twice."""
    original = Publishes.acknowledge

    def acknowledge(self: Publishes, topic: str, through: int) -> int | None:
        queue = self.waiting.get(topic)
        first = queue[0] if queue and queue[0][0] <= through else None
        previous = original(self, topic, through)
        if first is not None:
            self.answer(first[1], None)
        return previous

    with mock.patch.object(Publishes, "acknowledge", acknowledge):
        yield


TIERED_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "local_delete_before_commit": local_delete_before_commit,
}
"""Bugs of the object tier, caught by tiered runs (`tests/sim/test_tiered_sim.py`)."""
OBJECT_READ_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "object_read_gives_up": object_read_gives_up,
}
"""Bugs of history reads from objects, caught by tiered runs whose history readers
(`Workload.history_every_ms`) keep reading through read outages (`Faults.s3_get_outage`)."""
DAMAGE_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "ignore_recovery_evidence": ignore_recovery_evidence,
}
"""Bugs only damage to the newest segment (`Faults.newest_damage`) reveals."""


@contextlib.contextmanager
def first_use_load_is_fresh() -> Iterator[None]:
    """A topic a restart deferred is loaded, at its first use, as a new topic is: its
    directory emptied, its acknowledged messages gone and its offsets given out again."""
    original_due = DeferredLoads.due

    def fresh(effects: list[Any]) -> list[Any]:
        return [
            dataclasses.replace(e, fresh=True) if isinstance(e, LoadWal) else e for e in effects
        ]

    def start(self: DeferredLoads, topic: str) -> list[Any]:
        record = self._waiting.pop(topic, None) or self._wanted.pop(topic, None)
        return fresh([LoadWal(topic, fresh=False)] if self._needs(topic, record) else [])

    def due(self: DeferredLoads) -> list[Any]:
        wanted = set(self._wanted)
        return [
            dataclasses.replace(e, fresh=True)
            if isinstance(e, LoadWal) and e.topic in wanted
            else e
            for e in original_due(self)
        ]

    with (
        mock.patch.object(DeferredLoads, "start", start),
        mock.patch.object(DeferredLoads, "due", due),
    ):
        yield


@contextlib.contextmanager
def deferred_topic_served_unloaded() -> Iterator[None]:
    """A request to a topic whose deferred load has not started is served from an empty
    log instead of waiting for the load: its offsets answered from a log never recovered."""
    original = ReliableLogs.ready_wal

    def ready_wal(self: ReliableLogs, record: Any) -> WalMachine:
        if record.log.wal is None and self.deferred.pending(record.name.full):
            topic = record.name.full
            self.deferred.forget([topic])
            empty = recovery.RecoveryPlan(topic, (), (), 0, None)
            self._wal_loaded(topic, empty, now_ms=0)
        return original(self, record)

    with mock.patch.object(ReliableLogs, "ready_wal", ready_wal):
        yield


@contextlib.contextmanager
def wanted_load_stranded() -> Iterator[None]:
    """A request's `want` takes the topic off the sweep's queue without queueing its load
    (as a producer refused after taking the load did, review finding): the topic stays
    LOADING, refusing its clients, for ever."""

    def want(self: DeferredLoads, topic: str) -> None:
        self._waiting.pop(topic, None)

    with mock.patch.object(DeferredLoads, "want", want):
        yield


LAZY_LOAD_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "first_use_load_is_fresh": first_use_load_is_fresh,
    "deferred_topic_served_unloaded": deferred_topic_served_unloaded,
    "wanted_load_stranded": wanted_load_stranded,
}
"""Bugs of a restart's deferred WAL loads (issue 23), caught by runs with several topics and
crashes, whose clients come back to topics not loaded yet."""
