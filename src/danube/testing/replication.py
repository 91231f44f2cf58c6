"""`ReplicaNetwork`: brokers of the testing kit (`CoreDriver`s) joined by in-memory replication
streams, so a test drives owners and followers through the shared interpreter, each with its
own memory port (disk), and decides when messages travel: `deliver` carries the queued ones
in order per stream until none is left; `cut` breaks the streams between two brokers (their
queued messages are lost and the owner hears `stream_broke`); `heal` joins them again."""

from __future__ import annotations

from collections import deque
from typing import Any

from danube.machines.node.core import AskEpochEnd, ReplicaAnswer, ReplicaSend
from danube.testing.driver import CoreDriver


class ReplicaNetwork:
    def __init__(self) -> None:
        self.brokers: dict[str, CoreDriver] = {}
        self.queue: deque[tuple[str, str, Any]] = deque()
        """(from, to, `Replicate` or a follower's answer), in the order they were sent."""
        self.down: set[frozenset[str]] = set()
        self.delivered = 0

    def add(self, broker_id: str, driver: CoreDriver) -> CoreDriver:
        self.brokers[broker_id] = driver
        driver.port.network = self
        driver.port.broker_id = broker_id
        return driver

    # -- the memory port's calls -------------------------------------------------------------

    def send(self, source: str, effect: ReplicaSend | ReplicaAnswer) -> None:
        if isinstance(effect, ReplicaSend):
            target, message = effect.follower, effect.message
        else:
            target, message = effect.owner, effect.answer
        if frozenset((source, target)) not in self.down and target in self.brokers:
            self.queue.append((source, target, message))

    def ask(self, source: str, effect: AskEpochEnd) -> int | None:
        owner = self.brokers.get(effect.owner)
        if owner is None or frozenset((source, effect.owner)) in self.down:
            raise ConnectionError(f"{effect.owner} is unreachable from {source}")
        return owner.interpreter.replication.epoch_end(effect.topic, effect.last_epoch)

    # -- the test's calls --------------------------------------------------------------------

    def deliver(self, limit: int = 100_000) -> int:
        """Carries queued messages (and those they cause) until none is left; returns how
        many went."""
        count = 0
        while self.queue and count < limit:
            source, target, message = self.queue.popleft()
            driver = self.brokers.get(target)
            if driver is None or frozenset((source, target)) in self.down:
                continue
            replication = driver.interpreter.replication
            if type(message).__name__ == "Replicate":
                replication.received(source, message)
            else:
                replication.answered(source, message)
            count += 1
        self.delivered += count
        return count

    def cut(self, a: str, b: str) -> None:
        """The streams between `a` and `b` break: what is queued between them is lost, and
        each side that owns topics hears that its stream to the other broke."""
        self.down.add(frozenset((a, b)))
        self.queue = deque(m for m in self.queue if frozenset(m[:2]) != frozenset((a, b)))
        for here, there in ((a, b), (b, a)):
            if here in self.brokers:
                self.brokers[here].interpreter.replication.stream_broke(there)

    def heal(self, a: str, b: str) -> None:
        self.down.discard(frozenset((a, b)))
