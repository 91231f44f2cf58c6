"""The network between clients and the broker: latency (so unary calls reorder), loss,
partitions, and ordered streams that break as a whole (TCP does not lose a message inside a
live connection; it loses the connection)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
        self._streams = 0

    def latency(self) -> int:
        return _FLOOR_US + int(self.world.rng.expovariate(1.0 / self.faults.latency_us))

    def reachable(self, client: str) -> bool:
        return self._cut_until.get(client, -1) <= self.world.now

    def partition(self, client: str, duration_us: int) -> None:
        self._cut_until[client] = self.world.now + duration_us
        self.injected["partition"] += 1
        self.world.log(f"fault partition {client} for {duration_us}us")

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
