"""Lazy recovery at start (issue 23 point 3): which reliable topics' WALs load when.

Before, a restart recovered every reliable topic (a directory scan and a recovery each, one
worker-thread hop apiece) before the broker said it was ready, so a restart's cost grew with
the idle topics: 20,000 of them took 49.9 s. Now the metadata scan alone makes a topic known
(`BrokerCore.restore` builds its record, LOADING), and its WAL is recovered later:

- **on first use**: a request that needs the WAL (a producer, a consumer, a publish, a read)
  finds it not loaded (`ReliableLogs.ready_wal`): it is refused UNAVAILABLE "retry shortly",
  as a loading topic always was, and the topic goes to the front (`want`); its load starts at
  the next tick, before any sweep load, whatever the sweep's width;
- **by the sweep**: the rest, in the restore's (key) order, at most `SWEEP_WIDTH` at a time,
  the next one started as one ends (`done`), so the sweep keeps a few worker threads busy and
  no more: requests' loads and the hot path keep the rest of the machine.

A deferred topic is LOADING like a topic whose load is under way: nothing reads or writes its
WAL, no offset is answered from it, a subscription waits for it; so serving, repair of damaged
storage (recovery's evidence, spec/hardening.md) and the phase machine are the same whether a
topic's load came at start, at first use or from the sweep. A deferred topic is loaded as it
was stored (`LoadWal(fresh=False)`): loading it as a new topic would discard its data.

Pure: the decisions only; the interpreter carries out the `LoadWal` effects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from danube.machines.node.effects import Effect, LoadWal, Step
from danube.machines.node.phase import TopicPhase

if TYPE_CHECKING:  # records imports reliable_log, which imports this module
    from danube.machines.node.records import TopicRecord

SWEEP_WIDTH = 2
"""Sweep loads under way at once (requests' first-use loads are not counted against it)."""

_WAITING_PHASES = (TopicPhase.LOADING, TopicPhase.UNLOADING_LOADING)
"""A topic whose WAL was never loaded here: the phases a deferred load may start in."""


class DeferredLoads:
    """The topics a restore made known whose WAL load has not started yet, and which of them
    a request asked for."""

    def __init__(self, topics: Mapping[str, TopicRecord], *, width: int = SWEEP_WIDTH) -> None:
        self._topics = topics
        self.width = width
        self._waiting: dict[str, TopicRecord | None] = {}
        """Deferred, in the sweep's order (a dict: ordered, and `want` removes in O(1)), with
        the record the restore made: a topic deleted and created again meanwhile is a new
        record, loaded fresh by its creation, not by this queue."""
        self._wanted: dict[str, TopicRecord | None] = {}
        """Asked for by a request: started at the next `due`, before the sweep's."""
        self._sweeping: set[str] = set()
        """Sweep loads started and not reported loaded (or failed) yet."""

    def defer(self, step: Step[None]) -> Step[None]:
        """A restore's step with its loads of stored topics deferred; the first sweep loads
        start with it. Loads of new topics (`fresh`) are kept as they are."""
        kept: list[Effect] = []
        for effect in step.effects:
            if isinstance(effect, LoadWal) and not effect.fresh:
                self._waiting[effect.topic] = self._topics.get(effect.topic)
            else:
                kept.append(effect)
        kept.extend(self.due())
        return Step(step.value, tuple(kept))

    def pending(self, topic: str) -> bool:
        """The topic's load is deferred (not started)."""
        return topic in self._waiting or topic in self._wanted

    @property
    def left(self) -> int:
        """Deferred loads not started yet."""
        return len(self._waiting) + len(self._wanted)

    def want(self, topic: str) -> None:
        """A request needed the topic's WAL: its load starts at the next `due`."""
        if topic in self._waiting:
            self._wanted[topic] = self._waiting.pop(topic)

    def start(self, topic: str) -> list[Effect]:
        """A request that can wait for the load (a producer's creation: its reply waits for
        the loads its step starts) starts the topic's deferred load now."""
        record = self._waiting.pop(topic, None) or self._wanted.pop(topic, None)
        return [LoadWal(topic, fresh=False)] if self._needs(topic, record) else []

    def due(self) -> list[Effect]:
        """The loads to start now: every wanted topic, then the sweep's next ones while fewer
        than `width` of its loads are under way. A topic deleted or loaded meanwhile (a
        cluster claim) is dropped from the queue, not loaded."""
        out: list[Effect] = []
        if self._wanted:
            wanted, self._wanted = self._wanted, {}
            out.extend(
                LoadWal(topic, fresh=False)
                for topic, record in wanted.items()
                if self._needs(topic, record)
            )
        waiting = self._waiting
        while waiting and len(self._sweeping) < self.width:
            topic = next(iter(waiting))
            if self._needs(topic, waiting.pop(topic)):
                self._sweeping.add(topic)
                out.append(LoadWal(topic, fresh=False))
        return out

    def done(self, topic: str) -> list[Effect]:
        """A topic's load ended (loaded or failed): a sweep load ending makes room for the
        next one."""
        if topic not in self._sweeping:
            return []
        self._sweeping.discard(topic)
        return self.due()

    def forget(self, topics: Iterable[str]) -> None:
        """Topics that left this broker (deleted, moved away) before their load started."""
        for topic in topics:
            self._waiting.pop(topic, None)
            self._wanted.pop(topic, None)
            self._sweeping.discard(topic)

    def _needs(self, topic: str, record: TopicRecord | None) -> bool:
        return (
            record is not None
            and self._topics.get(topic) is record
            and record.log.wal is None
            and record.phase in _WAITING_PHASES
        )
