"""The network between clients and the broker: latency (so unary calls reorder), loss,
partitions, and ordered streams that break as a whole (TCP does not lose a message inside a
live connection; it loses the connection)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import log as _log

from sim.faults import Faults, Injected
from sim.world import World

_FLOOR_US = 50


@dataclass(slots=True)
class Stream:
    """One receive stream (broker to consumer), FIFO while alive."""

    stream_id: int
    client: str
    alive: bool = True
    last_arrival: int = 0


class Network:
    def __init__(self, world: World, faults: Faults, injected: Injected) -> None:
        self.world = world
        self.faults = faults
        self.injected = injected
        self._cut_until: dict[str, int] = {}
        self._store_cut_until: dict[str, int] = {}
        """Broker → end of a cut from the store only (`partition(..., store_only=True)`)."""
        self._link_cut_until: dict[frozenset[str], int] = {}
        """Pair of brokers → end of a cut between the two only (`cut_link`)."""
        self._slow_until: dict[str, tuple[int, int]] = {}
        """Broker → (end, extra µs) of a slow spell of its links to peers (`slow_links`)."""
        self._streams = 0

    def latency(self) -> int:
        # `rng.expovariate(1.0 / latency_us)`, its one line inlined (same draw, same float:
        # a call layer less on every message)
        return _FLOOR_US + int(
            -_log(1.0 - self.world.rng.random()) / (1.0 / self.faults.latency_us)
        )

    def reachable(self, client: str) -> bool:
        """`client` and the store (etcd, the broker) reach each other."""
        now = self.world.now
        return self._cut_until.get(client, -1) <= now and (
            self._store_cut_until.get(client, -1) <= now
        )

    def peers_reachable(self, a: str, b: str) -> bool:
        """Brokers `a` and `b` reach each other (replication streams): neither is cut off
        from everything, and the link between them is not cut."""
        now = self.world.now
        return (
            self._cut_until.get(a, -1) <= now
            and self._cut_until.get(b, -1) <= now
            and self._link_cut_until.get(frozenset((a, b)), -1) <= now
        )

    def peer_delay(self, a: str, b: str) -> int:
        """Extra µs a message between brokers `a` and `b` takes now (a slow spell of
        either's links: a congested or overloaded machine, a follower slow to read)."""
        extra = 0
        for name in (a, b):
            until, slow = self._slow_until.get(name, (-1, 0))
            if until > self.world.now:
                extra = max(extra, slow)
        return extra

    def partition(self, client: str, duration_us: int, *, store_only: bool = False) -> None:
        """Cuts `client` off from everything, or (`store_only`) from the store alone: a
        broker whose etcd connection is down still reaches its peers, so an owner whose
        lease runs out goes on replicating while a follower is promoted."""
        cuts = self._store_cut_until if store_only else self._cut_until
        cuts[client] = self.world.now + duration_us
        kind = "store_partition" if store_only else "partition"
        self.injected[kind] += 1
        self.world.log(f"fault {kind} {client} for {duration_us}us")

    def cut_link(self, a: str, b: str, duration_us: int) -> None:
        """Brokers `a` and `b` cannot reach each other (each still reaches etcd): an
        owner-follower partition."""
        self._link_cut_until[frozenset((a, b))] = self.world.now + duration_us
        self.injected["link_partition"] += 1
        self.world.log(f"fault link_partition {a}-{b} for {duration_us}us")

    def slow_links(self, name: str, duration_us: int, extra_us: int) -> None:
        """For `duration_us`, every message to or from broker `name`'s peers takes `extra_us`
        longer (streams stay in order, so all that follows waits too)."""
        self._slow_until[name] = (self.world.now + duration_us, extra_us)
        self.injected["slow_link"] += 1
        self.world.log(f"fault slow_link {name} +{extra_us}us for {duration_us}us")

    def send(self, client: str, action: Callable[[], None]) -> bool:
        """One unary request or reply between `client` and the broker; False when it is lost
        (the caller's timeout notices)."""
        if not self.reachable(client):
            return False
        if self.faults.loss and self.world.rng.random() < self.faults.loss:
            self.injected["message_lost"] += 1
            return False
        self.world.at(self.latency(), action)
        return True

    def open_stream(self, client: str) -> Stream:
        self._streams += 1
        return Stream(self._streams, client)

    def stream_send(self, stream: Stream, action: Callable[[], None]) -> bool:
        """Sends on a stream, in order; False once the stream is broken."""
        if not stream.alive:
            return False
        if not self.reachable(stream.client) or (
            self.faults.loss and self.world.rng.random() < self.faults.loss
        ):
            self.injected["stream_broken"] += 1
            stream.alive = False
            return False
        arrival = max(stream.last_arrival, self.world.now + self.latency())
        stream.last_arrival = arrival

        def arrive() -> None:
            if stream.alive:
                action()

        self.world.at(arrival - self.world.now, arrive)
        return True
