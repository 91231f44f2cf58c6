"""Records held for reliable subscriptions whose consumers all left (spec/memory.md,
"Departed clients").

A reliable subscription keeps the records it read and that are not acknowledged
(`SubscriptionRecord.records`, counted in the consumer pool) until they are acknowledged. Its
consumers may all leave (a crash, a scale-down) and never come back, and a reliable
subscription is never removed by the broker: it would hold up to its window of records in
the pool for ever, room other subscriptions then lack.

Once a subscription has had no connected consumer for `grace_ms` (`DEPARTED_GRACE_MS`), its
held records are let go and the pool gets their room back. With no consumer connected none
of them is in flight (a disconnect puts a consumer's in-flight records back to be sent
again, `ReliableSubscription._disconnect`), so letting go loses no delivery. The dispatcher
is rebuilt at its cursor (as after a WAL reload, `ReliableLogs._rebuild`), keeping the
offsets acknowledged out of order, the retention gaps and the failure counts
(`ReliableSubscription.carry_over`, `attempt_counts`): when a consumer comes back, the
window is read again from the WAL (its cache, or segment files, or objects) and what was
acknowledged is not delivered again. The cursor is persisted first if it moved. A
subscription holding a blocked message or one whose dead letter is being stored keeps its
window (the poison policy's state lives in it; a few records).

The sweep visits only the subscriptions a dispatcher input left with no connected consumer
(`ReliableLogs.unconnected`: noted as the input's effects are carried out, so a disconnect, a
consumer removed, or records read after the last consumer left all note it), not every
topic: walking 100,000 topics each second cost about 10 ms of the loop (bench/RESULTS.md,
"the departed-subscriptions sweep"). A subscription leaves the set at a sweep once a consumer
is connected, once it is gone (its topic deleted, unloaded or moved), or once it holds
nothing and waits for no read (it gains records only through a read, issued only while a
consumer is connected, whose going notes it again). Those due are visited in the order the
walk over every topic took (topics as they came, each topic's subscriptions in order), so
the sweep's effects come in the same order.

Pure: `now_ms` in, effects out; the sweep runs at most every `SWEEP_MS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from danube.machines.node.effects import Effect

if TYPE_CHECKING:
    from danube.machines.node.records import ConsumerRecord, SubscriptionRecord, TopicRecord
    from danube.machines.node.reliable_log import ReliableLogs

DEPARTED_GRACE_MS = 10_000
"""How long a subscription may have no connected consumer before its held records are let
go. Longer than a consumer's ordinary way back: Danube's consumers reopen a broken stream at
once and resubscribe after a health check's CLOSE (every 5 s) with backoffs of a few
seconds, so a consumer that is coming back finds its window still held and nothing is read
twice; short enough that the room of departed ones comes back within seconds."""
SWEEP_MS = 1_000
"""How often (at most) the subscriptions holding records are looked at."""


class DepartedSubscriptions:
    """Times how long each subscription holding records has had no connected consumer, and
    lets go of the records of those past `grace_ms`."""

    __slots__ = (
        "_consumers",
        "_logs",
        "_noted",
        "_topics",
        "grace_ms",
        "idle_since",
        "let_go",
        "next_ms",
        "visited",
    )

    def __init__(
        self,
        logs: ReliableLogs,
        topics: Mapping[str, TopicRecord],
        consumers: Mapping[int, ConsumerRecord],
        grace_ms: int = DEPARTED_GRACE_MS,
    ) -> None:
        """`grace_ms` 0: never let go."""
        self._logs = logs
        self._consumers = consumers
        self._topics = topics
        self.grace_ms = grace_ms
        self.next_ms = 0
        self.idle_since: dict[tuple[str, str, int], int] = {}
        """(topic, subscription, epoch) holding records with no consumer connected -> when a
        sweep first saw it so."""
        self.let_go = 0
        """Subscriptions whose records were let go since the start (a counter)."""
        self.visited = 0
        """Subscriptions the last sweep looked at (tests: not every topic's)."""
        self._noted: dict[tuple[str, str], None] = {}
        """(topic, subscription) with no connected consumer since an input (module
        docstring); insertion-ordered, so nothing depends on PYTHONHASHSEED."""
        if grace_ms:
            logs.unconnected = self._noted

    def tick(self, now_ms: int, wall_ms: int | None = None) -> list[Effect]:
        """`now_ms`: the monotonic clock, which times the grace (a wall clock set back or
        forward neither holds nor hastens a let-go); `wall_ms` (default `now_ms`): the clock
        the dispatchers run on, given to the inputs a let-go makes (the monotonic one set a
        rebuilt dispatcher's clock far from its timers', and a tick left a timer due:
        `--departing` swarm seed 69)."""
        wall = now_ms if wall_ms is None else wall_ms
        if not self.grace_ms or self.next_ms - SWEEP_MS <= now_ms < self.next_ms:
            return []
        self.next_ms = now_ms + SWEEP_MS
        effects: list[Effect] = []
        seen: dict[tuple[str, str, int], int] = {}
        let_go = self.let_go
        due = self._unconnected()
        self.visited = len(due)
        for record, sub in due:
            if not sub.records:
                continue  # a read is under way: kept in the set for its records
            key = (record.name.full, sub.name, sub.epoch)
            since = min(self.idle_since.get(key, now_ms), now_ms)
            if now_ms - since >= self.grace_ms and not sub.machine.held:  # type: ignore[attr-defined]
                effects.extend(self._let_go(record, sub, wall))
            else:
                seen[key] = since
        self.idle_since = seen
        if let_go != self.let_go and self._logs.consumer_pool is not None:
            effects.extend(self._logs.resume_reads(wall))  # the room came: reads go on
        return effects

    def _let_go(self, record: TopicRecord, sub: SubscriptionRecord, now_ms: int) -> list[Effect]:
        """The subscription's window is read again when a consumer comes back (module
        docstring)."""
        logs = self._logs
        effects = logs.dispatch(record, sub, sub.reliable.flush(now_ms), now_ms)
        logs.rebuild(sub, now_ms, keep_past=True)  # none connected: none re-connected
        self.let_go += 1
        return effects

    def _unconnected(self) -> list[tuple[TopicRecord, SubscriptionRecord]]:
        """The noted subscriptions with no connected consumer that hold records or wait for
        a read, in the order of a walk over every topic; the others leave the set (module
        docstring)."""
        noted = self._noted
        topics: dict[str, TopicRecord] = {}
        for key in list(noted):
            record = self._topics.get(key[0])
            sub = record.subscriptions.get(key[1]) if record is not None else None
            machine: Any = sub.machine if sub is not None else None
            if (
                record is None
                or sub is None
                or not record.reliable
                or machine.connected_count
                or not (sub.records or machine.window_size)
            ):
                del noted[key]
            else:
                topics[key[0]] = record
        return [
            (record, sub)
            for record in sorted(topics.values(), key=_order)
            for sub in record.subscriptions.values()
            if (record.name.full, sub.name) in noted
        ]


def _order(record: TopicRecord) -> int:
    return record.order
