"""Property tests of reliable dispatch: random interleavings of membership changes, publishes,
partial and shuffled read answers, acks and nacks (late, duplicate and bogus ones included),
clock jumps past ack deadlines and redelivery times, cursor flushes and crashes, with every
effect judged by the reference model in `spec/models/dispatch_model.py`.

A crash rebuilds the machine from the last `PersistCursor` (its cursor and failure counts),
as a broker restart does. Every
run ends by draining: a consumer that accepts everything connects and acknowledges whatever
it gets while the clock runs on, and every readable offset must end up acknowledged (the
"eventually delivered" half of at-least-once).
"""

from __future__ import annotations

import random
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from danube.machines.dispatch.reliable import (
    Backoff,
    Deliver,
    Effect,
    FailurePolicy,
    PersistCursor,
    Read,
    ReliableSubscription,
)
from danube.machines.dispatch.types import SubscriptionType
from spec.models.dispatch_model import ModelPolicy, ReliableDispatchModel, glob_accepts
from tests.dispatch.reference import glob_match

KEYS = [b"", b"a", b"b", b"ab", b"ba", b"order-1", b"order-2"]
PATTERNS = ["*", "a*", "b?", "?", "order-*", "ab", "zz"]
DRAIN_ROUNDS = 600


class ReliableDispatchMachine(RuleBasedStateMachine):
    """One reliable subscription of a random type and policy, against the model."""

    @initialize(
        sub_type=st.sampled_from(list(SubscriptionType)),
        max_unacked=st.integers(1, 6),
        ack_timeout=st.integers(20, 300),
        base_delay=st.sampled_from([0, 5, 60]),
        max_delay=st.sampled_from([0, 40, 250]),
        backoff=st.sampled_from(list(Backoff)),
        flush_ms=st.integers(0, 200),
        start=st.integers(0, 3),
        consumers=st.integers(1, 3),
        eager_reads=st.booleans(),
    )
    def setup(
        self,
        sub_type: SubscriptionType,
        max_unacked: int,
        ack_timeout: int,
        base_delay: int,
        max_delay: int,
        backoff: Backoff,
        flush_ms: int,
        start: int,
        consumers: int,
        eager_reads: bool,
    ) -> None:
        """With `eager_reads` the driver answers every Read in full at once (the records
        are in the cache); otherwise `answer_read` answers them, partially or shuffled."""
        self.sub_type = sub_type
        self.max_unacked = max_unacked
        self.flush_ms = flush_ms
        self.policy = FailurePolicy(ack_timeout, base_delay, max_delay, backoff)
        self.model = ReliableDispatchModel(
            sub_type,
            start,
            ModelPolicy(
                max_unacked,
                ack_timeout,
                base_delay,
                max_delay,
                backoff is Backoff.EXPONENTIAL,
                flush_ms,
            ),
        )
        self.now = 1_000
        self.sub = self.build(start)
        self.pending: Read | None = None
        self.next_consumer = 1
        self.last_cursor = start - 1
        self.eager_reads = eager_reads
        if sub_type is SubscriptionType.EXCLUSIVE:
            consumers = min(consumers, 1)
        for _ in range(consumers):
            self.do_connect(self.add(()))

    def build(self, start: int, attempts: dict[int, int] | None = None) -> ReliableSubscription:
        return ReliableSubscription(
            self.sub_type,
            start,
            max_unacked_messages=self.max_unacked,
            cursor_flush_ms=self.flush_ms,
            policy=self.policy,
            attempts=attempts,
        )

    # -- plumbing -----------------------------------------------------------------------------

    def apply(self, effects: list[Effect], *, flushing: bool = False) -> None:
        """Judges the effects of one input, in order, as the driver would perform them."""
        for effect in effects:
            if isinstance(effect, Read):
                self.model.on_read(effect.from_offset, effect.max_records)
                self.pending = effect
            elif isinstance(effect, Deliver):
                self.model.on_deliver(effect.consumer_id, effect.offsets)
            else:
                assert isinstance(effect, PersistCursor)
                self.model.on_persist(effect.cursor, effect.attempts, flushing=flushing)
        self.model.after_step()
        if self.eager_reads and self.pending is not None:
            start, count = self.pending.from_offset, self.pending.max_records
            self.answer(self.true_entries(list(range(start, start + count))))

    def consumer(self, index: int) -> int:
        ids = list(self.model.consumers)
        return ids[index % len(ids)]

    def in_flight(self) -> list[int]:
        return sorted(self.model.epoch.in_flight)

    def connected(self) -> list[int]:
        return [c for c, state in self.model.consumers.items() if state.connected]

    def add(self, filters: tuple[str, ...]) -> int:
        consumer_id = self.next_consumer
        self.next_consumer += 1
        self.model.advance(self.now)
        self.model.add_consumer(consumer_id, f"consumer-{consumer_id}", filters)
        self.apply(self.sub.add_consumer(consumer_id, f"consumer-{consumer_id}", filters, self.now))
        return consumer_id

    def do_connect(self, consumer_id: int) -> None:
        self.model.advance(self.now)
        self.model.connect(consumer_id)
        self.apply(self.sub.connect(consumer_id, self.now))

    def do_disconnect(self, consumer_id: int) -> None:
        self.model.advance(self.now)
        self.model.disconnect(consumer_id)
        self.apply(self.sub.disconnect(consumer_id, self.now))

    def do_remove(self, consumer_id: int) -> None:
        self.model.advance(self.now)
        self.model.remove_consumer(consumer_id)
        self.apply(self.sub.remove_consumer(consumer_id, self.now))

    def do_ack(self, offset: int) -> None:
        self.model.advance(self.now)
        self.model.ack(offset)
        self.apply(self.sub.ack(offset, self.now))

    def do_tick(self) -> None:
        self.model.advance(self.now)
        self.apply(self.sub.tick(self.now))

    def answer(self, entries: list[tuple[int, bytes]]) -> None:
        self.pending = None
        self.model.advance(self.now)
        self.model.answer_read(entries)
        self.apply(self.sub.records_read(entries, self.now))

    def true_entries(self, offsets: list[int]) -> list[tuple[int, bytes]]:
        """What a driver reads: the real key of every offset that exists."""
        return [(o, self.model.keys[o]) for o in offsets if 0 <= o < self.model.readable_end]

    # -- membership ---------------------------------------------------------------------------

    @precondition(lambda self: len(self.model.consumers) < 4)
    @rule(filters=st.lists(st.sampled_from(PATTERNS), max_size=2), connect=st.booleans())
    def add_consumer(self, filters: list[str], connect: bool) -> None:
        if self.sub_type is SubscriptionType.EXCLUSIVE:
            # as the broker core: a new name only once the holder is disconnected, which
            # removes it
            if self.connected():
                return
            for consumer_id in list(self.model.consumers):
                self.do_remove(consumer_id)
        if self.sub_type is not SubscriptionType.KEY_SHARED:
            filters = []
        consumer_id = self.add(tuple(filters))
        if connect:
            self.do_connect(consumer_id)

    @precondition(lambda self: self.model.consumers)
    @rule(
        action=st.sampled_from(["connect", "connect", "disconnect", "takeover", "remove"]),
        index=st.integers(0, 7),
        filters=st.lists(st.sampled_from(PATTERNS), max_size=2),
    )
    def membership(self, action: str, index: int, filters: list[str]) -> None:
        """A stream opens or ends, a new stream replaces the old one (takeover), a consumer
        leaves; on Key-Shared a takeover may bring new filters."""
        consumer_id = self.consumer(index)
        if action == "connect":
            self.do_connect(consumer_id)
        elif action == "disconnect":
            self.do_disconnect(consumer_id)
        elif action == "remove":
            self.do_remove(consumer_id)
        else:
            self.do_disconnect(consumer_id)
            if self.sub_type is SubscriptionType.KEY_SHARED:
                self.model.advance(self.now)
                self.model.set_filters(consumer_id, tuple(filters))
                self.apply(self.sub.set_filters(consumer_id, tuple(filters), self.now))
            self.do_connect(consumer_id)

    # -- the WAL and the reader ---------------------------------------------------------------

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=10))
    def publish(self, keys: list[bytes]) -> None:
        self.model.advance(self.now)
        self.model.publish(keys)
        self.apply(self.sub.readable(self.model.readable_end - 1, self.now))

    @rule(
        count=st.sampled_from([None, None, 0, 1, 2, 3]),
        bogus=st.lists(st.integers(-2, 60), max_size=3),
        shuffle=st.randoms(use_true_random=False),
    )
    def answer_read(self, count: int | None, bogus: list[int], shuffle: random.Random) -> None:
        """Answers the outstanding Read in full (None), with its first `count` records or
        none, in any order, maybe with offsets nobody asked for; with no Read outstanding
        the answer is stale or garbage."""
        run = []
        if self.pending is not None:
            start, asked = self.pending.from_offset, self.pending.max_records
            run = list(range(start, start + (asked if count is None else min(count, asked))))
        entries = self.true_entries(run + bogus)
        shuffle.shuffle(entries)
        self.answer(entries)

    # -- consumers' replies -------------------------------------------------------------------

    def pick(self, kind: str, index: int) -> int:
        """An offset in flight, waiting to be (re)sent, ever delivered (late, duplicate, from
        before a crash), or one that may not exist."""
        epoch = self.model.epoch
        if kind == "in flight":
            offsets = self.in_flight()
        elif kind == "waiting":
            offsets = sorted(epoch.read - epoch.acked - set(epoch.in_flight))
        elif kind == "delivered":
            offsets = sorted({o for got in self.model.received.values() for o in got})
        else:
            offsets = []
        return offsets[index % len(offsets)] if offsets else index - 3

    @rule(
        replies=st.lists(
            st.tuples(
                st.sampled_from(["ack", "ack", "nack"]),
                st.sampled_from(["in flight"] * 3 + ["waiting", "delivered", "bogus"]),
                st.integers(0, 80),
                st.none() | st.integers(0, 400),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def reply(self, replies: list[tuple[str, str, int, int | None]]) -> None:
        """Acks and nacks (with or without a delay) of offsets picked by `pick`."""
        for verb, kind, index, delay in replies:
            offset = self.pick(kind, index)
            if verb == "ack":
                self.do_ack(offset)
            else:
                self.model.advance(self.now)
                self.model.nack(offset, delay)
                self.apply(self.sub.nack(offset, delay, self.now))

    # -- time, unloads and crashes ------------------------------------------------------------

    @rule(
        step=st.sampled_from([0, 1, 5, 20, 60, 150, 301, 1_000, "timer"]),
        nudge=st.sampled_from([-1, 0, 0, 1]),
        tick=st.booleans(),
    )
    def clock(self, step: int | str, nudge: int, tick: bool) -> None:
        """The clock moves on, or to the machine's next timer exactly (or just before or
        after it); without a tick the next input (an ack at its deadline, say) finds the
        timer due."""
        timer = self.sub.next_timer_ms
        if step != "timer":
            self.now += int(step)
        elif timer is not None:
            self.now = max(self.now, timer + nudge)
        if tick:
            self.do_tick()

    def do_flush(self) -> None:
        self.model.advance(self.now)
        self.apply(self.sub.flush(self.now), flushing=True)
        assert self.model.persisted == self.model.cursor
        stored = self.model.persisted_attempts
        assert {o: f for o, f in stored.items() if o > self.model.cursor} == (
            self.model.live_attempts()
        ), "(b) a flush left failure counts unstored"

    @rule(action=st.sampled_from(["flush", "unload", "crash"]))
    def stop(self, action: str) -> None:
        """A cursor flush; or the machine stops — a topic unload (flushed) or a broker crash
        — and a new one resumes at the last persisted cursor, where the consumers that were
        connected reconnect."""
        if action != "crash":
            self.do_flush()
        if action == "flush":
            return
        reconnecting = self.connected()
        self.model.crash()
        self.sub = self.build(self.model.persisted + 1, self.model.persisted_attempts)
        self.pending = None
        self.last_cursor = self.model.persisted
        for consumer_id, state in self.model.consumers.items():
            self.apply(self.sub.add_consumer(consumer_id, state.name, state.filters, self.now))
        if self.model.readable_end > self.model.persisted + 1:
            self.apply(self.sub.readable(self.model.readable_end - 1, self.now))
        for consumer_id in reconnecting:
            self.do_connect(consumer_id)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        """(b) cursor, (c) window, in-flight sets and the active consumer."""
        sub, model = self.sub, self.model
        assert sub.cursor == model.cursor
        assert sub.cursor >= self.last_cursor, "(b) the cursor moved back"
        self.last_cursor = sub.cursor
        assert sub.cursor >= model.persisted
        assert model.persisted_history == sorted(set(model.persisted_history))
        assert sub.window_size <= self.max_unacked
        assert sub.readable_end == max(model.readable_end, model.epoch.base)
        assert sub.consumer_ids == list(model.consumers)
        for consumer_id, state in model.consumers.items():
            assert sub.is_connected(consumer_id) == state.connected
            assert sub.in_flight(consumer_id) == model.in_flight_to(consumer_id)
        if self.sub_type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            assert sub.active_consumer == model.epoch.active
        timer = sub.next_timer_ms
        assert timer is None or timer > model.now, "a timer in the past would spin the driver"
        if model.epoch.in_flight:
            deadline = min(d for _, d in model.epoch.in_flight.values())
            assert timer is not None and timer <= deadline, "a deadline would be missed"

    # -- liveness -----------------------------------------------------------------------------

    def teardown(self) -> None:
        if sys.exc_info()[1] is not None or not hasattr(self, "sub"):
            return  # a rule failed: report that, not a drain failure
        self.drain()

    def drain(self) -> None:
        """(a) every readable offset is eventually acknowledged: one consumer that accepts
        every key connects, every answer is complete and every delivery acknowledged."""
        if self.sub_type is SubscriptionType.KEY_SHARED or not self.connected():
            if self.sub_type is SubscriptionType.EXCLUSIVE:
                for consumer_id in list(self.model.consumers):
                    self.do_remove(consumer_id)
            self.do_connect(self.add(()))
        end = self.model.readable_end - 1
        wait = self.policy.ack_timeout_ms + self.policy.max_redelivery_delay_ms + self.flush_ms
        for _ in range(DRAIN_ROUNDS):
            if self.model.cursor == end and self.model.persisted == end:
                break
            if self.pending is not None:
                start = self.pending.from_offset
                self.answer(self.true_entries(list(range(start, start + self.pending.max_records))))
            for offset in self.in_flight():
                self.do_ack(offset)
            self.now += wait + 1
            self.do_tick()
        assert self.model.cursor == end, (
            f"(a) stuck at cursor {self.model.cursor}, readable through {end}"
        )
        assert self.model.persisted == end, "(b) the final cursor was never persisted"
        assert self.sub.window_size == 0


TestReliableDispatch = ReliableDispatchMachine.TestCase
TestReliableDispatch.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@given(
    pattern=st.lists(st.sampled_from(b"*?ab"), max_size=6).map(bytes),
    key=st.lists(st.sampled_from(b"ab*?"), max_size=6).map(bytes),
)
def test_the_models_glob_agrees_with_the_reference_matcher(pattern: bytes, key: bytes) -> None:
    """The model judges Key-Shared filters with its own matcher; it must be the same rule."""
    assert glob_accepts(pattern, key) == glob_match(pattern, key)
