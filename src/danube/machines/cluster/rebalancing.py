"""The load manager's rebalancing (spec/cluster.md, "Rebalancing"): when to move, which
topic, where to, and the `Move` transaction, with the state that paces moves (the hourly
window, the cooldown, the move in flight, a manual session).

Kept apart from `danube.machines.cluster.load_manager` because it is a decision of its own
over the view: the load manager hands it the scores, the assignments and the topics waiting
for a broker, and gets back at most one `Move` per step. Pure and deterministic, like the
load manager: the same view and times give the same move.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from danube import keys
from danube.machines.cluster import records
from danube.machines.cluster.load_manager_effects import Effect, Log, Move, Proposal
from danube.machines.cluster.ranking import (
    TopicLoad,
    blacklisted,
    imbalance,
    ranking,
    rebalance_sources,
)
from danube.machines.cluster.records import Marker, MarkerReason
from danube.metadata.model import Compare, Delete, Put
from danube.values.load_manager_config import RebalancingConfig

NS_PER_S = 1_000_000_000
HOUR_NS = 3600 * NS_PER_S


class Owned(Protocol):
    """An assignment as the load manager's view holds it."""

    @property
    def revision(self) -> int: ...

    @property
    def since(self) -> int: ...


Target = Callable[[str, str, Sequence[str]], str]
"""(topic, source, active brokers least loaded first) → where a move of `topic` goes."""


@dataclass(slots=True)
class _Manual:
    left: int | None
    """Moves still allowed in this manual session; None: until balanced."""


@dataclass(frozen=True, slots=True)
class _InFlight:
    broker: str
    topic: str
    until: int


class Rebalancer:
    """The pacing state of one load manager's moves and its rebalancing decisions."""

    def __init__(self, config: RebalancingConfig | None, retry_ns: int) -> None:
        self.config = config
        self._retry_ns = retry_ns
        self._moves: deque[int] = deque()
        """When each move of the last hour was made."""
        self._moved_at: dict[str, int] = {}
        self._last_move_at: int | None = None
        self._in_flight: _InFlight | None = None
        self._next_check: int | None = None
        self._manual: _Manual | None = None
        self._history_s = -1

    # -- leadership and time ----------------------------------------------------------------

    def became_leader(self, now: int) -> None:
        cfg = self.config
        if cfg is not None and cfg.enabled:
            # A full interval first: the view of loads settles after a change of leader.
            self._next_check = now + cfg.check_interval_seconds * NS_PER_S

    def lost_leadership(self) -> None:
        self._manual = None
        self._next_check = None
        self._in_flight = None

    def trigger(self, max_moves: int | None) -> None:
        self._manual = _Manual(max_moves)

    def advance(self, now: int) -> None:
        """Bookkeeping that only time drives (followers too: their view must be ready)."""
        while self._moves and self._moves[0] <= now - HOUR_NS:
            self._moves.popleft()
        cfg = self.config
        min_age = 0 if cfg is None else cfg.min_topic_age_seconds * NS_PER_S
        for topic, at in list(self._moved_at.items()):
            if at <= now - min_age:
                del self._moved_at[topic]
        if self._in_flight is not None and self._in_flight.until <= now:
            self._in_flight = None

    def assignment_gone(self, broker: str, topic: str) -> None:
        """The assignment of `topic` to `broker` was deleted: a move of it shows."""
        flight = self._in_flight
        if flight is not None and (flight.broker, flight.topic) == (broker, topic):
            self._in_flight = None

    def wake_at(self, now: int) -> int | None:
        """When the next step may move something (for the load manager's schedule)."""
        cfg = self.config
        if cfg is None:
            return None
        gate = self._gate(cfg, now)
        if self._manual is not None:
            return gate
        if cfg.enabled and self._next_check is not None:
            return max(self._next_check, gate)
        return None

    # -- decisions ---------------------------------------------------------------------------

    def _gate(self, cfg: RebalancingConfig, now: int) -> int:
        """Earliest time of the next move: the cooldown has passed, and the previous move
        shows in the view (the loads it changed are known) or took too long to."""
        times = [now]
        if self._last_move_at is not None:
            times.append(self._last_move_at + cfg.cooldown_seconds * NS_PER_S)
        if self._in_flight is not None:
            times.append(self._in_flight.until)
        return max(times)

    def step(self, now: int, unix_s: int, leader: Compare, view: View) -> list[Effect]:
        """At most one move, when the pacing allows it (manual session first)."""
        cfg = self.config
        if cfg is None or self._gate(cfg, now) > now:
            return []
        if self._manual is not None:
            proposal = self.propose(now, view, automatic=False)
            if proposal is None:
                self._manual = None
                return [Log("manual_rebalance_done", "balanced, or no topic may move")]
            if self._manual.left is not None:
                self._manual.left -= 1
                if self._manual.left == 0:
                    self._manual = None
            return [self._move(proposal, now, unix_s, leader, manual=True)]
        if not cfg.enabled or self._next_check is None or now < self._next_check:
            return []
        self._next_check = now + cfg.check_interval_seconds * NS_PER_S
        if len(self._moves) >= cfg.max_moves_per_hour:
            return [Log("rebalance_capped", f"{len(self._moves)} moves in the last hour")]
        proposal = self.propose(now, view, automatic=True)
        return [] if proposal is None else [self._move(proposal, now, unix_s, leader, manual=False)]

    def propose(self, now: int, view: View, *, automatic: bool) -> Proposal | None:
        cfg = self.config
        if cfg is None:
            return None
        broker_scores = view.scores
        if automatic and len(broker_scores) < cfg.min_brokers_for_rebalance:
            return None
        stats = imbalance(broker_scores)
        if stats.brokers < 2 or stats.coefficient_of_variation < cfg.aggressiveness.threshold:
            return None
        ranked = [b for b, _ in ranking(broker_scores)]
        min_age = cfg.min_topic_age_seconds * NS_PER_S
        for source in rebalance_sources(broker_scores, stats):
            known = view.topic_loads.get(source, {})
            best: tuple[float, str, int] | None = None
            for topic, owned in sorted(view.owned.get(source, {}).items()):
                if topic in view.pending or blacklisted(topic, cfg.blacklist_topics):
                    continue
                if now - max(owned.since, self._moved_at.get(topic, owned.since)) < min_age:
                    continue
                load = (known.get(topic) or TopicLoad(topic)).estimated_load
                if best is None or load < best[0]:
                    best = (load, topic, owned.revision)
            if best is None:
                continue
            # The target (a lighter in-sync follower, else the least loaded other broker);
            # if that move would overshoot, the least loaded other broker.
            lightest = next(b for b in ranked if b != source)
            for target in dict.fromkeys((view.target(best[1], source, ranked), lightest)):
                after = view.after(best[1], source, target)
                if after.get(target, 0) <= after.get(source, 0):
                    return Proposal(best[1], source, target, best[0], best[2])
            # Every target would overshoot: left heavier than the source, the next step would
            # move a topic back (a manual run "until balanced" never ended). The source's
            # lightest topic is the least likely to overshoot: the source is skipped.
        return None

    def _move(
        self, proposal: Proposal, now: int, unix_s: int, leader: Compare, *, manual: bool
    ) -> Move:
        topic, source, target = proposal.topic, proposal.from_broker, proposal.to_broker
        self._moves.append(now)
        self._moved_at[topic] = now
        self._last_move_at = now
        self._in_flight = _InFlight(source, topic, now + self._retry_ns)
        # One key per move even when two moves share a second (a manual run without cooldown).
        self._history_s = max(unix_s, self._history_s + 1)
        assignment = keys.assignment_key(source, topic)
        marker_key = keys.unassigned_key(topic)
        marker = Marker(MarkerReason.REBALANCE, source, target, ready=False, timestamp=unix_s)
        record = {
            "topic": topic,
            "from_broker": records.broker_id_to_json(source),
            "to_broker": records.broker_id_to_json(target),
            "reason": "ManualRebalance" if manual else "LoadImbalance",
            "estimated_load": proposal.estimated_load,
            "timestamp": unix_s,
        }
        return Move(
            topic,
            source,
            target,
            manual,
            proposal.estimated_load,
            (
                leader,
                Compare(assignment, "mod_revision", "==", proposal.revision),
                Compare(marker_key, "version", "==", 0),
            ),
            (
                Put(marker_key, marker.to_json()),
                Delete(assignment),
                Put(keys.history_key(self._history_s), record),
            ),
        )


@dataclass(frozen=True, slots=True)
class View:
    """What a rebalancing step reads of the load manager's view."""

    scores: dict[str, int]
    owned: Mapping[str, Mapping[str, Owned]]
    """broker → topic → assignment."""
    pending: Collection[str]
    """Topics with an unassigned marker: never moved."""
    topic_loads: Mapping[str, Mapping[str, TopicLoad]]
    target: Target
    """Where a move goes (the load manager's: a lighter in-sync follower, else the least
    loaded other broker, `replicas.rebalance_target`)."""
    after: Callable[[str, str, str], Mapping[str, int]]
    """(topic, source, target) → the active brokers' scores were `topic` moved from `source`
    to `target` (the reports' other figures as they are): a move must not leave the target
    heavier than the source."""
