"""Per-topic state in the budget (spec/memory.md, "State"): what an idle topic, a subscription
and a consumer cost the broker beyond any cached record or publish in flight.

Measured with `bench/state_memory.py` (a real broker's RSS over 300 of each after a warm-up
of 50; bench/RESULTS.md 2026-11-29, the topic again over 1,000 on 2026-11-30; the run over
2,000 did not finish: its broker, busy with 4,600 subscriptions, did not answer a scrape in
5 s), and checked against the soak's setup (1,000 of each: bench/RESULTS.md, the soak): the
topic's record, its WAL machine and files' state, its producer's session; a subscription's
dispatcher, cursor and metadata; a consumer's record and session (its streams are charged as
streams, below). Accounted at those costs, counted from the core's tables
(`BrokerCore.state_counts`), not tracked object by object.

The runtime's transport is state too: every open gRPC stream (a batched producer's
`PublishBatches`, a consumer's `ReceiveMessages`, any call in progress) and every client
connection, measured with `bench/stream_memory.py` (bench/RESULTS.md, the soak with the
ahead-of-time kernels). `danube-cli load` holds 2,000 streams for 1,000 topics on one
connection; the topic and consumer costs above were measured with unbatched producers and a
connection per 50 topics, so a broker's streams were mostly outside them. The runtime reports
how many are open (`StatePool.transport`, at each tick); they are charged like the rest, so
they shrink the cache pool and leave less room for new topics, but opening one is never
refused here (the HTTP/2 guard's `max_concurrent_streams` bounds them per connection).

State is charged to the cache pool, the one pool that can shrink at any time: the cache
ledger's pool shrinks by the state's bytes (it evicts the broker's oldest cached batches at
once, they are on disk), as it does for what publishes borrow. State may take at most
`STATE_SHARE` of the cache pool: past it, creating a topic, a subscription or a consumer is
refused RESOURCE_EXHAUSTED (nothing is created); what exists already (a restart restores it
all) is never dropped for it. So `cache + state + publishes <= cache pool + publish pool`.

Pure: counts in, decisions out.
"""

from __future__ import annotations

from danube.machines.memory.ledger import CacheLedger

TOPIC_BYTES = 6_656
"""An idle reliable topic with one producer: bench/state_memory.py 8,069 B (1,000 topics after
a warm-up of 300, a connection per 50), bench/topic_scale.py 5,786 B (20,000 topics on one
connection; bench/RESULTS.md 2026-11-30, issue 23 point 3, round 3): 6.5 KiB is within 20 %
of both (-17.5 %, +15 %). 12,288 before the idle topic's empty queues, WAL config copy and
directory `Path` were cut (12,261 B measured then)."""
SUBSCRIPTION_BYTES = 13_312
"""A reliable subscription with no consumer attached (13,094 B)."""
CONSUMER_WITH_STREAM_BYTES = 12_288
"""A consumer kept connected, its receive stream open (bench/state_memory.py: 11,837 B)."""
RECEIVE_STREAM_BYTES = 16_058
"""An idle `ReceiveMessages` stream (bench/stream_memory.py: 16,058 B, 2,000 on one
connection)."""
CONSUMER_BYTES = max(1_024, CONSUMER_WITH_STREAM_BYTES - RECEIVE_STREAM_BYTES)
"""A consumer's own cost, without its receive stream, which is charged as an open stream
(`STREAM_BYTES`) while it is open: the consumer measured with its stream less the stream
measured alone. That difference is below zero (11,837 - 16,058 = -4,221 B: the consumers'
phase reused room freed by the consumers of the subscriptions' phase, which left), so the
measurements cannot tell the consumer's record and session from the noise; 1 KiB stands for
them (a slotted record, its table entries, an empty outbox), a floor so that creating one is
still weighed against the share (with the stream it will open: `StatePool.refusal`). Before,
a consumer was charged its stream twice (12,288 + 18,432 B)."""
STREAM_BYTES = 18_432
"""An open gRPC stream waiting on its client (bench/stream_memory.py: 20,044 B for an idle
`PublishBatches`, 16,058 B for an idle `ReceiveMessages`, 2,000 each on one connection)."""
CONNECTION_BYTES = 40_960
"""A client connection that made a call and stays open (41,329 B, 300 connections)."""
STATE_SHARE = 0.75
"""Of the cache pool, what state may take: the last quarter stays for the hot tails. The cache
is the one pool that can always shrink (every cached batch is also on disk, a read it cannot
serve goes to the segment files), so state may take most of it; half (64 MiB of a 256 MiB
budget) refused the consumers of a load of 1,000 topics with two subscriptions each and its
3,000 open streams (bench/RESULTS.md, issue 28 part 4), while the caches used 10-25 MiB."""


MEASURED = (TOPIC_BYTES, SUBSCRIPTION_BYTES, CONSUMER_BYTES)

TIERED_TOPIC_BYTES = 1_536
"""What a topic's state adds on a tiered broker: its idle `Uploader` (1,281 B) and its WAL
machine's set of deletable segments (216 B), by tracemalloc (review of 2026-11-30: both
benchmarks behind `TOPIC_BYTES` run untiered, so it left them out)."""
REPLICATED_TOPIC_BYTES = 3_072
"""What an owned topic's state adds in a cluster, where topics replicate: its
`OwnerReplication` with a link per follower (3,129 B with two followers, by tracemalloc; the
same review). A follower's replica of another broker's topic is not charged (spec/memory.md)."""


def topic_costs(*, tiered: bool, replicated: bool) -> tuple[int, int, int]:
    """The state costs of a broker (`MemoryPools.state_costs`): a topic's with what tiering
    and replication add to it."""
    topic = TOPIC_BYTES + (TIERED_TOPIC_BYTES if tiered else 0)
    topic += REPLICATED_TOPIC_BYTES if replicated else 0
    return topic, SUBSCRIPTION_BYTES, CONSUMER_BYTES


TRANSPORT = (STREAM_BYTES, CONNECTION_BYTES)

REMEMBERED_ID_BYTES = 32
"""The id of a producer gone, remembered to answer its publishes
(`danube.machines.node.remembered_producers`, at most 100,000): 25 bytes in its arrays (id,
when, why, a reference to its topic's name), 26.1-26.2 by tracemalloc at 100,000
(`python -m bench.departed_sweep --remembered 100000`, bench/RESULTS.md), and room for the
arrays' copies as they grow. Before, 107 bytes each in a dict (the same bench), not charged."""


def transport_cost(streams: int, connections: int, costs: tuple[int, int] = TRANSPORT) -> int:
    """Accounted bytes of that many open gRPC streams and client connections."""
    return costs[0] * streams + costs[1] * connections


def state_cost(
    topics: int, subscriptions: int, consumers: int, costs: tuple[int, int, int] = MEASURED
) -> int:
    """Accounted bytes of that many topics, subscriptions and consumers."""
    return costs[0] * topics + costs[1] * subscriptions + costs[2] * consumers


class StatePool:
    """Accounted bytes of the broker's topics, subscriptions and consumers, charged to the
    cache pool (module docstring)."""

    __slots__ = (
        "_cache_pool",
        "_ledger",
        "_lend",
        "budget",
        "costs",
        "limit",
        "refused",
        "remembered_bytes",
        "transport_bytes",
        "transport_costs",
        "used",
    )

    def __init__(
        self,
        ledger: CacheLedger,
        budget: int,
        lend: object = None,
        costs: tuple[int, int, int] | None = None,
        transport_costs: tuple[int, int] | None = None,
    ) -> None:
        """`ledger`: the cache pool it is charged to. `lend`: called after each change so the
        publish pool recomputes the ledger's room (`PublishPool.lend`). `costs`: of a topic,
        a subscription, a consumer (None: the measured ones); `transport_costs`: of an open
        stream, a client connection (None: the measured ones)."""
        self.costs = costs or MEASURED
        self.transport_costs = transport_costs or TRANSPORT
        self._ledger = ledger
        self._cache_pool = ledger.pool
        self._lend = lend
        self.budget = budget
        self.limit = int(ledger.pool * STATE_SHARE)
        self.used = 0
        self.refused = 0
        """Creations refused for want of room (a counter, for metrics)."""
        self.transport_bytes = 0
        """What the open streams and connections the runtime last reported cost."""
        self.remembered_bytes = 0
        """What the remembered ids of producers gone cost, as last reported."""

    def transport(self, streams: int, connections: int) -> None:
        """The runtime holds that many open gRPC streams and client connections now: charged
        at the next `update` (module docstring)."""
        self.transport_bytes = transport_cost(streams, connections, self.transport_costs)

    def remembered(self, ids: int) -> None:
        """The core remembers that many ids of producers gone (`RememberedProducers`):
        charged at the next `update`."""
        self.remembered_bytes = ids * REMEMBERED_ID_BYTES

    def update(self, topics: int, subscriptions: int, consumers: int) -> None:
        """The core's tables hold that many now (and the runtime's transport and the core's
        remembered ids what they last reported): the cache pool shrinks (or grows) to
        match."""
        used = state_cost(topics, subscriptions, consumers, self.costs)
        used += self.transport_bytes + self.remembered_bytes
        if used == self.used:
            return
        self.used = used
        self._ledger.state = used
        if callable(self._lend):
            self._lend()
        else:
            self._ledger.pool = max(0, self._cache_pool - used)
            self._ledger.fit()

    def refusal(
        self, *, what: str, topics: int = 0, subscriptions: int = 0, consumers: int = 0
    ) -> str | None:
        """Why creating `what` (that many more topics, subscriptions, consumers) is refused,
        or None when it fits. The caller raises RESOURCE_EXHAUSTED with the reason."""
        more = state_cost(topics, subscriptions, consumers, self.costs)
        more += consumers * self.transport_costs[0]  # the receive stream each one opens
        if not more or self.used + more <= self.limit:
            return None
        self.refused += 1
        return (
            f"the broker's memory budget has no room for {what}: its topics, subscriptions "
            f"and consumers hold {self.used} of the {self.limit} bytes they may use (budget "
            f"{self.budget} bytes, --memory-budget) and this needs {more} more. Nothing was "
            "created: remove unused topics or subscriptions, or give the broker a larger "
            "--memory-budget"
        )
