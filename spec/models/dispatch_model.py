"""Reference model of reliable dispatch for one subscription (`danube.machines.dispatch.reliable`).

It does not choose anything: the machine decides who gets which offset and when, and the
model judges each decision against the rules, the slow and obvious way (sets and lists, full
scans, no indexes). It tracks the facts — which offsets exist and their keys, which consumers
are connected, what was read, delivered, acknowledged, nacked, timed out and persisted — and
fails with an `AssertionError` that names the broken rule:

- (a) at-least-once: only read, unacknowledged offsets are delivered; once acknowledged an
  offset is never delivered again, unless a crash rewound the subscription to a persisted
  cursor below it (`crash`); the property test checks "eventually delivered" by draining;
- (b) the cursor is the highest offset of the acknowledged prefix; persisted cursors only
  grow, and a moved cursor is persisted within `cursor_flush_ms`;
- (c) the window (`Read` requests plus unacknowledged records) never exceeds `max_unacked`;
- (d) Exclusive/Failover: only the active consumer receives; first deliveries go in offset
  order, and each delivery continues the current run (the next unacknowledged offset after the
  last one sent) or restarts at the first unacknowledged offset;
- (e) Key-Shared: one in-flight message per key, each key's messages in offset order (the
  lowest unacknowledged one of the key goes first), only to a consumer whose filters accept the
  key, and to the same consumer while membership does not change;
- (f) no `Read` beyond the readable end; one outstanding at a time;
- (g) only connected consumers receive;
- failed messages are not redelivered before their time (the policy's backoff or the nack's
  own delay, capped);
- nothing waits without a reason: after every input, whatever could be in flight is, and a
  `Read` is outstanding whenever one is due (`idle_work`, `read_stalled`).

Acks are accepted exactly when their offset is in flight; timers fire when an input's clock
reaches them (an ack at its deadline is late). The model's epoch is one incarnation of the
machine: `crash` starts a new one at the last persisted cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from danube.machines.dispatch.types import SubscriptionType

SINGLE_ACTIVE = (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)


def glob_accepts(pattern: bytes, key: bytes) -> bool:
    """Key-Shared filter, by dynamic programming over (pattern prefix, key prefix): `*` any
    run, `?` one byte, anything else itself, whole key."""
    # matches[j]: pattern[:i] matches key[:j]
    matches = [True] + [False] * len(key)
    for symbol in pattern:
        if symbol == ord("*"):
            matches = [any(matches[: j + 1]) for j in range(len(key) + 1)]
        else:
            matches = [False] + [
                matches[j] and (symbol == ord("?") or key[j] == symbol) for j in range(len(key))
            ]
    return matches[len(key)]


@dataclass
class ModelPolicy:
    max_unacked: int
    ack_timeout_ms: int
    base_delay_ms: int
    max_delay_ms: int
    exponential: bool
    cursor_flush_ms: int

    def delay(self, failures: int, requested_ms: int | None) -> int:
        policy = self.base_delay_ms
        if self.exponential:
            policy *= 2 ** (failures - 1)
        return min(self.max_delay_ms, max(policy, requested_ms or 0))


@dataclass
class ModelConsumer:
    name: str
    filters: tuple[str, ...]
    connected: bool = False

    def accepts(self, key: bytes) -> bool:
        return not self.filters or any(glob_accepts(f.encode(), key) for f in self.filters)


@dataclass
class Epoch:
    """What one incarnation of the machine knows; a crash forgets all of it."""

    base: int
    """The first offset of this incarnation (persisted cursor + 1)."""
    acked: set[int] = field(default_factory=set)
    read: set[int] = field(default_factory=set)
    delivered: set[int] = field(default_factory=set)
    read_position: int = 0
    request: tuple[int, int] | None = None
    in_flight: dict[int, tuple[int, int]] = field(default_factory=dict)
    """offset -> (consumer, ack deadline)"""
    failures: dict[int, int] = field(default_factory=dict)
    not_before: dict[int, int] = field(default_factory=dict)
    active: int | None = None
    run_last: int | None = None
    key_owner: dict[bytes, int] = field(default_factory=dict)
    persisted_at: int | None = None


class ReliableDispatchModel:
    """The facts of one subscription and the judge of every effect the machine returns. Feed
    it each input first (`advance` to the input's clock, then the input), then the machine's
    effects in order (`on_read`, `on_deliver`, `on_persist`), then `after_step`."""

    def __init__(self, sub_type: SubscriptionType, start_offset: int, policy: ModelPolicy) -> None:
        self.sub_type = sub_type
        self.policy = policy
        self.consumers: dict[int, ModelConsumer] = {}
        self.keys: list[bytes] = [b""] * start_offset  # offset -> routing key (the WAL)
        self.now = 0
        self.persisted = start_offset - 1
        self.persisted_history: list[int] = []
        self.persisted_attempts: dict[int, int] = {}
        """Failure counts stored with the cursor: a crash restores them."""
        self.received: dict[int, list[int]] = {}
        self.epoch = Epoch(start_offset, read_position=start_offset)

    # -- facts --------------------------------------------------------------------------------

    @property
    def readable_end(self) -> int:
        return len(self.keys)

    @property
    def cursor(self) -> int:
        cursor = self.epoch.base - 1
        while cursor + 1 in self.epoch.acked:
            cursor += 1
        return cursor

    def unacked_read(self) -> list[int]:
        return sorted(self.epoch.read - self.epoch.acked)

    def in_flight_to(self, consumer_id: int) -> set[int]:
        return {o for o, (c, _) in self.epoch.in_flight.items() if c == consumer_id}

    # -- inputs (call before feeding the same input to the machine) ----------------------------

    def advance(self, now: int) -> None:
        """The clock of the next input; expired ack deadlines fail their messages."""
        self.now = max(self.now, now)
        for offset, (_, deadline) in list(self.epoch.in_flight.items()):
            if deadline <= self.now:
                self._fail(offset, None)

    def add_consumer(self, consumer_id: int, name: str, filters: tuple[str, ...]) -> None:
        self.consumers[consumer_id] = ModelConsumer(name, filters)

    def set_filters(self, consumer_id: int, filters: tuple[str, ...]) -> None:
        self.consumers[consumer_id].filters = filters
        self.epoch.key_owner.clear()

    def connect(self, consumer_id: int) -> None:
        consumer = self.consumers[consumer_id]
        if consumer.connected:
            return
        consumer.connected = True
        self.epoch.key_owner.clear()
        if self.epoch.active is None and self.sub_type in SINGLE_ACTIVE:
            self.epoch.active = consumer_id

    def disconnect(self, consumer_id: int) -> None:
        consumer = self.consumers[consumer_id]
        if not consumer.connected:
            return
        consumer.connected = False
        self.epoch.key_owner.clear()
        for offset in self.in_flight_to(consumer_id):
            del self.epoch.in_flight[offset]
        if self.epoch.active == consumer_id:
            self.epoch.active = next(
                (c for c, state in self.consumers.items() if state.connected), None
            )

    def remove_consumer(self, consumer_id: int) -> None:
        self.disconnect(consumer_id)
        del self.consumers[consumer_id]

    def publish(self, keys: list[bytes]) -> None:
        self.keys.extend(keys)

    def answer_read(self, entries: list[tuple[int, bytes]]) -> None:
        """The run of offsets from the start of the outstanding request is read."""
        if self.epoch.request is None:
            return
        start, end = self.epoch.request
        answered = {offset for offset, _ in entries}
        offset = start
        while offset < end and offset in answered:
            self.epoch.read.add(offset)
            offset += 1
        self.epoch.read_position = offset
        self.epoch.request = None

    def ack(self, offset: int) -> bool:
        """True when the ack counts (the offset was in flight)."""
        if offset not in self.epoch.in_flight:
            return False
        del self.epoch.in_flight[offset]
        self.epoch.acked.add(offset)
        return True

    def nack(self, offset: int, delay_ms: int | None) -> None:
        if offset in self.epoch.in_flight:
            self._fail(offset, delay_ms)

    def crash(self) -> None:
        """The machine is rebuilt from the last persisted cursor; consumers come back
        disconnected."""
        for consumer in self.consumers.values():
            consumer.connected = False
        base = self.persisted + 1
        self.epoch = Epoch(base, read_position=base)
        self.epoch.failures = {o: f for o, f in self.persisted_attempts.items() if o >= base}

    def live_attempts(self) -> dict[int, int]:
        """Failures of the unacknowledged offsets past the cursor that failed: what the
        machine must store with its cursor."""
        acked, cursor = self.epoch.acked, self.cursor
        return {o: f for o, f in self.epoch.failures.items() if f and o > cursor and o not in acked}

    def _fail(self, offset: int, requested_ms: int | None) -> None:
        del self.epoch.in_flight[offset]
        failures = self.epoch.failures.get(offset, 0) + 1
        self.epoch.failures[offset] = failures
        self.epoch.not_before[offset] = self.now + self.policy.delay(failures, requested_ms)

    # -- judging the machine's effects --------------------------------------------------------

    def on_read(self, from_offset: int, max_records: int) -> None:
        epoch = self.epoch
        assert epoch.request is None, "(f) a second Read while one is outstanding"
        assert from_offset == epoch.read_position, (
            f"Read from {from_offset}, but the next unread offset is {epoch.read_position}"
        )
        assert max_records >= 1, "empty Read"
        end = from_offset + max_records
        assert end <= self.readable_end, (
            f"(f) Read up to {end - 1} beyond the readable end {self.readable_end}"
        )
        cursor = self.cursor
        window = end - (cursor + 1) - len({o for o in epoch.acked if o > cursor})
        assert window <= self.policy.max_unacked, (
            f"(c) window of {window} exceeds max_unacked {self.policy.max_unacked}"
        )
        epoch.request = (from_offset, end)

    def on_deliver(self, consumer_id: int, offsets: tuple[int, ...]) -> None:
        assert offsets, "empty Deliver"
        for offset in offsets:
            self._deliver_one(consumer_id, offset)

    def _deliver_one(self, consumer_id: int, offset: int) -> None:
        epoch = self.epoch
        consumer = self.consumers.get(consumer_id)
        assert consumer is not None and consumer.connected, (
            f"(g) offset {offset} to consumer {consumer_id}, which is not connected"
        )
        assert offset in epoch.read, f"offset {offset} delivered before it was read"
        assert offset not in epoch.acked, f"(a) offset {offset} delivered after its ack"
        assert self.now >= epoch.not_before.get(offset, self.now), (
            f"offset {offset} redelivered at {self.now}, before {epoch.not_before[offset]}"
        )
        key = self.keys[offset]
        if self.sub_type in SINGLE_ACTIVE:
            assert consumer_id == epoch.active, (
                f"(d) offset {offset} to {consumer_id}, but {epoch.active} is active"
            )
            assert offset in epoch.delivered or offset > max(epoch.delivered, default=-1), (
                f"(d) first delivery of {offset} after that of {max(epoch.delivered)}"
            )
            unacked = self.unacked_read()
            after_last = [o for o in unacked if epoch.run_last is not None and o > epoch.run_last]
            assert offset == unacked[0] or (after_last and offset == after_last[0]), (
                f"(d) offset {offset} neither continues the run after {epoch.run_last} nor "
                f"restarts at the first unacknowledged offset {unacked[0]}"
            )
        else:
            assert offset not in epoch.in_flight, f"offset {offset} sent while in flight"
        if self.sub_type is SubscriptionType.KEY_SHARED:
            assert consumer.accepts(key), f"(e) key {key!r} to {consumer_id}, which refuses it"
            busy = [o for o in epoch.in_flight if self.keys[o] == key]
            assert not busy, f"(e) offset {offset} sent while {busy} of key {key!r} in flight"
            earlier = [o for o in self.unacked_read() if o < offset and self.keys[o] == key]
            assert not earlier, f"(e) offset {offset} of key {key!r} before {earlier}"
            owner = epoch.key_owner.setdefault(key, consumer_id)
            assert owner == consumer_id, (
                f"(e) key {key!r} moved from {owner} to {consumer_id} without a change"
            )
        epoch.in_flight[offset] = (consumer_id, self.now + self.policy.ack_timeout_ms)
        epoch.not_before.pop(offset, None)
        epoch.run_last = offset
        epoch.delivered.add(offset)
        self.received.setdefault(consumer_id, []).append(offset)

    def on_persist(
        self, cursor: int, attempts: tuple[tuple[int, int], ...] | None = None, *, flushing: bool
    ) -> None:
        assert cursor == self.cursor, f"(b) PersistCursor({cursor}) but the cursor is {self.cursor}"
        assert cursor > self.persisted or attempts is not None, (
            f"(b) PersistCursor({cursor}) after {self.persisted}, with no attempts"
        )
        if attempts is not None:
            live = self.live_attempts()
            assert dict(attempts) == live, f"(b) attempts {attempts} stored, not {live}"
            self.persisted_attempts = dict(attempts)
        last = self.epoch.persisted_at
        assert flushing or last is None or self.now >= last + self.policy.cursor_flush_ms, (
            f"(b) cursor persisted at {self.now}, within cursor_flush_ms of {last}"
        )
        if cursor > self.persisted:
            self.persisted_history.append(cursor)
        self.persisted = cursor
        self.epoch.persisted_at = self.now

    def idle_work(self) -> list[int]:
        """Read, unacknowledged offsets that could be in flight now but are not: none after
        any input (nothing waits for a tick it does not need).

        Exclusive/Failover: with an active consumer, everything, unless some failed offset's
        redelivery time is still to come (the run restarts only when all may go). Shared: the
        ones whose redelivery time (if any) has come, while anyone is connected. Key-Shared:
        the same, for the lowest unacknowledged offset of each key with nothing in flight and
        a connected consumer that accepts it."""
        epoch, now = self.epoch, self.now
        waiting = [o for o in self.unacked_read() if o not in epoch.in_flight]
        if self.sub_type in SINGLE_ACTIVE:
            if epoch.active is None or any(t > now for t in epoch.not_before.values()):
                return []
            return waiting
        due = [o for o in waiting if epoch.not_before.get(o, now) <= now]
        connected = [c for c in self.consumers.values() if c.connected]
        if self.sub_type is SubscriptionType.SHARED:
            return due if connected else []
        idle = []
        for offset in due:
            key = self.keys[offset]
            busy = any(self.keys[o] == key for o in epoch.in_flight)
            first = all(self.keys[o] != key for o in self.unacked_read() if o < offset)
            if not busy and first and any(c.accepts(key) for c in connected):
                idle.append(offset)
        return idle

    def read_stalled(self) -> bool:
        """A Read is due but missing: someone is connected, none is outstanding, records are
        readable, and the window has room for a quarter of itself (at least one) or for
        everything readable (the batching rule)."""
        epoch = self.epoch
        if epoch.request is not None or not any(c.connected for c in self.consumers.values()):
            return False
        available = self.readable_end - epoch.read_position
        free = self.policy.max_unacked - len(epoch.read - epoch.acked)
        return available > 0 and free >= min(max(1, self.policy.max_unacked // 4), available)

    def after_step(self) -> None:
        """Checks that hold between inputs."""
        epoch = self.epoch
        assert len(epoch.in_flight) <= self.policy.max_unacked, "(c) too many in flight"
        idle = self.idle_work()
        assert not idle, f"(a) offsets {idle} could be delivered at {self.now} but wait"
        assert not self.read_stalled(), "(a) records readable, room in the window, no Read"
        last = epoch.persisted_at
        assert not (
            self.cursor > self.persisted
            and (last is None or self.now >= last + self.policy.cursor_flush_ms)
        ), f"(b) cursor {self.cursor} not persisted in time (persisted {self.persisted})"
        stored = {o: f for o, f in self.persisted_attempts.items() if o > self.cursor}
        assert not (
            self.live_attempts() != stored
            and (last is None or self.now >= last + self.policy.cursor_flush_ms)
        ), f"(b) attempts {self.live_attempts()} not persisted in time (stored {stored})"
