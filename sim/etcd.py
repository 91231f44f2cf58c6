"""A simulated etcd for the cluster run: `danube.metadata.state.MetadataState` (revisions,
transactions with compares, leases, watch events) driven by the simulation's virtual clock.

Everything a broker asks crosses `sim.network.Network`: a request reaches the store after a
latency (or is lost, or dropped by a partition), is applied there, and its answer travels back
the same way; the caller's timeout notices what never comes back. Watches are ordered streams
from the store: each commit's events go to every watcher of their prefix in revision order, one
message per revision, and a stream that loses a message is broken as a whole (the broker
notices after a short while and watches again).

The store's clock is the simulation's: leases are granted, renewed and expire on it, collected
before every request and every 100 ms, as etcd's lessor does. The brokers' clocks drift from it
(`sim.cluster_node.Clock`). Faults of its own: a stall (requests wait, in order, and are applied
when it ends; leases keep expiring meanwhile) and slow requests (one leg takes seconds, so the
request lands or is answered after the caller gave up on it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from danube.metadata.model import (
    Compare,
    KeyValue,
    MetadataError,
    Op,
    Put,
    TxnResult,
    WatchEvent,
)
from danube.metadata.state import MetadataState
from danube.values.frozen import fast_init
from sim.cluster_faults import ClusterFaults
from sim.faults import Injected
from sim.network import Network, Stream
from sim.world import US_PER_S, World

EXPIRY_TICK_US = 100_000
"""How often expired leases are collected between requests."""
SLOW_US = (1_000_000, 6_000_000)
"""How much longer a slow request (or its answer) takes."""
BREAK_NOTICED_US = (200_000, 1_500_000)
"""How long a broker takes to notice that its watch stream broke (keepalive timeout)."""


def failed(result: Any) -> bool:
    """An answer that is an error: the store refused, or no answer came in time (the
    brokers' request timeout delivers a `TimeoutError`)."""
    return isinstance(result, MetadataError | TimeoutError)


@fast_init
@dataclass(frozen=True, slots=True)
class Origin:
    """Who wrote: a broker, and the kind of write (`Assign`, `register`, `revoke`...)."""

    broker: str
    kind: str


class CommitObserver(Protocol):
    def committed(self, events: list[WatchEvent], origin: Origin | None) -> None:
        """After every transaction (applied or not), revoke and lease expiry."""


@dataclass(slots=True)
class _Watcher:
    prefix: str
    stream: Stream
    deliver: Callable[[list[WatchEvent]], None]
    broken: Callable[[], None]


class _Request:
    """One request on its way: it reaches the store after `late_request`, is applied there
    (after a stall, if one is on), and its result travels back after `late_answer`. An object
    with methods rather than closures: a closure that schedules itself is a reference cycle,
    which only the cyclic collector frees, with everything the request holds (a tenth of a
    cluster run went to collecting such garbage)."""

    __slots__ = ("client", "etcd", "late_answer", "late_request", "reply", "result", "run", "what")

    def __init__(
        self,
        etcd: SimEtcd,
        client: str,
        what: str,
        run: Callable[[], Any],
        reply: Callable[[Any], None],
        late_request: int,
        late_answer: int,
    ) -> None:
        self.etcd = etcd
        self.client = client
        self.what = what
        self.run = run
        self.reply = reply
        self.late_request = late_request
        self.late_answer = late_answer
        self.result: Any = None

    def arrive(self) -> None:
        # applied in this event unless the request leg is slow: a hop of no time was an
        # event of its own (two of a request's five) that only moved it behind its peers
        if self.late_request:
            self.etcd.world.at(self.late_request, self.apply)
        else:
            self.apply()

    def apply(self) -> None:
        etcd = self.etcd
        world = etcd.world
        if world.now < etcd._stalled_until:
            world.at(etcd._stalled_until - world.now, self.apply)
            return
        etcd.expire()
        result: Any
        try:
            result = self.run()
        except MetadataError as error:
            result = error
        self.result = result
        world.log(f"etcd {self.client} {self.what}: {_summary(result)}")
        if self.late_answer:
            world.at(self.late_answer, self.send_answer)
        else:
            etcd.network.send(self.client, self.answer)

    def send_answer(self) -> None:
        self.etcd.network.send(self.client, self.answer)

    def answer(self) -> None:
        self.reply(self.result)


class SimEtcd:
    def __init__(
        self, world: World, network: Network, faults: ClusterFaults, injected: Injected
    ) -> None:
        self.world = world
        self.network = network
        self.faults = faults
        self.injected = injected
        self.state = MetadataState()
        self.observers: list[CommitObserver] = []
        self.txn_observer: Callable[[Sequence[Op], Origin, bool], None] | None = None
        """Told of every transaction once applied, with the keys it would write and whether
        it committed (`ClusterChecker.attempted`: a broker looping on the store)."""
        self._ttl_s: dict[int, float] = {}
        self._deadline_s: dict[int, float] = {}
        """Each live lease's expiry on the store's clock (the state keeps its own, privately;
        this copy lets the checker ask whether a lease is alive without changing anything)."""
        self.changed = True
        """Set when a lease's deadline changes (and by the brokers when their membership or
        life does): `ClusterChecker.check` runs in full only then (it clears it) or once a
        deadline may have passed."""
        self._watchers: list[_Watcher] = []
        self._stalled_until = 0

    @property
    def now_s(self) -> float:
        return self.world.now / US_PER_S

    def start(self) -> None:
        self.world.at(EXPIRY_TICK_US, self._expiry_tick)

    @property
    def lease_deadlines_s(self) -> Mapping[int, float]:
        """Each live lease's deadline in simulated seconds (`lease_alive` compares with it)."""
        return self._deadline_s

    def lease_alive(self, lease: int | None) -> bool:
        deadline = None if lease is None else self._deadline_s.get(lease)
        return deadline is not None and deadline > self.world.now / US_PER_S

    # -- requests ------------------------------------------------------------------------------

    def request(
        self, client: str, what: str, run: Callable[[], Any], reply: Callable[[Any], None]
    ) -> None:
        """`run` is applied at the store when the request arrives; `reply` gets its result (or
        the `MetadataError` it raised) when the answer arrives, if it does."""
        world, faults = self.world, self.faults
        late_request = late_answer = 0
        if faults.slow and world.rng.random() < faults.slow:
            extra = world.rng.randint(*SLOW_US)
            if world.rng.random() < 0.5:
                late_request = extra
            else:
                late_answer = extra
            self.injected["slow_request"] += 1

        request = _Request(self, client, what, run, reply, late_request, late_answer)
        self.network.send(client, request.arrive)

    def stall(self, duration_us: int) -> None:
        self._stalled_until = max(self._stalled_until, self.world.now + duration_us)
        self.injected["stall"] += 1
        self.world.log(f"fault etcd stalls for {duration_us}us")

    # -- what a request runs at the store ----------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        return self.state.get(key)

    def scan(self, prefix: str) -> list[KeyValue]:
        return self.state.scan(prefix)

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op], origin: Origin) -> TxnResult:
        result, events = self.state.txn(compares, ops)
        if self.txn_observer is not None:
            self.txn_observer(ops, origin, result.succeeded)
        self._publish(events, origin)
        return result

    def put(self, key: str, value: Any, lease: int | None, origin: Origin) -> int:
        return self.txn((), (Put(key, value, lease),), origin).revision

    def grant(self, ttl_s: float) -> int:
        lease = self.state.grant_lease(ttl_s, self.now_s)
        self._ttl_s[lease] = ttl_s
        self._deadline_s[lease] = self.now_s + ttl_s
        self.changed = True
        return lease

    def keepalive(self, lease: int) -> None:
        self.state.keepalive(lease, self.now_s)  # raises LeaseNotFound
        self._deadline_s[lease] = self.now_s + self._ttl_s[lease]
        self.changed = True

    def revoke(self, lease: int, origin: Origin) -> None:
        events = self.state.revoke(lease)
        self._forget(lease)
        self._publish(events, origin)

    def watch(
        self,
        prefix: str,
        stream: Stream,
        deliver: Callable[[list[WatchEvent]], None],
        broken: Callable[[], None],
    ) -> int:
        """Streams every later change under `prefix`; returns the current revision."""
        self._watchers.append(_Watcher(prefix, stream, deliver, broken))
        return self.state.revision

    # -- internals ---------------------------------------------------------------------------------

    def expire(self) -> None:
        now = self.now_s
        due = [lease for lease, deadline in self._deadline_s.items() if deadline <= now]
        if not due:
            # The state's leases are these, with these deadlines (`grant`, `keepalive`), so
            # it has none to expire either; this runs before every request.
            return
        for lease in due:
            self._forget(lease)
            self.world.log(f"etcd lease {lease} expired")
        self._publish(self.state.expire(now), None)

    def _forget(self, lease: int) -> None:
        self._ttl_s.pop(lease, None)
        self._deadline_s.pop(lease, None)
        self.changed = True

    def _expiry_tick(self) -> None:
        self.expire()
        self.world.at(EXPIRY_TICK_US, self._expiry_tick)

    def _publish(self, events: list[WatchEvent], origin: Origin | None) -> None:
        for observer in self.observers:
            observer.committed(events, origin)
        if not events:
            return
        batches: dict[int, list[WatchEvent]] = {}
        for event in events:
            batches.setdefault(event.mod_revision, []).append(event)
        # Each batch's events under a prefix, worked out once per prefix: the brokers' watchers
        # share a few prefixes (4.4 watchers and 2 prefixes a commit in a cluster run).
        seen: dict[tuple[int, str], list[WatchEvent]] = {}
        for watcher in list(self._watchers):
            prefix = watcher.prefix
            for revision, batch in batches.items():
                mine = seen.get((revision, prefix))
                if mine is None:
                    mine = seen[revision, prefix] = [e for e in batch if e.key.startswith(prefix)]
                if not mine:
                    continue
                if not self.network.stream_send(
                    watcher.stream, lambda w=watcher, m=mine: w.deliver(m)
                ):
                    self._watchers.remove(watcher)
                    self.world.at(self.world.rng.randint(*BREAK_NOTICED_US), watcher.broken)
                    break


def _summary(result: Any) -> str:
    if isinstance(result, TxnResult):
        return f"{'ok' if result.succeeded else 'compare failed'} at r{result.revision}"
    if isinstance(result, MetadataError):
        return type(result).__name__
    if isinstance(result, KeyValue):
        return f"r{result.mod_revision}"
    if isinstance(result, list):
        return f"{len(result)} keys"
    return "ok" if result is None else repr(result)
