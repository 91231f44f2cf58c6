"""Random runs of the load manager in a small world: a model store, brokers that register,
expire, drain, report load, seal what is moved off them and bounce what they may not take;
a watch that lags; transactions that run late (after the view or the leadership changed);
leadership that comes and goes; resyncs after a lost watch; manual rebalances.

Throughout a run:
1. an `Assign` or a `Move` target is a registered, active broker in the machine's view;
2. an `Assign` consumes a marker the view has, and only once it is ready (the previous owner
   has sealed the topic); a `FailOver` removes an assignment of a past incarnation: its broker
   is not registered, or registered after the assignment was written;
3. automatic moves never exceed `max_moves_per_hour` in any sliding hour;
4. no topic ever has two assignments in the store;
5. a follower emits nothing.
Then, with the world calmed down (this broker leading, one broker active, every message
delivered), every topic ends up assigned to exactly one registered broker: none is left
unassigned or with a dead broker. And the same inputs give the same effects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from danube.machines.cluster import keys
from danube.machines.cluster.keys import LEADER_KEY, Marker, MarkerReason
from danube.machines.cluster.load_manager import (
    HOUR_NS,
    NS_PER_S,
    Aggressiveness,
    Assign,
    Effect,
    FailOver,
    LoadManager,
    LoadManagerConfig,
    Move,
    RebalancingConfig,
    ScheduleTick,
)
from danube.machines.cluster.ranking import LoadReport, Resource, ResourceUsage, Strategy, TopicLoad
from danube.metadata.model import Compare, Delete, Put, WatchEvent
from danube.testing import DECISIONS, InstantStore

ME = "1"
BROKERS = ("1", "2", "3", "4")
TOPICS = (*(f"/ns/t{i}" for i in range(10)), "/other/x", "/other/y")
MODES = ("active", "draining", "drained")
UNIX = 1_700_000_000


def configs(*, busy: bool = False) -> st.SearchStrategy[LoadManagerConfig]:
    """Any configuration; `busy`: rebalancing on, checked often, with little to wait for, so
    that a run makes many automatic moves per hour."""
    return st.builds(
        lambda strategy, on, aggressiveness, every, cap, rest, old, blacklist, retry: (
            LoadManagerConfig(
                strategy,
                rebalancing=RebalancingConfig(
                    on, aggressiveness, every, cap, rest, 2, old, blacklist
                ),
                retry_ms=retry,
            )
        ),
        st.sampled_from(Strategy),
        st.just(True) if busy else st.booleans(),
        st.sampled_from(Aggressiveness),
        st.integers(1, 30 if busy else 120),
        st.integers(0, 4),
        st.integers(0, 10 if busy else 90),
        st.integers(0, 30 if busy else 200),
        st.sampled_from([(), ("/other/*",), ("/ns/t0",)]),
        st.integers(100, 3_000),
    )


broker = st.sampled_from(BROKERS)
pump = st.tuples(st.just("pump"))
"""Deliver everything, run every transaction, let brokers work: one round of progress."""
operations = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(TOPICS)),
    st.tuples(st.just("register"), broker),
    st.tuples(st.just("register"), broker),
    st.tuples(st.just("expire"), broker),
    st.tuples(st.just("restart"), broker),
    st.tuples(st.just("mode"), broker, st.sampled_from(MODES)),
    st.tuples(st.just("report"), broker, st.integers(0, 100)),
    st.tuples(st.just("report"), broker, st.integers(0, 100)),
    st.tuples(st.just("unload"), st.sampled_from(TOPICS)),
    st.tuples(st.just("brokers")),
    st.tuples(st.just("deliver"), st.integers(1, 20)),
    st.tuples(st.just("apply"), st.integers(1, 5)),
    st.tuples(st.just("advance"), st.integers(0, 1_500)),
    st.tuples(st.just("advance"), st.integers(0, 60)),
    st.tuples(st.just("leader"), st.booleans()),
    st.tuples(st.just("resync")),
    st.tuples(st.just("trigger"), st.none() | st.integers(1, 3)),
    pump,
    pump,
    pump,
)
runs = st.tuples(
    st.lists(st.sampled_from(TOPICS), unique=True, min_size=4),
    st.lists(operations, min_size=5, max_size=80),
)
"""Topics created at the start, then the operations."""


@dataclass
class World:
    config: LoadManagerConfig
    store: InstantStore = field(default_factory=InstantStore)
    now: int = 0
    delivered: int = 0
    queue: list[Any] = field(default_factory=list)
    """Transactions emitted and not yet run."""
    tick_at: int | None = None
    trace: list[tuple[int, Effect]] = field(default_factory=list)
    created: set[str] = field(default_factory=set)
    incarnation: dict[str, int] = field(default_factory=dict)
    """Registered brokers → store revision at which they registered."""
    loaded: dict[str, set[str]] = field(default_factory=dict)
    """Assignments each broker has taken on: only those written after it registered, since a
    new incarnation starts without topics (spec/cluster.md, "Fail-over")."""
    seen_registered: dict[str, int] = field(default_factory=dict)
    seen_modes: dict[str, str] = field(default_factory=dict)
    seen_assignments: dict[tuple[str, str], int] = field(default_factory=dict)
    seen_markers: dict[str, Marker] = field(default_factory=dict)
    """The machine's view, rebuilt independently from what it was given."""

    def __post_init__(self) -> None:
        self.machine = LoadManager(ME, self.config)
        self.store.put(LEADER_KEY, "other")

    # -- the machine's side ----------------------------------------------------------------

    def call(self, effects: list[Effect]) -> None:
        if not self.machine.leading:
            assert effects == [], f"a follower emitted {effects}"
        for effect in effects:
            self.trace.append((self.now, effect))
            if isinstance(effect, DECISIONS):
                self.check_decision(effect)
                self.queue.append(effect)
            elif isinstance(effect, ScheduleTick):
                self.tick_at = effect.at

    def check_decision(self, effect: Any) -> None:
        active = {b for b in self.seen_registered if self.seen_modes.get(b, "active") == "active"}
        if isinstance(effect, Assign):
            assert effect.broker in active, f"{effect.topic} assigned to inactive {effect.broker}"
            marker = self.seen_markers.get(effect.topic)
            assert marker is not None and marker.ready, f"{effect.topic}: {marker} not ready"
        elif isinstance(effect, Move):
            assert effect.to_broker in active and effect.to_broker != effect.from_broker
        elif isinstance(effect, FailOver):
            written = self.seen_assignments.get((effect.broker, effect.topic))
            registered = self.seen_registered.get(effect.broker)
            assert written is not None, f"{effect} of an assignment not in the view"
            assert registered is None or registered > written, f"{effect} of a live assignment"

    def see(self, event: WatchEvent) -> None:
        if (b := keys.parse_register_key(event.key)) is not None:
            if event.kind == "put":
                self.seen_registered[b] = event.mod_revision
            else:
                self.seen_registered.pop(b, None)
        elif (pair := keys.parse_assignment_key(event.key)) is not None:
            if event.kind == "put":
                self.seen_assignments[pair] = event.mod_revision
            else:
                self.seen_assignments.pop(pair, None)
        elif (topic := keys.parse_unassigned_key(event.key)) is not None:
            if event.kind == "put":
                self.seen_markers[topic] = Marker.from_json(event.value)
            else:
                self.seen_markers.pop(topic, None)
        elif (b := keys.parse_state_key(event.key)) is not None:
            mode = keys.broker_mode(event.value) if event.kind == "put" else None
            if mode is None:
                self.seen_modes.pop(b, None)
            else:
                self.seen_modes[b] = mode

    def deliver(self, count: int) -> None:
        for event in self.store.events[self.delivered : self.delivered + count]:
            self.delivered += 1
            self.see(event)
            self.call(self.machine.observe(event, self.now))

    def apply(self, count: int) -> None:
        for effect in self.queue[:count]:
            self.store.txn(effect.compares, effect.ops)
            self.check_single_owners()
        del self.queue[:count]

    def advance(self, seconds: int) -> None:
        self.now += seconds * NS_PER_S
        if self.tick_at is not None and self.tick_at <= self.now:
            self.tick_at = None
            self.call(self.machine.tick(self.now, unix_s=UNIX + self.now // NS_PER_S))

    def lead(self, leading: bool) -> None:
        if leading == self.machine.leading:
            return
        self.store.put(LEADER_KEY, ME if leading else "other")
        if leading:
            self.call(self.machine.became_leader(self.now))
        else:
            self.call(self.machine.lost_leadership(self.now))
            self.tick_at = None

    def resync(self) -> None:
        self.delivered = len(self.store.events)  # whatever was not delivered is lost
        data = self.store.data
        self.seen_registered = {
            b: data[keys.register_key(b)].mod_revision
            for b in BROKERS
            if keys.register_key(b) in data
        }
        self.seen_assignments = {
            pair: kv.mod_revision
            for key, kv in data.items()
            if (pair := keys.parse_assignment_key(key)) is not None
        }
        self.seen_modes = {}
        self.seen_markers = {
            t: Marker.from_json(self.store.value(keys.unassigned_key(t)))
            for t in TOPICS
            if keys.unassigned_key(t) in self.store.data
        }
        for b in BROKERS:
            if keys.state_key(b) in self.store.data:
                mode = keys.broker_mode(self.store.value(keys.state_key(b)))
                if mode is not None:
                    self.seen_modes[b] = mode
        self.call(self.machine.resync(self.store.snapshot(), self.now))

    # -- the rest of the world -------------------------------------------------------------

    def register(self, b: str) -> None:
        if b in self.incarnation:
            return
        self.store.put(keys.register_key(b), {"broker_url": f"http://{b}:6650"})
        self.incarnation[b] = self.store.revision
        self.loaded[b] = set()

    def expire(self, b: str) -> None:
        if b not in self.incarnation:
            return
        del self.incarnation[b]
        del self.loaded[b]
        self.store.txn((), (Delete(keys.register_key(b)), Delete(keys.load_key(b))))

    def set_mode(self, b: str, mode: str) -> None:
        self.store.put(keys.state_key(b), {"mode": mode})

    def report(self, b: str, cpu: int) -> None:
        if b not in self.incarnation:
            return
        topics = tuple(
            TopicLoad(t, byte_rate=cpu * 10_000 * (i + 1), producer_count=i % 3)
            for i, t in enumerate(self.assigned_to(b))
        )
        usage = (ResourceUsage(Resource.CPU, cpu), ResourceUsage(Resource.MEMORY, cpu / 2))
        report = LoadReport(b, usage, topics, sum(t.byte_rate for t in topics) / 1e6, timestamp=1)
        self.store.put(keys.load_key(b), report.to_json())

    def create(self, topic: str) -> None:
        if topic not in self.created:
            self.created.add(topic)
            self.store.put(keys.unassigned_key(topic), None)

    def unload(self, topic: str) -> None:
        owners = self.store.owners(topic)
        if len(owners) == 1 and owners[0] in self.incarnation:
            b = owners[0]
            value = {"reason": "unload", "from_broker": keys.broker_id_to_json(b), "ready": False}
            self.store.txn(
                (),
                (Put(keys.unassigned_key(topic), value), Delete(keys.assignment_key(b, topic))),
            )
            self.loaded[b].discard(topic)

    def brokers_work(self) -> bool:
        """Each live broker seals what was moved off it and bounces what it may not take.
        Returns whether anything happened."""
        acted = False
        for key, kv in sorted(self.store.data.items()):
            topic = keys.parse_unassigned_key(key)
            if topic is None:
                continue
            marker = Marker.from_json(kv.value)
            b = marker.from_broker
            if (
                not marker.ready
                and b in self.incarnation
                and kv.mod_revision > self.incarnation[b]  # a restarted broker forgets
                and b not in self.store.owners(topic)
            ):
                self.loaded[b].discard(topic)
                ready = {**kv.value, "ready": True}
                self.store.txn(
                    (Compare(key, "mod_revision", "==", kv.mod_revision),), (Put(key, ready),)
                )
                acted = True
        for b in sorted(self.incarnation):
            self.loaded[b] &= set(self.assigned_to(b))
            mode = self.store.data.get(keys.state_key(b))
            active = mode is None or keys.broker_mode(mode.value) in (None, "active")
            for topic in self.assigned_to(b):
                written = self.store.data[keys.assignment_key(b, topic)].mod_revision
                if topic in self.loaded[b] or written < self.incarnation[b]:
                    continue
                acted = True
                if active:
                    self.loaded[b].add(topic)
                else:
                    assignment = keys.assignment_key(b, topic)
                    redirect = {
                        "reason": "drain_redirect",
                        "from_broker": keys.broker_id_to_json(b),
                    }
                    self.store.txn(
                        (Compare(assignment, "version", ">", 0),),
                        (Delete(assignment), Put(keys.unassigned_key(topic), redirect)),
                    )
        return acted

    def assigned_to(self, b: str) -> list[str]:
        return sorted(t for t in TOPICS if b in self.store.owners(t))

    def check_single_owners(self) -> None:
        for topic in TOPICS:
            assert len(self.store.owners(topic)) <= 1, f"{topic}: {self.store.owners(topic)}"

    # -- running ---------------------------------------------------------------------------

    def step(self, op: tuple[Any, ...]) -> None:
        match op:
            case ("create", topic):
                self.create(topic)
            case ("register", b):
                self.register(b)
            case ("expire", b):
                self.expire(b)
            case ("restart", b):  # the lease expires and the broker is straight back
                self.expire(b)
                self.register(b)
            case ("mode", b, mode):
                self.set_mode(b, mode)
            case ("report", b, cpu):
                self.report(b, cpu)
            case ("unload", topic):
                self.unload(topic)
            case ("brokers",):
                self.brokers_work()
            case ("deliver", count):
                self.deliver(count)
            case ("apply", count):
                self.apply(count)
            case ("advance", seconds):
                self.advance(seconds)
            case ("leader", leading):
                self.lead(leading)
            case ("resync",):
                self.resync()
            case ("pump",):
                self.deliver(len(self.store.events))
                self.apply(len(self.queue))
                self.deliver(len(self.store.events))
                self.brokers_work()
            case ("trigger", max_moves):
                unix_s = UNIX + self.now // NS_PER_S
                self.call(self.machine.trigger_rebalance(max_moves, self.now, unix_s=unix_s))
        self.check_single_owners()

    def calm(self) -> None:
        """Stops the faults and runs until nothing is left to do (bounded)."""
        self.lead(True)
        if not any(
            self.store.data.get(keys.state_key(b)) is None
            or keys.broker_mode(self.store.value(keys.state_key(b))) in (None, "active")
            for b in self.incarnation
        ):
            self.register("4")
            self.set_mode("4", "active")
        for _ in range(1_000):
            busy = bool(self.queue) or self.delivered < len(self.store.events)
            self.apply(len(self.queue))
            self.deliver(len(self.store.events))
            busy = self.brokers_work() or busy
            if not busy and self.settled():
                return
            self.advance(1)
        raise AssertionError("the world did not settle")

    def settled(self) -> bool:
        """No marker left, and every topic served by the current incarnation of its owner."""
        if any(k.startswith(keys.UNASSIGNED_PREFIX) for k in self.store.data):
            return False
        for topic in self.created:
            owners = self.store.owners(topic)
            if len(owners) != 1 or topic not in self.loaded.get(owners[0], set()):
                return False
        return True


Run = tuple[list[str], list[tuple[Any, ...]]]


def play(config: LoadManagerConfig, run: Run) -> World:
    world = World(config)
    world.register("1")
    world.resync()
    world.lead(True)
    topics, ops = run
    for topic in topics:  # all on broker 1, then 2 joins: work for rebalancing
        world.create(topic)
    world.step(("pump",))
    world.register("2")
    for op in ops:
        world.step(op)
    return world


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), runs)
def test_every_topic_ends_on_one_live_broker(config: LoadManagerConfig, run: Run) -> None:
    world = play(config, run)
    world.calm()
    for topic in sorted(world.created):
        (owner,) = world.store.owners(topic)
        assert owner in world.incarnation, f"{topic} is left with dead broker {owner}"
        assert topic in world.loaded[owner], f"{topic} is left with a past incarnation of {owner}"
    assert all(owner in world.incarnation for t in TOPICS for owner in world.store.owners(t))
    assert not [t for t in TOPICS if t not in world.created and world.store.owners(t)]


@settings(max_examples=60, deadline=None)
@given(configs(busy=True), runs)
@example(  # a manual run that moved topics back and forth for ever (weighted load's 40/15)
    LoadManagerConfig(
        Strategy.WEIGHTED_LOAD,
        rebalancing=RebalancingConfig(True, Aggressiveness.CONSERVATIVE, 22, 0, 0, 2, 0, ()),
        retry_ms=107,
    ),
    (
        ["/ns/t0", "/ns/t7", "/ns/t9", "/ns/t2", "/ns/t8", "/other/y", "/ns/t3"],
        [("deliver", 17), ("deliver", 17), ("deliver", 17), ("deliver", 17), ("trigger", None)],
    ),
)
def test_automatic_moves_respect_the_hourly_cap(config: LoadManagerConfig, run: Run) -> None:
    world = play(config, run)
    world.calm()
    assert config.rebalancing is not None
    cap = config.rebalancing.max_moves_per_hour
    times = [t for t, e in world.trace if isinstance(e, Move) and not e.manual]
    for i, t in enumerate(times):
        assert sum(1 for u in times[: i + 1] if u > t - HOUR_NS) <= cap


@settings(max_examples=30, deadline=None)
@given(configs(), runs)
def test_same_inputs_same_effects(config: LoadManagerConfig, run: Run) -> None:
    """Catches state that outlives a machine (globals, class attributes). Both plays share
    one string-hash seed, so set-order dependence cannot show here: the cluster run does that
    across processes (tests/sim/test_cluster_sim.py, `any_process`)."""
    first, second = play(config, run), play(config, run)
    first.calm()
    second.calm()
    assert first.trace == second.trace


def test_the_world_can_rebalance_and_fail_over() -> None:
    """The random runs above are only as good as what they reach: one run that does both."""
    config = LoadManagerConfig(
        Strategy.FAIR,
        rebalancing=RebalancingConfig(True, check_interval_seconds=10, min_topic_age_seconds=0),
        retry_ms=500,
    )
    ops: list[tuple[Any, ...]] = [("create", t) for t in TOPICS]
    ops += [("deliver", 50), ("apply", 50), ("deliver", 50), ("apply", 50), ("deliver", 50)]
    ops += [("register", "3"), ("deliver", 5), ("advance", 100)]
    ops += [("apply", 5), ("deliver", 20), ("brokers",), ("deliver", 20), ("apply", 5)]
    ops += [("expire", "2"), ("deliver", 20), ("apply", 20), ("deliver", 50), ("apply", 20)]
    world = play(config, ([], ops))
    world.calm()
    kinds = {type(e) for _, e in world.trace}
    assert {Assign, Move, FailOver} <= kinds
    assert sorted(world.created) == sorted(TOPICS)
    assert all(world.store.owners(t) != ["2"] for t in TOPICS)
    reasons = {e.reason for _, e in world.trace if isinstance(e, Assign)}
    assert {MarkerReason.NEW, MarkerReason.REBALANCE} <= reasons
