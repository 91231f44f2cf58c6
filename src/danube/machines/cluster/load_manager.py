"""The load manager as a pure state machine (spec/cluster.md, "Load manager").

Every broker runs one and keeps its view of the cluster current from the watch of `/cluster/`:
registrations, broker states, load reports, assignments and unassigned markers. Only the leader
acts; a follower's view is simply ready when it is elected. The leader assigns unassigned
topics (Danube's threshold and round-robin rule over the configured ranking), moves one topic
at a time off overloaded brokers when the coefficient of variation of the scores says the
cluster is uneven, and fails over every assignment of a past incarnation of a broker (its
registration lease expired, or it registered again since the assignment was written).
It also keeps each topic's replica set (issue 27, `danube.machines.cluster.replicas`): an
`Assign` creates it with followers placed by load, `SetFollowers` replaces a gone follower,
and a failed-over topic with an in-sync set recorded goes only to an active in-sync member.
Each decision is one `MetaTxn`-like effect (`Assign`, `Move`, `FailOver`, `Release`): compares
plus operations the driver runs as one transaction. The outcome is not reported back: it shows
in the watch like any other change, and a decision that did not show in time is made again.

**Fencing.** Every transaction compares `/cluster/leader` with this broker's id. The leader
key lives under the leader's lease (spec/cluster.md, "Registration and leader election"), so a
deposed leader acting on a stale view cannot write: the key is gone or names another broker.
Each transaction also compares the revision of the exact key its decision was read from, so a
decision taken on a view the store has since moved past fails instead of acting twice:

- `Assign` requires the unassigned marker at the `mod_revision` it saw. A marker rewritten
  meanwhile (an unload that became ready, a new marker) or already consumed (the topic was
  assigned) makes it fail; the new marker, if any, arrives in the watch and is decided afresh.
- `Move` requires the source's assignment at the revision it saw and no unassigned marker, so a
  topic is never moved twice, nor moved after its owner changed or while it is unassigned.
- `FailOver` requires the stale assignment at the revision it saw: a topic failed over, then
  assigned to the broker's new incarnation, is not taken away again by a late retry.
- `Release` (a half-finished unload whose broker is gone) requires the marker as it saw it.

The driver must feed the events of one watch on `/cluster/` in revision order (etcd's watch
guarantees it), so that the view is always the store at some revision. Inputs take `now`, the
monotonic clock in nanoseconds; the inputs that may move a topic also take the wall clock in
Unix seconds (`unix_s`) for the audit record. Nothing here is random: every iteration that
produces effects is in sorted order, so the same inputs give the same effects on every replica
and under every hash seed.

Its configuration is a value (`danube.values.load_manager_config`) and its effects have a module
of their own (`danube.machines.cluster.load_manager_effects`); both are re-exported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from danube import keys
from danube.machines.cluster import rebalancing, records, replicas
from danube.machines.cluster.load_manager_effects import Assign as Assign
from danube.machines.cluster.load_manager_effects import Effect as Effect
from danube.machines.cluster.load_manager_effects import FailOver as FailOver
from danube.machines.cluster.load_manager_effects import Log as Log
from danube.machines.cluster.load_manager_effects import MarkDrained as MarkDrained
from danube.machines.cluster.load_manager_effects import Move as Move
from danube.machines.cluster.load_manager_effects import Proposal as Proposal
from danube.machines.cluster.load_manager_effects import Release as Release
from danube.machines.cluster.load_manager_effects import ScheduleTick as ScheduleTick
from danube.machines.cluster.load_manager_effects import SetFollowers as SetFollowers
from danube.machines.cluster.load_manager_effects import Txn as Txn
from danube.machines.cluster.ranking import (
    BrokerLoad,
    Imbalance,
    LoadReport,
    TopicLoad,
    imbalance,
    ranking,
    scores,
)
from danube.machines.cluster.records import Marker, MarkerReason
from danube.metadata.model import Compare, Delete, KeyValue, Put, WatchEvent
from danube.values.load_manager_config import Aggressiveness as Aggressiveness
from danube.values.load_manager_config import LoadManagerConfig as LoadManagerConfig
from danube.values.load_manager_config import RebalancingConfig as RebalancingConfig

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
HOUR_NS = 3600 * NS_PER_S

# -- the machine --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    """An unassigned marker as last seen."""

    marker: Marker
    revision: int
    due: int
    """Decide (again) from this time on: at once when seen, `retry_ms` after a decision."""
    planned: str | None = None
    """The broker of the `Assign` in flight; its load counts the topic meanwhile."""
    stalled: str | None = None
    """Why the topic waits, once logged."""

    def target(self) -> str | None:
        """The broker expected to get the topic, whose load already counts it."""
        if self.planned is not None:
            return self.planned
        return self.marker.to_broker if self.marker.reason is MarkerReason.REBALANCE else None


@dataclass(slots=True)
class _Owned:
    revision: int
    """`mod_revision` of the assignment key."""
    since: int
    """When this view first saw the assignment: the topic's age on its broker."""


class LoadManager:
    """One broker's load manager; `broker_id` is this broker (the leader key's value)."""

    def __init__(self, broker_id: str, config: LoadManagerConfig) -> None:
        self.broker_id = broker_id
        self.config = config
        self.leading = False
        self._leader_compare = records.leader_compare(broker_id)
        self._retry_ns = config.retry_ms * NS_PER_MS
        self._registered: dict[str, int] = {}
        """broker → `mod_revision` of its registration."""
        self._addresses: dict[str, Any] = {}
        """broker → its registration's value (its URLs): lookups answer from the view."""
        self._modes: dict[str, str] = {}
        self._state_revisions: dict[str, int] = {}
        """broker → `mod_revision` of its state key."""
        self._drain_due: dict[str, int] = {}
        """Draining brokers found empty → when to (re)send their `MarkDrained`."""
        self._reports: dict[str, LoadReport] = {}
        self._topic_loads: dict[str, dict[str, TopicLoad]] = {}
        self._owners: dict[str, dict[str, _Owned]] = {}
        """topic → broker → assignment (one broker, unless the store is inconsistent)."""
        self._owned: dict[str, dict[str, _Owned]] = {}
        """broker → topic → assignment: the same entries, indexed the other way."""
        self._pending: dict[str, _Pending] = {}
        self._expected: dict[str, set[str]] = {}
        """broker → pending topics whose `target` it is."""
        self._counted: dict[str, dict[str, int]] = {}
        """broker → the topics its load counts (assigned to it, or on their way to it) → in
        how many of the two (1 or 2). Kept by each change, so that an observation costs its
        change and not the broker's every topic (issue 23 point 4: rescoring at every change
        was 15 % of a failing-over leader's main thread)."""
        self._weighted: dict[str, dict[str, TopicLoad]] = {}
        """broker → its counted topics whose reported figures are not all zero: the topic
        weight's sums run over these (a zero adds nothing), its count over `_counted`."""
        self._loads: dict[str, BrokerLoad] = {}
        """Cache of each broker's effective load, dropped whenever an input changes it."""
        self._score_cache: dict[str, int] | None = None
        """The active brokers' scores, dropped with any load, registration or mode."""
        self._failing: dict[tuple[str, str], int] = {}
        """(broker, topic) of every assignment of a past incarnation → when to (re)send its
        `FailOver`."""
        self._replicas = replicas.ReplicaView()
        self._last_chosen: str | None = None
        self._rebalancer = rebalancing.Rebalancer(config.rebalancing, self._retry_ns)
        self._scheduled: int | None = None

    # -- inputs: leadership and time --------------------------------------------------------

    def became_leader(self, now: int) -> list[Effect]:
        """The membership machine won the leader key. Everything pending is decided at once
        (Danube's new leader only reacts to later events; topics already waiting would stay
        unassigned)."""
        self.leading = True
        self._scheduled = None
        for pending in self._pending.values():
            pending.due = now
            pending.stalled = None
        for key in self._failing:
            self._failing[key] = now
        self._replicas.wake(now)
        self._drain_due.clear()
        self._rebalancer.became_leader(now)
        return self._react(now)

    def lost_leadership(self, now: int) -> list[Effect]:
        """Stop acting; decisions in flight are forgotten (their transactions are fenced)."""
        self.leading = False
        for topic, pending in sorted(self._pending.items()):
            if pending.planned is not None:
                self._expect(topic, pending, add=False)
                pending.planned = None
                self._expect(topic, pending, add=True)
        self._rebalancer.lost_leadership()
        self._scheduled = None
        return self._react(now)

    def tick(self, now: int, *, unix_s: int) -> list[Effect]:
        """The time of the last `ScheduleTick` has come."""
        self._scheduled = None
        return self._react(now, unix_s)

    def trigger_rebalance(self, max_moves: int | None, now: int, *, unix_s: int) -> list[Effect]:
        """An administrator's rebalance: moves one topic per step, `cooldown_seconds` apart,
        until the cluster is balanced, no topic qualifies or `max_moves` were made. It ignores
        `enabled`, the check interval, `min_brokers_for_rebalance` and the hourly cap (its
        moves still count towards the cap), but not the blacklist nor `min_topic_age_seconds`.
        Ignored unless leading with a `rebalancing` section (the admin API refuses first)."""
        if max_moves is not None and max_moves < 1:
            raise ValueError(f"max_moves must be at least 1, got {max_moves}")
        if not self.leading or self.config.rebalancing is None:
            return []
        self._rebalancer.trigger(max_moves)
        return self._react(now, unix_s)

    # -- inputs: the view ------------------------------------------------------------------

    def observe(self, event: WatchEvent, now: int) -> list[Effect]:
        """Routes one event of the watch on `keys.CLUSTER_PREFIX` to the input it stands for;
        keys the load manager does not read are ignored."""
        problem = self._apply(event.kind == "put", event.key, event.value, event.mod_revision, now)
        effects: list[Effect] = [problem] if problem else []
        effects += self._react(now)
        return effects if self.leading else []

    def resync(self, snapshot: Iterable[KeyValue], now: int) -> list[Effect]:
        """Replaces the view with `snapshot`, every key under `/cluster/` at one revision:
        at start, and whenever the watch must restart (it was compacted)."""
        previous = {(b, t): o for b, topics in self._owned.items() for t, o in topics.items()}
        self._registered.clear()
        self._addresses.clear()
        self._modes.clear()
        self._state_revisions.clear()
        self._reports.clear()
        self._topic_loads.clear()
        self._owners.clear()
        self._owned.clear()
        self._pending.clear()
        self._expected.clear()
        self._counted.clear()
        self._weighted.clear()
        self._loads.clear()
        self._score_cache = None
        self._failing.clear()
        self._replicas.clear()
        problems = []
        for kv in sorted(snapshot, key=lambda kv: kv.key):
            problem = self._apply(True, kv.key, kv.value, kv.mod_revision, now)
            if problem:
                problems.append(problem)
        for (broker, topic), owned in previous.items():
            current = self._owned.get(broker, {}).get(topic)
            if current is not None and current.revision == owned.revision:
                current.since = owned.since
        effects = [*problems, *self._react(now)]
        return effects if self.leading else []

    # -- queries ---------------------------------------------------------------------------

    def rankings(self) -> list[tuple[str, int]]:
        """Active brokers, least loaded first, as assignment sees them."""
        return ranking(self._scores())

    def balance(self) -> Imbalance:
        """The figures `GetClusterBalance` reports (`danube.runtime.cluster_admin`)."""
        return imbalance(self._scores())

    def propose_move(self, now: int) -> Proposal | None:
        """The move a manual rebalance would make now (a dry run); None when balanced or no
        topic qualifies."""
        return self._rebalancer.propose(now, self._rebalance_view(), automatic=False)

    def registered(self) -> list[str]:
        """Every registered broker, by id."""
        return sorted(self._registered)

    def active(self) -> list[str]:
        """The brokers that may be given topics (registered, mode `active` or unset)."""
        return self._active()

    def owner(self, topic: str) -> tuple[str, int] | None:
        """(broker, assignment `mod_revision`) of the topic's assignment, if it has one."""
        owners = self._owners.get(topic)
        if not owners:
            return None
        broker = min(owners)
        return broker, owners[broker].revision

    def assignments(self, broker: str) -> dict[str, int]:
        """topic → assignment `mod_revision` of every topic assigned to the broker."""
        return {topic: owned.revision for topic, owned in self._owned.get(broker, {}).items()}

    def in_sync(self, topic: str) -> tuple[str, ...]:
        """The topic's in-sync followers as its replica set records them (none: no set)."""
        return self._replicas.in_sync(topic)

    def registration(self, broker: str) -> Any:
        """The broker's registration value (its URLs) as seen; None when not registered."""
        return self._addresses.get(broker)

    def marker(self, topic: str) -> tuple[Marker, int] | None:
        """(marker, `mod_revision`) of the topic's unassigned marker, if it has one."""
        pending = self._pending.get(topic)
        return None if pending is None else (pending.marker, pending.revision)

    # -- view updates ----------------------------------------------------------------------

    def _apply(self, put: bool, key: str, value: Any, revision: int, now: int) -> Log | None:
        """Applies one key's change to the view; returns why a value was refused."""
        if (broker := keys.parse_register_key(key)) is not None:
            if put:
                self._addresses[broker] = value
                self._register(broker, revision, now)
            else:
                self._addresses.pop(broker, None)
                self._unregister(broker, now)
        elif (broker := keys.parse_state_key(key)) is not None:
            self._set_mode(broker, records.broker_mode(value) if put else None, revision)
        elif (pair := keys.parse_assignment_key(key)) is not None:
            self._set_assignment(pair[0], pair[1], revision if put else None, now)
        elif (topic := keys.parse_unassigned_key(key)) is not None:
            self._set_marker(topic, Marker.from_json(value) if put else None, revision, now)
        elif (broker := keys.parse_load_key(key)) is not None:
            try:
                self._set_report(broker, LoadReport.from_json(value) if put else None)
            except ValueError as error:
                # The last good report stays: a broker that cannot be read is not idle.
                return Log("load_report_rejected", f"{key}: {error}")
        elif (topic := keys.parse_replicas_key(key)) is not None:
            problem = self._replicas.set(topic, value if put else replicas.GONE, revision, now)
            return Log("replicas_rejected", problem) if problem else None
        elif (name := keys.parse_cluster_policy_key(key)) is not None:
            problem = self._replicas.set_policy(name, value if put else replicas.GONE, now)
            return Log("policy_rejected", problem) if problem else None
        return None

    def _register(self, broker: str, revision: int, now: int) -> None:
        self._registered[broker] = revision
        self._score_cache = None
        for topic in list(self._owned.get(broker, {})):
            self._check_owner(broker, topic, now)
        self._replicas.touch_all(now)

    def _unregister(self, broker: str, now: int) -> None:
        self._registered.pop(broker, None)
        self._score_cache = None
        self._drain_due.pop(broker, None)
        self._set_report(broker, None)
        for topic in list(self._owned.get(broker, {})):
            self._check_owner(broker, topic, now)
        self._replicas.touch_all(now)

    def _check_owner(self, broker: str, topic: str, now: int) -> None:
        """Fails the assignment over if it belongs to a past incarnation of its broker: the
        broker is not registered (its lease expired, so it has fenced itself), or registered
        again since the assignment was written (a registration is put once per lease; the new
        incarnation starts without topics)."""
        owned = self._owned.get(broker, {}).get(topic)
        registered = self._registered.get(broker)
        if owned is not None and (registered is None or registered > owned.revision):
            self._failing.setdefault((broker, topic), now)
        else:
            self._failing.pop((broker, topic), None)

    def _set_mode(self, broker: str, mode: str | None, revision: int) -> None:
        if mode is None:
            self._modes.pop(broker, None)
            self._state_revisions.pop(broker, None)
        else:
            self._modes[broker] = mode
            self._state_revisions[broker] = revision
        self._score_cache = None

    def _set_report(self, broker: str, report: LoadReport | None) -> None:
        if report is None:
            self._reports.pop(broker, None)
            self._topic_loads.pop(broker, None)
        else:
            self._reports[broker] = report
            self._topic_loads[broker] = {t.topic_name: t for t in report.topics}
        known = self._topic_loads.get(broker, {})
        weighted = {
            topic: load
            for topic in self._counted.get(broker, {})
            if (load := known.get(topic)) is not None and _weighs(load)
        }
        if weighted:
            self._weighted[broker] = weighted
        else:
            self._weighted.pop(broker, None)
        self._changed(broker)

    def _set_marker(self, topic: str, marker: Marker | None, revision: int, now: int) -> None:
        old = self._pending.pop(topic, None)
        if old is not None:
            self._expect(topic, old, add=False)
        self._replicas.due[topic] = now  # followers wait while a topic is unassigned
        if marker is not None:
            pending = _Pending(marker, revision, now)
            self._pending[topic] = pending
            self._expect(topic, pending, add=True)

    def _set_assignment(self, broker: str, topic: str, revision: int | None, now: int) -> None:
        owners = self._owners.setdefault(topic, {})
        if revision is None:
            owners.pop(broker, None)
            if self._owned.get(broker, {}).pop(topic, None) is not None:
                self._count(broker, topic, -1)
            self._rebalancer.assignment_gone(broker, topic)
        else:
            owned = owners.get(broker)
            if owned is None or owned.revision != revision:
                owned = _Owned(revision, now)
            owners[broker] = owned
            held = self._owned.setdefault(broker, {})
            if topic not in held:
                self._count(broker, topic, 1)
            held[topic] = owned
        self._check_owner(broker, topic, now)
        self._replicas.due[topic] = now
        if not owners:
            del self._owners[topic]
        if broker in self._owned and not self._owned[broker]:
            del self._owned[broker]

    def _expect(self, topic: str, pending: _Pending, *, add: bool) -> None:
        target = pending.target()
        if target is None:
            return
        topics = self._expected.setdefault(target, set())
        if add and topic not in topics:
            topics.add(topic)
            self._count(target, topic, 1)
        elif not add and topic in topics:
            topics.discard(topic)
            self._count(target, topic, -1)
        if not topics:
            del self._expected[target]

    def _count(self, broker: str, topic: str, delta: int) -> None:
        """`topic` starts (`delta` 1) or stops (-1) being assigned to `broker`, or on its way
        to it: its load counts the topic while either holds."""
        counted = self._counted.setdefault(broker, {})
        times = counted.get(topic, 0) + delta
        if times:
            counted[topic] = times
        else:
            del counted[topic]
            if not counted:
                del self._counted[broker]
        if times == 1 and delta == 1:
            load = self._topic_loads.get(broker, {}).get(topic)
            if load is not None and _weighs(load):
                self._weighted.setdefault(broker, {})[topic] = load
        elif times == 0 and topic in self._weighted.get(broker, {}):
            del self._weighted[broker][topic]
            if not self._weighted[broker]:
                del self._weighted[broker]
        self._changed(broker)

    def _changed(self, broker: str) -> None:
        self._loads.pop(broker, None)
        self._score_cache = None

    # -- decisions ---------------------------------------------------------------------------

    def _react(self, now: int, unix_s: int | None = None) -> list[Effect]:
        self._advance(now)
        if not self.leading:
            return []
        effects = [*self._failovers(now), *self._assignments(now), *self._drains(now)]
        effects += self._refollows(now)
        if unix_s is not None:
            effects += self._rebalancer.step(
                now, unix_s, self._leader_compare, self._rebalance_view()
            )
        return [*effects, *self._schedule(now)]

    def _advance(self, now: int) -> None:
        """Bookkeeping that only time drives (followers too: their view must be ready)."""
        self._rebalancer.advance(now)

    def _active(self) -> list[str]:
        """Registered brokers in mode `active`, or with no state key (Danube's default)."""
        return [b for b in sorted(self._registered) if self._modes.get(b, "active") == "active"]

    def _load(self, broker: str) -> BrokerLoad:
        """The broker's report, with its topics replaced by what the leader knows it holds:
        its assignments plus the topics on their way to it. A report lags (30 s by default),
        the view does not, and assignments made since the last report must count at once or a
        burst of new topics would all land on the same broker."""
        load = self._loads.get(broker)
        if load is None:
            # What the whole list's figures would give (`ranking.topic_weight`): the count of
            # every counted topic, the sums over those with figures, in the same order.
            weighted = self._weighted.get(broker, {})
            load = BrokerLoad.of(
                self._reports.get(broker) or LoadReport(broker),
                count=len(self._counted.get(broker, ())),
                topics=tuple(weighted[name] for name in sorted(weighted)),
            )
            self._loads[broker] = load
        return load

    def _scores(self) -> dict[str, int]:
        """The active brokers' scores, computed again only after something changed them."""
        if self._score_cache is None:
            loads = {broker: self._load(broker) for broker in self._active()}
            self._score_cache = scores(self.config.assignment_strategy, loads)
        return dict(self._score_cache)

    def _failovers(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for (broker, topic), due in sorted(self._failing.items()):
            if due > now:
                continue
            self._failing[(broker, topic)] = now + self._retry_ns
            assignment = keys.assignment_key(broker, topic)
            revision = self._owned[broker][topic].revision
            effects.append(
                FailOver(
                    topic,
                    broker,
                    (self._leader_compare, Compare(assignment, "mod_revision", "==", revision)),
                    (Delete(assignment), Put(keys.unassigned_key(topic), None)),
                )
            )
        return effects

    def _assignments(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for topic, pending in sorted(self._pending.items()):
            if pending.due > now:
                continue
            marker = pending.marker
            if not marker.ready:
                if self._orphaned(pending):
                    effects.append(self._release(topic, pending, now))
                continue
            if marker.reason is MarkerReason.DELETE:
                continue  # never assigned: the admin's DeleteTopic removes it
            owners = self._owners.get(topic)
            if owners:
                # Never a second owner: the marker waits until the assignment goes (a
                # fail-over or an unload in progress), as its writer must delete it.
                effects += self._stall(topic, pending, f"still assigned to {min(owners)}")
                continue
            candidates = self._promotable(topic, marker)
            if candidates is not None and not candidates:
                why = self._replicas.unavailable(topic)
                effects += self._stall(topic, pending, why, "topic_unavailable")
                continue
            broker = self._choose(topic, marker, candidates)
            if broker is None:
                effects += self._stall(topic, pending, "no active broker")
                continue
            effects.append(self._assign(topic, pending, broker, now))
        return effects

    def _orphaned(self, pending: _Pending) -> bool:
        """Nobody will ever mark this marker ready: `from_broker` is not registered, or was
        registered again after the marker was written (a registration is put once per lease,
        so a newer one is a new incarnation, which knows nothing of the unload)."""
        registered = self._registered.get(pending.marker.from_broker or "")
        return registered is None or registered > pending.revision

    def _stall(
        self, topic: str, pending: _Pending, why: str, event: str = "assignment_waiting"
    ) -> list[Effect]:
        if pending.stalled == why:
            return []
        pending.stalled = why
        return [Log(event, f"{topic}: {why}")]

    def _release(self, topic: str, pending: _Pending, now: int) -> Release:
        """A deleted topic's marker stays a delete marker, only ready: released as null, the
        topic would be assigned again and outlive its deletion."""
        pending.due = now + self._retry_ns
        marker_key = keys.unassigned_key(topic)
        marker = pending.marker
        released = (
            dataclasses.replace(marker, ready=True) if marker.reason is MarkerReason.DELETE
            else Marker()
        )  # fmt: skip
        return Release(
            topic,
            marker.from_broker,
            (self._leader_compare, Compare(marker_key, "mod_revision", "==", pending.revision)),
            (Put(marker_key, released.to_json()),),
        )

    def _drains(self, now: int) -> list[Effect]:
        """Draining brokers whose last topic left: no assignment, no unload of theirs pending
        (a marker that is not ready yet still needs them to seal the topic)."""
        owing = {
            p.marker.from_broker for p in self._pending.values() if not p.marker.ready
        }  # fmt: skip
        effects: list[Effect] = []
        for broker in sorted(self._registered):
            if self._modes.get(broker) != records.DRAINING or self._owned.get(broker):
                self._drain_due.pop(broker, None)
                continue
            if broker in owing or self._drain_due.get(broker, now) > now:
                continue
            self._drain_due[broker] = now + self._retry_ns
            state = keys.state_key(broker)
            compare = Compare(state, "mod_revision", "==", self._state_revisions[broker])
            effects.append(
                MarkDrained(
                    broker,
                    (self._leader_compare, compare),
                    (Put(state, records.state_value(records.DRAINED, "no_topics")),),
                )
            )
        return effects

    def _assign(self, topic: str, pending: _Pending, broker: str, now: int) -> Assign:
        self._expect(topic, pending, add=False)
        pending.planned = broker
        self._expect(topic, pending, add=True)
        pending.due = now + self._retry_ns
        pending.stalled = None
        marker_key = keys.unassigned_key(topic)
        # The target's registration as this view saw it: a view that lags the store (a new
        # leader acting before it has seen the expiry that made it leader) must not give a
        # topic to a broker that is gone.
        registered = Compare(
            keys.register_key(broker), "mod_revision", "==", self._registered[broker]
        )
        # And its mode as seen (active): an admin's drain that lands after the decision was
        # made and before it is applied must not be overtaken by it.
        state = keys.state_key(broker)
        seen_mode = (
            Compare(state, "mod_revision", "==", self._state_revisions[broker])
            if broker in self._state_revisions
            else Compare(state, "version", "==", 0)
        )
        # The replica set: created with its first followers, or required as the choice saw it.
        seen = self._replicas.seen.get(topic)
        followers = () if seen is not None else self._place(topic, broker, ())
        record, record_ops = replicas.at_assignment(topic, broker, seen, followers)
        return Assign(
            topic,
            broker,
            pending.marker.reason,
            (
                self._leader_compare,
                Compare(marker_key, "mod_revision", "==", pending.revision),
                registered,
                seen_mode,
                record,
            ),
            (Put(keys.assignment_key(broker, topic), None), Delete(marker_key), *record_ops),
        )

    def _choose(
        self, topic: str, marker: Marker, candidates: frozenset[str] | None = None
    ) -> str | None:
        """Danube's choice of broker for a marker, among active brokers only; a failover with
        an in-sync set recorded takes the least loaded of its `candidates`. A hand-over
        (unload, rebalance, drain) prefers an in-sync follower (`replicas.hand_over_target`)."""
        broker_scores = self._scores()
        if not broker_scores:
            return None
        ranked = ranking(broker_scores)
        if marker.reason is not MarkerReason.NEW:
            wanted = marker.to_broker if marker.reason is MarkerReason.REBALANCE else None
            order = [b for b, _ in ranked]
            in_sync = self._replicas.in_sync(topic)
            return replicas.hand_over_target(order, marker.from_broker, wanted, candidates, in_sync)
        if candidates is not None:
            return next((b for b, _ in ranked if b in candidates), None)
        low = ranked[0][1]
        threshold = low if low < 10 else low + max(low // 10, 1)
        candidates = sorted(b for b, score in ranked if score <= threshold)
        last = self._last_chosen
        after = [b for b in candidates if last is not None and b > last]
        self._last_chosen = after[0] if after else candidates[0]
        return self._last_chosen

    # -- replica sets (spec/replication.md) ---------------------------------------------------

    def _place(self, topic: str, owner: str, current: tuple[str, ...]) -> tuple[str, ...]:
        """Followers for `topic` on `owner` at its replication factor (its own, its
        namespace's or `config.replication_factor`: `ReplicaView.place`): the live ones
        kept, the rest among the active brokers."""
        config, scores = self.config.replication_factor, self._scores()
        return self._replicas.place(topic, owner, current, scores, self._registered, config)

    def _promotable(self, topic: str, marker: Marker) -> frozenset[str] | None:
        """Who may get a topic whose replica set shows it replicating, not handed over
        sealed: its active in-sync members and recorded owner, which alone hold every
        acknowledged record; else anyone (None). Also for hand-overs (unload, rebalance,
        drain): an unload that did not seal (its broker never loaded the topic, or died
        meanwhile) leaves acknowledged records only on those brokers. An unload that uploaded
        its tail marks the set `sealed` in the release that marks the marker ready; one
        handed over to the in-sync followers leaves it unsealed. `marker` is for overrides
        (the planted bugs of tests/cluster/test_replica_placement.py)."""
        del marker
        return self._replicas.promotable(topic, True, self._active())

    def _refollows(self, now: int) -> list[Effect]:
        """Topics whose followers are gone, include their owner, or are too few: one fenced
        `SetFollowers` each. Only assigned topics (not moving, not failing over)."""
        effects: list[Effect] = []
        for topic, due in sorted(self._replicas.due.items()):
            if due > now:
                continue
            owners, seen = self._owners.get(topic, {}), self._replicas.seen.get(topic)
            decision = None
            if len(owners) == 1 and topic not in self._pending and seen and seen[0]:
                (owner,) = owners
                if (owner, topic) not in self._failing:
                    followers = self._place(topic, owner, seen[0].followers)
                    decision = replicas.refollow(topic, seen, followers, self._leader_compare)
            if decision is None:
                del self._replicas.due[topic]
            else:
                self._replicas.due[topic] = now + self._retry_ns
                effects.append(decision)
        return effects

    # -- rebalancing (`danube.machines.cluster.rebalancing`) --------------------------------

    def _rebalance_view(self) -> rebalancing.View:
        return rebalancing.View(
            self._scores(),
            self._owned,
            self._pending,
            self._topic_loads,
            self._move_target,
            self._scores_after_move,
        )

    def _scores_after_move(self, topic: str, source: str, target: str) -> dict[str, int]:
        """The active brokers' scores were `topic` counted on `target` instead of `source`
        (its figures from the source's report; CPU, memory and the rest as reported)."""
        loads = {broker: self._load(broker) for broker in self._active()}
        moved = self._topic_loads.get(source, {}).get(topic)
        for broker in (source, target):
            if broker not in loads:
                continue
            counted = set(self._counted.get(broker, ()))
            weighted = dict(self._weighted.get(broker, {}))
            if broker == source:
                counted.discard(topic)
                weighted.pop(topic, None)
            else:
                counted.add(topic)
                if moved is not None and _weighs(moved):
                    weighted[topic] = moved
            loads[broker] = BrokerLoad.of(
                self._reports.get(broker) or LoadReport(broker),
                count=len(counted),
                topics=tuple(weighted[name] for name in sorted(weighted)),
            )
        return scores(self.config.assignment_strategy, loads)

    def _move_target(self, topic: str, source: str, ranked: Sequence[str]) -> str:
        """A replicated topic moves to an in-sync follower when one is lighter than the
        source (`replicas.rebalance_target`)."""
        return replicas.rebalance_target(ranked, source, self._replicas.in_sync(topic))

    def _schedule(self, now: int) -> list[Effect]:
        times = [p.due for p in self._pending.values() if p.due > now]
        times += [due for due in self._failing.values() if due > now]
        times += [due for due in self._drain_due.values() if due > now]
        times += [due for due in self._replicas.due.values() if due > now]
        rebalance_at = self._rebalancer.wake_at(now)
        if rebalance_at is not None:
            times.append(rebalance_at)
        at = min(times) if times else None
        if at == self._scheduled:
            return []
        self._scheduled = at
        return [] if at is None else [ScheduleTick(at)]


def _weighs(load: TopicLoad) -> bool:
    """Whether a topic's figures add to its broker's topic weight beyond its count."""
    return bool(
        load.byte_rate_mbps or load.producer_count or load.consumer_count or load.backlog_messages
    )
