"""Invariant 18 (memory within budget) and 19/20's reports, as the simulated broker hands them
to the checker after each tick: the pools, the ledger, giving memory back, the RSS squeeze,
idle caches, connections, held records, paused reads, the publish pool. Split out of
`sim.checker` (module size); `InvariantChecker` inherits these."""

from __future__ import annotations

from danube.machines.memory.giveback import FULL_MIN_INTERVAL_MS, MIN_INTERVAL_MS
from danube.machines.memory.ledger import CacheLedger
from danube.machines.memory.publish import PublishPool
from danube.machines.memory.state import REMEMBERED_ID_BYTES, state_cost, transport_cost
from sim.connections import SimConnections

MEMORY = "18 memory within budget"
TIMERS = "19 timers are never late"
IDLE = "20 only idle producers expire"


class MemoryChecks:
    """The checks of what the broker reports from inside after a tick; each violation goes
    through `_violate`, which the checker defines."""

    def _violate(self, invariant: str, detail: str) -> None:
        raise NotImplementedError

    def memory_checked(self, pool: int, accounted: int, held: int) -> None:
        """17: the hot caches never hold more than the broker's cache pool, and the ledger
        that enforces it counts exactly what they hold (a cache that drops batches behind
        its back, or one forgotten without release, would make it evict wrongly)."""
        if accounted > pool:
            self._violate(MEMORY, f"hot caches account {accounted} bytes, over the pool {pool}")
        if accounted != held:
            self._violate(
                MEMORY, f"the cache ledger counts {accounted} bytes, the caches hold {held}"
            )

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
        """18, state: after a tick the cache pool is charged exactly what the core's topics,
        subscriptions and consumers, the open streams and connections reported before it and
        the ids of producers gone it remembered then cost, and the running count of
        subscriptions equals the subscriptions the topics hold (a path that adds or drops
        one without counting would make the budget drift)."""
        if counts[1] != subscriptions:
            self._violate(
                MEMORY, f"{counts[1]} subscriptions counted, the topics hold {subscriptions}"
            )
        cost = state_cost(*counts, costs) + transport_cost(*transport, transport_costs)
        cost += remembered * REMEMBERED_ID_BYTES
        if charged != cost:
            self._violate(MEMORY, f"state charged {charged} bytes to the cache pool, costs {cost}")

    def returns_checked(
        self, returns: list[tuple[int, int, int, bool, bool]], drop_bytes: int
    ) -> None:
        """18, giving memory back: a `ReturnMemory` only after a large drop of the pools'
        accounted use (at least `drop_bytes`) or while the process's RSS is over its
        high-water mark, and at most once in `MIN_INTERVAL_MS` within a process (a
        collection and a trim stall the loop: a rule that returned at every drop, or at
        every tick over the mark, would run them at every tick under load); a full one (every
        generation collected, what holds the loop longest) at most once in
        `FULL_MIN_INTERVAL_MS` within a process, the first of a process full."""
        if not returns:
            return
        incarnation, at_ms, freed, pressed, full = returns[-1]
        if freed < drop_bytes and not pressed:
            self._violate(MEMORY, f"memory given back after a fall of {freed} < {drop_bytes} B")
        if len(returns) > 1 and returns[-2][0] == incarnation:
            since = at_ms - returns[-2][1]
            if since < MIN_INTERVAL_MS:
                self._violate(MEMORY, f"memory given back twice within {since} ms")
        earlier = [r for r in returns[:-1] if r[0] == incarnation]
        if not earlier and not full:
            self._violate(MEMORY, "the first return of memory of a process was not full")
        fulls = [r[1] for r in earlier if r[4]]
        if full and fulls and at_ms - fulls[-1] < FULL_MIN_INTERVAL_MS:
            self._violate(
                MEMORY, f"a full collection {at_ms - fulls[-1]} ms after the last full one"
            )

    def rss_checked(self, ledger: CacheLedger, rss: int, high: int) -> None:
        """18, the budget held on RSS: after a tick fed an RSS over the high-water mark, the
        caches hold no more than their pool less the overshoot (they gave way to memory the
        pools do not account), and under the mark the pool's limit is whole again (it
        recovers as RSS falls). The accounted total stays within the budget either way
        (`memory_checked`, `publish_pool_checked`)."""
        over = max(0, rss - high)
        room = max(0, ledger.pool - over)
        if ledger.total > room:
            self._violate(
                MEMORY,
                f"hot caches account {ledger.total} bytes with RSS {over} over its mark, over "
                f"their squeezed pool {room}",
            )
        if not over and ledger.limit != ledger.pool:
            self._violate(
                MEMORY,
                f"the cache pool stays squeezed to {ledger.limit} of {ledger.pool} bytes with "
                "RSS under its mark",
            )

    def idle_checked(self, ledger: CacheLedger, now_ms: int) -> None:
        """18, idle caches: with `idle_ms` set, no cache holds batches once nothing was added
        to it for `idle_ms` and the sweep that follows (a quarter of it) has run."""
        if not ledger.idle_ms:
            return
        late = ledger.idle_ms + ledger.idle_ms // 4 + 100
        kept = [
            c.topic
            for c, at in ledger._active.items()
            if c.oldest is not None and now_ms - at > late
        ]
        if kept:
            self._violate(MEMORY, f"idle caches still held after {late} ms: {', '.join(kept[:3])}")

    def connections_checked(self, connections: SimConnections, now_us: int) -> None:
        """18, the connection gate: open and pending connections within their caps, none
        pending past its first-call deadline (and a tick), no client that calls at once
        refused while the cap is not full of proven connections."""
        for problem in connections.problems(now_us):
            self._violate(MEMORY, problem)

    def held_checked(self, used: int, held: tuple[int, list[str]]) -> None:
        """18, the consumer pool: it counts exactly the records reliable subscriptions hold
        for their consumers, and they hold none their dispatcher no longer waits on (a
        record kept after its acknowledgement, or a subscription dropped without letting
        its records go, would fill the pool and pause every subscription's reads)."""
        total, stray = held
        if used != total:
            self._violate(
                MEMORY, f"the consumer pool counts {used} bytes, subscriptions hold {total}"
            )
        if stray:
            self._violate(MEMORY, f"records held in vain: {', '.join(stray[:3])}")

    def producers_checked(self, early: list[str]) -> None:
        """20: a producer is removed for idleness only once neither a publish nor a health
        check reached the broker for `producer_idle_ms` (spec/memory.md, "Departed
        clients")."""
        if early:
            self._violate(IDLE, f"producers expired early: {', '.join(early[:3])}")

    def timers_checked(self, late: list[str]) -> None:
        """19: a tick handles every reliable subscription timer due by then (an ack deadline,
        a redelivery, a cursor flush): a tick visits only the topics touched or due (issue 28
        point 3), so a timer it does not know of would wait for an unrelated input."""
        if late:
            self._violate(TIMERS, f"a tick left timers due: {', '.join(late[:3])}")

    def paused_checked(self, waiting: list[str]) -> None:
        """18, the consumer pool's paused reads: none waits while the pool has room, nor
        (while it is full) one of a subscription that holds nothing, which may always read
        once: a subscription whose consumers acknowledged everything must not stay paused
        while other subscriptions' slow consumers keep the pool full."""
        if waiting:
            self._violate(MEMORY, f"reads paused in vain: {', '.join(waiting[:3])}")

    def publish_pool_checked(
        self, pool: PublishPool, cached: int, pools: int, idle: bool, lent: int = 0
    ) -> None:
        """18, the publish pool: what publishes in flight hold stays within the room the
        pool had for them (its capacity less the memory pressure), the caches and the
        publishes together within their two pools (the cache gave way for what publishes
        borrowed), a pool with no request in flight holds nothing (a publish answered
        without giving its room back leaks it: the broker would refuse ever more), and the
        first waiter never waits for room that is free (a release that does not serve the
        queue leaves publishes waiting out their time). What waiting publishes hold outside
        the pool stays within `max_waiting_bytes` (one waiter alone may hold more).
        `lent`: what held records borrow of the cache pool now; it shrinks the capacity
        since publishes were admitted (never below what they hold, `CacheLedger.lendable`),
        while the pressure, set in bytes, does not shrink with it: it is added back."""
        if pool.used + pool.pressure > pool.capacity + lent:
            self._violate(
                MEMORY,
                f"publishes hold {pool.used} bytes, over the room the pool had "
                f"({pool.capacity} less {pool.pressure} under pressure)",
            )
        if cached + pool.used > pools:
            self._violate(
                MEMORY,
                f"caches and state ({cached}) and publishes ({pool.used}) hold more than "
                f"their pools {pools}",
            )
        if idle and pool.used:
            self._violate(MEMORY, f"the publish pool holds {pool.used} bytes with no publish left")
        if pool.waiting > 1 and pool.waiting_bytes > pool.max_waiting_bytes:
            self._violate(
                MEMORY,
                f"{pool.waiting} publishes wait for room holding {pool.waiting_bytes} bytes, "
                f"more than {pool.max_waiting_bytes} may",
            )
        if pool.overlooked:
            self._violate(
                MEMORY,
                f"a publish of {pool.overlooked} bytes waits first in line although the pool "
                f"has room for it ({pool.used} of {pool.capacity} used, {pool.pressure} pressure)",
            )

    def room_wait_checked(self, timeout_ms: int, pool: PublishPool) -> None:
        """18, the publish pool's waits: none asks to wait longer than a publish may
        (`wait_ms`, a stream's `stream_wait_ms`). A wait timed on the wall clock does when
        the clock is set back: it would wait the jump too, and its paused time be negative."""
        patience = max(pool.wait_ms, pool.stream_wait_ms)
        if timeout_ms > patience:
            self._violate(
                MEMORY,
                f"a publish asks to wait {timeout_ms} ms for room, longer than any may "
                f"({patience} ms)",
            )

    def budget_checked(
        self, accounted: tuple[int, int, int, int], budget: int, over_share: int
    ) -> None:
        """18, the whole budget: the caches, the state, the publishes in flight and the
        records held for consumers together never pass it (issue 28: "accounted memory
        never exceeds the budget"). The one exception is state beyond the share it may take
        (a restart restores every topic, open streams are never refused): that much more."""
        if sum(accounted) > budget + over_share:
            cache, state, publish, held = accounted
            self._violate(
                MEMORY,
                f"the pools account {sum(accounted)} bytes (caches {cache}, state {state}, "
                f"publishes {publish}, held records {held}), over the budget {budget}"
                + (f" and the {over_share} bytes state holds past its share" if over_share else ""),
            )
