"""Reliable (at-least-once) dispatch for one subscription of a reliable topic.

The machine decides which WAL offsets to read, which consumer gets which offset and when, when
an unacknowledged offset goes out again, and when the cursor is persisted. It never sees a
payload: the driver reads records (`Read`), feeds back their offsets and routing keys
(`records_read`), and sends the records named by `Deliver`. Every input takes the driver's
monotonic clock in milliseconds (a smaller value than one seen before counts as the latest)
and returns its effects in this order: the poison policy's `Dropped` and `DeadLetter`, one
`Deliver` per consumer, at most one `Read`, at most one `PersistCursor`.

**Window.** Every offset from `cursor + 1` up to what the outstanding `Read` asked for is
acknowledged, or in the window: being read, read and waiting, in flight, or waiting to be
redelivered. The window holds at most `max_unacked_messages` offsets (Danube's pipelined window;
Key-Shared messages waiting behind a busy key count, so memory stays bounded). Out-of-order acks
free window slots at once; the cursor moves only over the contiguous acknowledged prefix. One
`Read` is outstanding at a time; it is issued only while some consumer is connected (idle
subscriptions of a busy topic read nothing) and only once it can fetch a quarter of the window
or everything readable, so a lagging consumer's acks turn into batched reads, not one read per
ack. The answer may be partial or shuffled: the run of offsets from the start of the request
that it contains is taken, and the rest is requested again at once. A driver that cannot read
must delay its answer rather than answer empty in a loop.

**Timers** (ack deadlines, redelivery times, the cursor flush) fire in any input whose clock
has reached them, so behaviour does not depend on how often the driver ticks; `next_timer_ms`
says when the next one is due. Ack deadlines fire before the input itself: an ack that arrives
at or after its deadline is late, the offset already waits to be redelivered, and the ack is
ignored (as Danube does).
Acks and nacks are matched by offset alone (Danube's Ack carries no consumer): one for an
offset that is not in flight is ignored.

**Failures and redelivery.** A nack or an ack timeout is a failure of that message; it goes out
again after `FailurePolicy.redelivery_delay_ms` (Danube's defaults and formula: 1 s doubling to
at most 60 s; a nack's own delay can lengthen that, never shorten it). A message is charged
only for its own failures: resends caused by a disconnect, a takeover or an Exclusive rewind
are free, so no message is blamed for another's failure. Past `max_redelivery_count` failures
a message is exhausted and the poison policy (Drop, Block, DeadLetter; `failure`) decides: a
dropped message counts as acknowledged (`Dropped`); a blocked one stays until an operator's
`release` or `skip` or a policy change; a dead-lettered one stays until the driver reports its
copy stored (`DeadLetter`, then `dead_lettered`). A consumer's in-flight messages are
redelivered at once when it disconnects or is removed; a takeover is `disconnect` then
`connect`. Nothing else is ever dropped.

- **Exclusive / Failover**: everything goes to the active consumer (the first connected one;
  when it disconnects the earliest-added connected consumer takes over, as in non-reliable
  dispatch) in offset order. A failure or a disconnect breaks the run: nothing new is sent, and
  once every failed message's redelivery time has come (and an active consumer is connected)
  delivery restarts at the first unacknowledged offset, `cursor + 1`, resending it and every
  later unacknowledged offset in order, in flight or not (invariant 3), passing over a
  blocked one (as Danube, which retries the messages already out while one is blocked).
- **Shared**: round-robin over connected consumers in the order they were added; due
  redeliveries go before new messages.
- **Key-Shared**: the key's owner among connected consumers whose filters accept it, on the
  consistent-hash ring of `keyshared` (as in non-reliable dispatch). At most one message per key
  is in flight or waiting to be redelivered; later ones wait in offset order without holding up
  other keys. An in-flight message stays with its consumer when the ring changes; the key's next
  message goes to the new owner. A message no connected consumer accepts waits for one (Danube
  skips it, which loses it for this subscription).

**Cursor.** `PersistCursor` goes out on the first advance, then at most once per
`cursor_flush_ms` while the cursor moves (the trailing advance is flushed by the timer, unlike
Danube, which can leave it unflushed), and on `flush()` (topic unload). The machine assumes
`start_offset - 1` is durable already: the caller read it back, or wrote it when it created the
subscription. A restarted subscription (`start_offset = persisted cursor + 1`) redelivers
everything after it, each offset charged the failures stored with the cursor (`attempts`:
`PersistCursor.attempts` carries them when they changed, in the same write).
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from danube.machines.dispatch.failure import (
    DEFAULT_POLICY,
    Backoff,
    DeadLetter,
    Dropped,
    EntryState,
    FailurePolicy,
    Poison,
)
from danube.machines.dispatch.keyshared import HashRing, KeyFilter, accepts
from danube.machines.dispatch.poison import PoisonEntry, PoisonHandling
from danube.machines.dispatch.types import DropReason, SubscriptionType

MAX_UNACKED_MESSAGES_LIMIT = 10_000
_DAWN = -(1 << 62)
DISPATCH_BURST_US = 1_000_000
"""A subscription with a dispatch rate may send one second's worth at once."""
"""Earlier than any clock reading: the time of "never" and of a machine no input has reached."""

CONSUMER_GONE = "consumer gone"
"""Cause of redeliveries of messages in flight to a consumer that disconnected or left."""


# -- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    """Read up to `max_records` records from `from_offset` on (all readable) and feed their
    offsets and routing keys to `records_read`."""

    from_offset: int
    max_records: int


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send these records, in this order, to the consumer's stream (first sends and
    redeliveries alike)."""

    consumer_id: int
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PersistCursor:
    """Store the subscription's cursor: every offset up to it is acknowledged. `attempts`,
    when not None, replaces the stored failure counts (`(offset, failures)` of every offset
    past the cursor that failed at least once; empty: none), in the same metadata write."""

    cursor: int
    attempts: tuple[tuple[int, int], ...] | None = None


Effect = Read | Deliver | PersistCursor | Dropped | DeadLetter

__all__ = [
    "DEFAULT_POLICY",
    "Backoff",
    "DeadLetter",
    "Deliver",
    "Dropped",
    "Effect",
    "EntryState",
    "FailurePolicy",
    "PersistCursor",
    "Poison",
    "Read",
    "ReliableSubscription",
]


# -- state ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Consumer:
    name: str
    filters: tuple[KeyFilter, ...]
    connected: bool = False
    in_flight: set[int] = field(default_factory=set)


_SINGLE_ACTIVE = (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)


class ReliableSubscription(PoisonHandling):
    """At-least-once dispatch of one subscription; see the module docstring for the rules."""

    def __init__(
        self,
        sub_type: SubscriptionType,
        start_offset: int,
        *,
        max_unacked_messages: int = 10,
        cursor_flush_ms: int = 1_000,
        policy: FailurePolicy = DEFAULT_POLICY,
        attempts: Mapping[int, int] | None = None,
    ) -> None:
        if not 1 <= max_unacked_messages <= MAX_UNACKED_MESSAGES_LIMIT:
            raise ValueError(
                f"max_unacked_messages must be 1..{MAX_UNACKED_MESSAGES_LIMIT}, "
                f"not {max_unacked_messages}"
            )
        if start_offset < 0 or cursor_flush_ms < 0:
            raise ValueError("start_offset and cursor_flush_ms cannot be negative")
        self.sub_type = sub_type
        self.max_unacked_messages = max_unacked_messages
        self.cursor_flush_ms = cursor_flush_ms
        self.policy = policy
        self.cursor = start_offset - 1
        """Every offset up to here is acknowledged."""
        self.read_position = start_offset
        """The next offset whose record the machine has not received."""
        self.readable_end = start_offset
        """Records below this offset can be read."""
        self._read_pending = 0
        self._read_batch = max(1, max_unacked_messages // 4)
        self._acked: set[int] = set()
        self._gaps: dict[int, int] = {}
        """Offsets [start, end) that retention deleted before they were read."""
        self._entries: dict[int, PoisonEntry] = {}
        self._consumers: dict[int, _Consumer] = {}
        self._connected = 0
        self._active: int | None = None
        self._round_robin = 0
        self._ring = HashRing()
        # Exclusive, Failover, Shared: offsets to send, in order
        self._ready: deque[int] = deque()
        # Exclusive, Failover: when the broken run restarts at cursor + 1
        self._rewind_at: int | None = None
        # Key-Shared: each key's unacknowledged offsets in order (the head alone may be out),
        # keys whose head can be sent now, and keys no connected consumer accepts
        self._keys: dict[bytes, deque[int]] = {}
        self._sendable: dict[bytes, None] = {}
        self._unroutable: dict[bytes, None] = {}
        """A dict, not a set: iteration order must not depend on PYTHONHASHSEED."""
        # (time, offset, token): ack deadlines (in time order, as the clock only moves
        # forward) and Shared/Key-Shared redelivery times
        self._deadlines: deque[tuple[int, int, int]] = deque()
        self._retries: list[tuple[int, int, int]] = []
        self._tokens = 0
        self.dispatch_rate = 0
        """Messages a second sent to consumers (redeliveries included); 0: no limit. Past a
        burst of one second's worth, sends wait for their turn (a GCRA)."""
        self._rate_clock_us = _DAWN
        self._rate_blocked = False
        """The last input left a message waiting for its turn under the dispatch rate."""
        self.redelivered = 0
        """Sends of an offset that had been sent before (after a nack, an ack timeout or its
        consumer leaving): the operator's measure of how much work is done twice."""
        self.redeliveries_by_cause: dict[str, int] = {}
        """Redeliveries asked for, by cause: "nack", "ack timeout" (not the failures that
        exhausted a message) and "consumer gone" (in flight to a consumer that left)."""
        self.dropped = 0
        """Messages skipped by the Drop policy or an operator's `skip`."""
        self.dead_letters_stored = 0
        """Messages stored in the dead-letter topic and passed by the cursor."""
        self._blocked: dict[int, None] = {}
        """Offsets exhausted under Block, in the order they were blocked."""
        self._notices: list[Dropped | DeadLetter] = []
        self._republish_at: list[tuple[int, int, int]] = []
        """(time, offset, token): dead letters to ask for again after a failed republish."""
        self._now = _DAWN
        self._persisted = self.cursor
        self._persisted_at = _DAWN
        self._restored = {o: f for o, f in (attempts or {}).items() if o > self.cursor and f > 0}
        """Failures read back for offsets not admitted yet (restart, move, rebuild)."""
        self._attempts_dirty = False
        """Failure counts changed since they were last persisted."""
        self._attempts_stored = bool(self._restored)
        """The store may hold counts (the last `PersistCursor.attempts` was not empty)."""

    # -- queries ------------------------------------------------------------------------------

    @property
    def active_consumer(self) -> int | None:
        """The consumer that receives everything (Exclusive, Failover); None for the others."""
        return self._active

    @property
    def consumer_ids(self) -> list[int]:
        return list(self._consumers)

    def is_connected(self, consumer_id: int) -> bool:
        return self._consumers[consumer_id].connected

    @property
    def connected_count(self) -> int:
        """Consumers with a live stream: with none, nothing is in flight."""
        return self._connected

    def carry_over(self, old: ReliableSubscription) -> None:
        """A machine rebuilt at `old.cursor + 1` to read its window again
        (`node.departed_subscriptions`) keeps what `old` knew past the cursor: the offsets
        acknowledged out of order and the retention gaps (read again, they are not admitted),
        and what the WAL can serve."""
        self._acked = {offset for offset in old._acked if offset > self.cursor}
        self._gaps = dict(old._gaps)
        self.readable_end = max(self.readable_end, old.readable_end)

    def in_flight(self, consumer_id: int) -> frozenset[int]:
        """Offsets sent to the consumer and not acknowledged, failed or taken back."""
        return frozenset(self._consumers[consumer_id].in_flight)

    def is_pending(self, offset: int) -> bool:
        """Read and not yet acknowledged: the driver must keep the offset's record."""
        return offset in self._entries

    @property
    def window_size(self) -> int:
        """Offsets being read or read and unacknowledged (at most `max_unacked_messages`)."""
        return len(self._entries) + self._read_pending

    @property
    def next_timer_ms(self) -> int | None:
        """When the driver should `tick` next (None: only other inputs can change anything).
        Always after the last input's clock; may be early, never late."""
        times = []
        if self._deadlines:
            times.append(self._deadlines[0][0])
        if self._retries:
            times.append(self._retries[0][0])
        if self._republish_at:
            times.append(self._republish_at[0][0])
        if self._rewind_at is not None and self._active is not None:
            times.append(self._rewind_at)
        if self.cursor > self._persisted or self._attempts_dirty:
            times.append(self._persisted_at + self.cursor_flush_ms)
        if self._rate_blocked:
            times.append(max(self._now + 1, -(-self._next_send_us() // 1000)))
        return min(times, default=None)

    # -- membership ---------------------------------------------------------------------------

    def add_consumer(
        self, consumer_id: int, name: str, key_filters: tuple[str, ...], now_ms: int
    ) -> list[Effect]:
        """Registers a consumer, disconnected until `connect`."""
        if consumer_id in self._consumers:
            raise ValueError(f"consumer {consumer_id} is already registered")
        self._begin(now_ms)
        self._consumers[consumer_id] = _Consumer(name, tuple(KeyFilter(p) for p in key_filters))
        return self._finish()

    def set_filters(
        self, consumer_id: int, key_filters: tuple[str, ...], now_ms: int
    ) -> list[Effect]:
        """New Key-Shared filters; what is in flight to the consumer stays with it."""
        self._begin(now_ms)
        self._consumers[consumer_id].filters = tuple(KeyFilter(p) for p in key_filters)
        self._route_unroutable()
        return self._finish()

    def connect(self, consumer_id: int, now_ms: int) -> list[Effect]:
        """The consumer has a stream (again). Connecting a connected consumer changes nothing:
        a takeover must `disconnect` first, so the old stream's messages go out again."""
        consumer = self._consumers[consumer_id]
        self._begin(now_ms)
        if not consumer.connected:
            consumer.connected = True
            self._connected += 1
            if self.sub_type is SubscriptionType.KEY_SHARED:
                self._ring.add(consumer_id, consumer.name)
                self._route_unroutable()
            elif self._active is None and self.sub_type in _SINGLE_ACTIVE:
                self._active = consumer_id
        return self._finish()

    def disconnect(self, consumer_id: int, now_ms: int) -> list[Effect]:
        """The consumer's stream ended: its in-flight messages go out again at once (Failover:
        to the standby that takes over)."""
        self._begin(now_ms)
        self._disconnect(consumer_id)
        return self._finish()

    def remove_consumer(self, consumer_id: int, now_ms: int) -> list[Effect]:
        """The consumer leaves the subscription (an Exclusive holder replaced, a topic
        closing): a disconnect, then forgotten."""
        self._begin(now_ms)
        self._disconnect(consumer_id)
        del self._consumers[consumer_id]
        return self._finish()

    def subscribed(self, consumer_id: int, now_ms: int) -> list[Effect]:
        """A reliable consumer is connected by its receive stream, which its messages need."""
        return []

    def stream_reset(self, consumer_id: int, now_ms: int) -> list[Effect]:
        """The consumer's stream is replaced: a disconnect, so what the old stream had in
        flight goes out again."""
        return self.disconnect(consumer_id, now_ms)

    # -- data path ----------------------------------------------------------------------------

    def take(self, consumer_id: int, limit: int) -> list[Any]:
        """`Deliver` names offsets; the driver holds their records for the stream writer."""
        return []

    def readable(self, through_offset: int, now_ms: int) -> list[Effect]:
        """The WAL can serve every record up to `through_offset`."""
        self._begin(now_ms)
        self.readable_end = max(self.readable_end, through_offset + 1)
        return self._finish()

    def records_read(self, entries: Iterable[tuple[int, bytes]], now_ms: int) -> list[Effect]:
        """Answers the outstanding `Read` with `(offset, routing key)` pairs (the key is the
        routing key, else the producer name). Pairs outside the run that starts at the
        requested offset are ignored; the rest of the request is read again."""
        self._begin(now_ms)
        if self._read_pending:
            keys = dict(entries)
            offset = self.read_position
            end = offset + self._read_pending
            while offset < end and offset in keys:
                if offset > self.cursor and offset not in self._acked:  # (`carry_over`)
                    self._admit(offset, keys[offset])
                offset += 1
            self.read_position = offset
            self._read_pending = 0
        return self._finish()

    def records_lost(self, first_retained: int, now_ms: int) -> list[Effect]:
        """Answers the outstanding `Read`: retention deleted every record below
        `first_retained`. The unread ones among them count as acknowledged (there is nothing
        left to deliver); the driver reports the loss."""
        self._begin(now_ms)
        if self._read_pending and first_retained > self.read_position:
            self._gaps[self.read_position] = first_retained
            self.read_position = first_retained
            self.readable_end = max(self.readable_end, first_retained)
            self._advance_cursor()
        self._read_pending = 0
        return self._finish()

    def ack(self, offset: int, now_ms: int) -> list[Effect]:
        """Counts only while the offset is in flight (not late, duplicate or unknown)."""
        self._begin(now_ms)
        entry = self._entries.get(offset)
        if entry is not None and entry.consumer is not None:
            self._settle(offset, entry, entry.consumer)
        return self._finish()

    def nack(
        self, offset: int, delay_ms: int | None, now_ms: int, *, reason: str | None = None
    ) -> list[Effect]:
        """Redeliver after `delay_ms` or the policy's delay, whichever is longer. `reason`,
        the client's, is what a dead letter of the message says last failed (else "nack")."""
        self._begin(now_ms)
        entry = self._entries.get(offset)
        if entry is not None and entry.consumer is not None:
            self._fail(offset, entry, entry.consumer, delay_ms, "nack", reason)
        return self._finish()

    def retry_due(self, offset: int) -> int | None:
        """When a failed offset goes out again (Exclusive, Failover: when the run
        restarts); None when no retry of it is waiting. For judges of the backoff."""
        entry = self._entries.get(offset)
        if entry is None or entry.consumer is not None or entry.held is not None:
            return None
        if self.sub_type in _SINGLE_ACTIVE:
            return self._rewind_at
        return min(
            (d for d, o, t in self._retries if o == offset and t == entry.token), default=None
        )

    def drop_counts(self) -> dict[DropReason, int]:
        """Messages skipped by the poison policy Drop (or an operator)."""
        return {DropReason.POISON_POLICY: self.dropped} if self.dropped else {}

    def backlog(self, readable_end: int | None) -> int | None:
        """Offsets stored and not yet acknowledged; None when the WAL cannot say."""
        if readable_end is None:
            return None
        return max(0, readable_end - 1 - self.cursor)

    def tick(self, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        return self._finish()

    def configure(
        self,
        now_ms: int,
        *,
        max_unacked_messages: int | None = None,
        policy: FailurePolicy | None = None,
        dispatch_rate: int | None = None,
    ) -> list[Effect]:
        """An operator's change to a live subscription (Danube applies such changes only to
        subscriptions loaded afterwards). A smaller window takes no offsets away: it reads
        nothing more until acknowledgements bring it under the new size. A new ack timeout
        applies to deliveries from now on; deadlines already set keep their time."""
        self._begin(now_ms)
        if max_unacked_messages is not None:
            if not 1 <= max_unacked_messages <= MAX_UNACKED_MESSAGES_LIMIT:
                raise ValueError(
                    f"max_unacked_messages must be 1..{MAX_UNACKED_MESSAGES_LIMIT}, "
                    f"not {max_unacked_messages}"
                )
            self.max_unacked_messages = max_unacked_messages
            self._read_batch = max(1, max_unacked_messages // 4)
        if policy is not None:
            self.policy = policy
            self._reresolve_blocked()
        if dispatch_rate is not None:
            if dispatch_rate < 0:
                raise ValueError(f"dispatch_rate cannot be negative, not {dispatch_rate}")
            self.dispatch_rate = dispatch_rate
        return self._finish()

    def flush(self, now_ms: int) -> list[Effect]:
        """Topic unload: persist the cursor now if it moved since it was last persisted."""
        self._begin(now_ms)
        return self._finish(force_persist=True)

    # -- internals ----------------------------------------------------------------------------

    def _begin(self, now_ms: int) -> None:
        """Moves the clock and fires the ack deadlines it reached (before the input, so an
        ack at its deadline is late)."""
        now = self._now = max(self._now, now_ms)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, offset, token = deadlines.popleft()
            entry = self._entries.get(offset)
            if entry is not None and entry.token == token and entry.consumer is not None:
                self._fail(offset, entry, entry.consumer, None, "ack timeout")

    def _retries_due(self) -> None:
        """Shared/Key-Shared: failed messages whose time has come (this input's failures
        with no delay too) may go out again."""
        due = []
        while self._retries and self._retries[0][0] <= self._now:
            _, offset, token = heapq.heappop(self._retries)
            entry = self._entries.get(offset)
            if entry is not None and entry.token == token:
                if self.sub_type is SubscriptionType.KEY_SHARED:
                    self._sendable[entry.key] = None
                else:
                    due.append(offset)
        self._ready.extendleft(sorted(due, reverse=True))
        while self._republish_at and self._republish_at[0][0] <= self._now:
            _, offset, token = heapq.heappop(self._republish_at)
            entry = self._entries.get(offset)
            if entry is not None and entry.token == token and entry.held:
                self._republish_due(offset, entry)

    def _finish(self, *, force_persist: bool = False) -> list[Effect]:
        """Sends what can be sent, reads what the window has room for, persists the cursor
        when due."""
        self._retries_due()
        self._rate_blocked = False
        batches: dict[int, list[int]] = {}
        if self.sub_type is SubscriptionType.KEY_SHARED:
            self._dispatch_key_shared(batches)
        elif self.sub_type is SubscriptionType.SHARED:
            self._dispatch_shared(batches)
        else:
            self._dispatch_single(batches)
        effects: list[Effect] = list(self._notices)  # they happened before the sends
        self._notices.clear()
        effects.extend(Deliver(c, tuple(offsets)) for c, offsets in batches.items())
        read = self._next_read()
        if read is not None:
            effects.append(read)
        if (self.cursor > self._persisted or self._attempts_dirty) and (
            force_persist or self._now >= self._persisted_at + self.cursor_flush_ms
        ):
            attempts = self._attempts_to_persist()
            # failures settled before they were ever stored leave nothing to write
            if self.cursor > self._persisted or attempts is not None:
                self._persisted = self.cursor
                self._persisted_at = self._now
                effects.append(PersistCursor(self.cursor, attempts))
        return effects

    def _disconnect(self, consumer_id: int) -> None:
        consumer = self._consumers[consumer_id]
        if not consumer.connected:
            return
        consumer.connected = False
        self._connected -= 1
        self._ring.remove(consumer_id)
        if self._active == consumer_id:
            self._active = next((cid for cid, c in self._consumers.items() if c.connected), None)
        released = sorted(consumer.in_flight)
        consumer.in_flight.clear()
        for offset in released:
            entry = self._entries[offset]
            entry.consumer = None
            if self.sub_type is SubscriptionType.KEY_SHARED:
                self._sendable[entry.key] = None
        if not released:
            return
        causes = self.redeliveries_by_cause
        causes[CONSUMER_GONE] = causes.get(CONSUMER_GONE, 0) + len(released)
        if self.sub_type is SubscriptionType.SHARED:
            self._ready.extendleft(reversed(released))
        elif self.sub_type in _SINGLE_ACTIVE:
            self._break_run(self._now)

    def _admit(self, offset: int, key: bytes) -> None:
        self._entries[offset] = PoisonEntry(key, self._restored.pop(offset, 0))
        if self.sub_type is not SubscriptionType.KEY_SHARED:
            self._ready.append(offset)
        elif key in self._keys:
            self._keys[key].append(offset)
        else:
            self._keys[key] = deque((offset,))
            self._sendable[key] = None

    def _send(self, offset: int, consumer_id: int, batches: dict[int, list[int]]) -> None:
        entry = self._entries[offset]
        if entry.token:  # a token is given at the first send: this is a later one
            self.redelivered += 1
        self._tokens += 1
        entry.token = self._tokens
        entry.consumer = consumer_id
        self._consumers[consumer_id].in_flight.add(offset)
        deadline = (self._now + self.policy.ack_timeout_ms, offset, entry.token)
        if self._deadlines and self._deadlines[-1] > deadline:
            # only after `configure` shortened the ack timeout: keep the time order
            bisect.insort(self._deadlines, deadline)
        else:
            self._deadlines.append(deadline)
        batches.setdefault(consumer_id, []).append(offset)

    def _settle(self, offset: int, entry: PoisonEntry, consumer_id: int) -> None:
        """The offset is acknowledged: out of the window, and the cursor moves over the
        acknowledged prefix."""
        self._consumers[consumer_id].in_flight.discard(offset)
        self._remove(offset, entry)

    def _remove(self, offset: int, entry: PoisonEntry) -> None:
        """Acknowledged, dropped or dead-lettered: out of the window (the key's next message
        may go), and the cursor moves over the resolved prefix."""
        del self._entries[offset]
        self._blocked.pop(offset, None)
        if entry.failures:
            self._attempts_dirty = True
        if self.sub_type is SubscriptionType.KEY_SHARED:
            waiting = self._keys[entry.key]
            waiting.popleft()
            if waiting:
                self._sendable[entry.key] = None
            else:
                del self._keys[entry.key]
        self._acked.add(offset)
        self._advance_cursor()

    def _advance_cursor(self) -> None:
        """Over the contiguous prefix of acknowledged offsets and retention gaps."""
        acked, gaps = self._acked, self._gaps
        while True:
            following = self.cursor + 1
            if following in acked:
                acked.remove(following)
                self.cursor = following
            elif following in gaps:
                self.cursor = gaps.pop(following) - 1
            else:
                return

    def _fail(
        self,
        offset: int,
        entry: PoisonEntry,
        consumer_id: int,
        requested_ms: int | None,
        reason: str,
        detail: str | None = None,
    ) -> None:
        """A nack or an ack timeout: the message waits for its redelivery time, or is
        exhausted past the policy's limit."""
        self._consumers[consumer_id].in_flight.discard(offset)
        entry.consumer = None
        entry.failures += 1
        self._attempts_dirty = True
        entry.reason = detail or reason
        if self.policy.exhausted(entry.failures):
            self._exhaust(offset, entry)
            return
        self.redeliveries_by_cause[reason] = self.redeliveries_by_cause.get(reason, 0) + 1
        due = self._now + self.policy.redelivery_delay_ms(entry.failures, requested_ms)
        if self.sub_type in _SINGLE_ACTIVE:
            self._break_run(due)
        else:
            self._tokens += 1
            entry.token = self._tokens
            heapq.heappush(self._retries, (due, offset, entry.token))

    def _break_run(self, restart_at: int) -> None:
        """Exclusive/Failover: the run restarts at the first unacknowledged offset once every
        failed message may go out again."""
        if self._rewind_at is None or restart_at > self._rewind_at:
            self._rewind_at = restart_at

    def _dispatch_single(self, batches: dict[int, list[int]]) -> None:
        active = self._active
        if active is None:
            return
        if self._rewind_at is not None:
            if self._now < self._rewind_at:
                return
            self._rewind_at = None
            consumer = self._consumers[active]
            for offset in consumer.in_flight:
                self._entries[offset].consumer = None
            consumer.in_flight.clear()
            # offset order: reads arrive in order
            self._ready = deque(o for o, e in self._entries.items() if e.held is None)
        self._send_ready(lambda: active, batches)

    def _dispatch_shared(self, batches: dict[int, list[int]]) -> None:
        if not self._connected:
            return
        ids = list(self._consumers)
        self._send_ready(lambda: self._next_round_robin(ids), batches)

    def _send_ready(self, pick: Callable[[], int], batches: dict[int, list[int]]) -> None:
        """Exclusive, Failover, Shared: sends the ready offsets in order. While a message is
        blocked, one never sent before waits (in order); redeliveries still go."""
        ready = self._ready
        held: list[int] = []
        while ready:
            offset = ready[0]
            if self._spent(offset, self._entries[offset]):
                ready.popleft()
            elif self._blocked and not self._entries[offset].token:
                held.append(ready.popleft())
            elif self._may_send():
                self._send(ready.popleft(), pick(), batches)
            else:
                break
        ready.extendleft(reversed(held))

    def _next_round_robin(self, ids: list[int]) -> int:
        """The next connected consumer after the previous pick, in the order consumers were
        added (some consumer is connected)."""
        count = len(ids)
        step = next(
            s
            for s in range(count)
            if self._consumers[ids[(self._round_robin + s) % count]].connected
        )
        self._round_robin = (self._round_robin + step + 1) % count
        return ids[(self._round_robin - 1) % count]

    def _dispatch_key_shared(self, batches: dict[int, list[int]]) -> None:
        if not self._sendable:
            return
        keys = list(self._sendable)
        self._sendable.clear()
        for index, key in enumerate(keys):
            while key in self._keys and self._spent(self._keys[key][0], self._head(key)):
                self._sendable.pop(key, None)  # dropped: the loop looks at the next head
            if key not in self._keys or self._head(key).held is not None:
                continue  # the key waits for its exhausted head to be resolved
            owner = self._key_owner(key)
            if owner is None:
                self._unroutable[key] = None
            elif self._may_send():
                self._send(self._keys[key][0], owner, batches)
            else:  # the rest wait for their turn, in the same order
                self._sendable.update(dict.fromkeys(keys[index:]))
                break

    def _next_send_us(self) -> int:
        """When the dispatch rate lets the next message go (microseconds): once the clock
        (when every message sent so far would have gone at the rate) is within a burst."""
        return self._rate_clock_us + 1_000_000 // self.dispatch_rate - DISPATCH_BURST_US

    def _may_send(self) -> bool:
        """Takes one message's turn under the dispatch rate, if it has come."""
        if not self.dispatch_rate:
            return True
        now_us = self._now * 1000
        if self._next_send_us() > now_us:
            self._rate_blocked = True
            return False
        self._rate_clock_us = max(self._rate_clock_us, now_us) + 1_000_000 // self.dispatch_rate
        return True

    def _key_owner(self, key: bytes) -> int | None:
        if not self._connected:
            return None
        eligible = frozenset(
            cid for cid, c in self._consumers.items() if c.connected and accepts(c.filters, key)
        )
        return self._ring.owner(key, eligible) if eligible else None

    def _route_unroutable(self) -> None:
        """Membership or filters changed: keys nobody accepted may have an owner now."""
        self._sendable.update(self._unroutable)
        self._unroutable.clear()

    def _next_read(self) -> Read | None:
        if self._read_pending or not self._connected:
            return None
        if self._blocked and self.sub_type is not SubscriptionType.KEY_SHARED:
            return None  # Danube stops polling new messages while one is blocked
        available = self.readable_end - self.read_position
        free = self.max_unacked_messages - len(self._entries)
        if available <= 0 or free < min(self._read_batch, available):
            return None
        self._read_pending = min(free, available)
        return Read(self.read_position, self._read_pending)
