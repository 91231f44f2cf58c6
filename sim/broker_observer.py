"""What the checker hears from inside the simulated broker (`SimBroker` calls these; the
checker implements them). Split out of `sim.broker` (module size)."""

from __future__ import annotations

from dataclasses import dataclass

from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.dispatch.types import SubscriptionType
from danube.machines.memory.ledger import CacheLedger
from danube.machines.memory.publish import PublishPool
from danube.machines.tiering import ObjectRead
from danube.machines.wal.machine import Durability
from sim.connections import SimConnections


@dataclass(frozen=True, slots=True)
class SubscriptionRecordView:
    name: str
    sub_type: SubscriptionType
    dispatcher: ReliableSubscription | None


class Observer:
    """What the checker wants to hear from inside the broker."""

    def acknowledged(self, topic: str, through: int, durability: Durability) -> None: ...

    def restarted(self) -> None:
        """The broker process started (again): nothing is in flight any more."""

    def sent(
        self, topic: str, sub: SubscriptionRecordView, consumer_id: int, offset: int, key: str
    ) -> None: ...

    def written(self, topic: str, data: bytes) -> None:
        """Frames reached the topic's segment file (a torn write passes its prefix)."""

    def retention_skipped(self, topic: str, subscription: str, first: int, end: int) -> None:
        """The broker found offsets [first, end) in no tier for a subscription's read."""

    def policy_dropped(self, topic: str, subscription: str, offset: int, attempts: int) -> None:
        """The subscription's poison policy skipped `offset` after `attempts` failures."""

    def dead_lettered(
        self,
        topic: str,
        subscription: str,
        offset: int,
        attempts: int,
        target: str,
        at: int,
        held: bool | None,
    ) -> None:
        """The subscription's dead letter of `offset` is stored at `target`'s offset `at`,
        reported before the subscription hears it: `held`, whether it still holds the
        original (None: the incarnation that asked is gone)."""

    def retry_scheduled(
        self, topic: str, subscription: str, offset: int, delay: int, cap: int
    ) -> None:
        """A nacked `offset` goes out again in `delay` ms; its policy caps delays at `cap`."""

    def index_committed(self, topic: str) -> None:
        """An index entry of the topic was created in the metadata."""

    def object_read(self, topic: str, plan: ObjectRead) -> None:
        """The broker plans a history read from an object."""

    def object_served(self, topic: str, first: int, records: tuple[bytes, ...]) -> None:
        """An object read decoded these records, from offset `first` on."""

    def object_deleted(self, topic: str, key: str) -> None:
        """The broker deletes an object (an orphan, it believes)."""

    def segment_deleted(self, topic: str, base: int, next_offset: int) -> None:
        """Local retention deletes a segment file holding offsets [base, next_offset)."""

    def tier_halted(self, topic: str, reason: str, resumable: bool) -> None: ...

    def memory_checked(self, pool: int, accounted: int, held: int) -> None:
        """After a tick: the cache ledger's pool and total, and the bytes the WAL machines'
        caches really hold (spec/memory.md)."""

    def state_checked(
        self,
        counts: tuple[int, int, int],
        subscriptions: int,
        charged: int,
        costs: tuple[int, int, int],
        transport: tuple[int, int] = (0, 0),
        transport_costs: tuple[int, int] = (0, 0),
        remembered: int = 0,
    ) -> None:
        """After a tick: the core's counts of topics, subscriptions and consumers, the
        subscriptions its topics hold, what the cache pool is charged for them and the costs;
        the open streams and clients reported to the core before the tick and their costs,
        and the ids of producers gone it remembered then (spec/memory.md, "State")."""

    def held_checked(self, used: int, held: tuple[int, list[str]]) -> None:
        """After a tick: the consumer pool's total, and what the reliable subscriptions hold
        and hold in vain (spec/memory.md, "Consumer queues")."""

    def paused_checked(self, waiting: list[str]) -> None:
        """After a tick, and after a subscription's acknowledgements: the reads the consumer
        pool keeps paused although they should go on (spec/memory.md, "Consumer queues")."""

    def returns_checked(
        self, returns: list[tuple[int, int, int, bool, bool]], drop_bytes: int
    ) -> None:
        """After a tick: every `ReturnMemory` so far (spec/memory.md, "Giving memory back")."""

    def rss_checked(self, ledger: CacheLedger, rss: int, high: int) -> None:
        """After a tick: the cache ledger, the synthetic RSS fed to that tick and the
        high-water mark it is held against (spec/memory.md, "The process's RSS")."""

    def idle_checked(self, ledger: CacheLedger, now_ms: int) -> None:
        """After a tick: the cache ledger, for caches idle past their time."""

    def connections_checked(self, connections: SimConnections, now_us: int) -> None:
        """After a tick and a connection flood: the incarnation's connection gate."""

    def producers_checked(self, early: list[str]) -> None:
        """After a tick: producers it removed for idleness that were not idle that long."""

    def timers_checked(self, late: list[str]) -> None:
        """After a tick: the reliable subscriptions whose timer was due and still is."""

    def publish_pool_checked(
        self, pool: PublishPool, cached: int, pools: int, idle: bool, lent: int = 0
    ) -> None:
        """After a publish was admitted and handed to the core, and after a tick: the publish
        pool, the cache ledger's total, what the cache and publish pools add up to, whether
        no request flow is in flight, and what held records borrow of the cache pool
        (spec/memory.md, "Back-pressure")."""

    def room_wait_checked(self, timeout_ms: int, pool: PublishPool) -> None:
        """A publish waits for room in the publish pool for `timeout_ms` more (spec/memory.md,
        "Back-pressure")."""

    def budget_checked(
        self, accounted: tuple[int, int, int, int], budget: int, over_share: int
    ) -> None:
        """After a publish step and a tick: what the pools account (caches, state,
        publishes, held records) and the budget; `over_share`, what state holds beyond the
        share it may take (restored by a restart, or open streams, never refused)."""

    def internal_error(self, request: str, error: Exception) -> None:
        """A request failed with an unforeseen exception (production answers INTERNAL): a
        bug of the broker. An observer that does not judge it lets it propagate."""
        raise error

    def recovered(self, topic: str, next_offset: int, *, fresh: bool) -> None:
        """A topic's WAL was loaded (not stopped): offsets continue at `next_offset`;
        `fresh`: a topic created now, owning no earlier offsets."""
