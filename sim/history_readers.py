"""Tiered runs: subscriptions that keep reading the topic's history from the object tier.

The one `audit` subscription reads the pruned history once, halfway through a run, and then
follows the tail from the WAL: object reads happen in a burst and a run rarely sees one fail
for long. A history reader instead starts a new Exclusive subscription from the earliest
offset every `every_us` once local retention has pruned a segment, so reads from objects go
on for the whole load phase, under whatever store faults the run injects (see
`Faults.s3_get_failure`). Each subscription is judged like the audit: it is owed every
acknowledged message, the pruned start included."""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube.machines.dispatch.types import StartKind, StartPosition, SubscriptionType
from sim.clients import Checker, SimConsumer
from sim.world import US_PER_MS

if TYPE_CHECKING:
    from sim.broker import SimBroker
    from sim.network import Network
    from sim.world import World

POLL_US = 100 * US_PER_MS
"""How often the readers look whether local retention pruned anything yet."""
PREFIX = "history-"
"""Subscription names: `history-0`, `history-1`, …, one generation per `every_us`."""


class HistoryReaders:
    def __init__(
        self,
        world: World,
        network: Network,
        broker: SimBroker,
        checker: Checker,
        topics: list[str],
        *,
        every_us: int,
        ack_delay_us: int,
        nack: float,
        judged: list[tuple[str, str]],
    ) -> None:
        """`judged`: the run's list of subscriptions owed every acknowledged message; each
        new subscription is added to it."""
        self.world = world
        self.network = network
        self.broker = broker
        self.checker = checker
        self.topics = topics
        self.every_us = every_us
        self.ack_delay_us = ack_delay_us
        self.nack = nack
        self.judged = judged
        self.consumers: list[SimConsumer] = []
        self.generations = 0
        self.stopped = False
        """Set when the drain begins: no new subscriptions, the existing ones go on."""

    def start(self) -> None:
        self.world.at(POLL_US, self._tick)

    def _tick(self) -> None:
        if self.stopped:
            return
        if not self.broker.tier_stats["segments_pruned"]:
            self.world.at(POLL_US, self._tick)
            return
        name = f"{PREFIX}{self.generations}"
        self.world.log(f"history readers: {name} starts at the earliest offset")
        for topic in self.topics:
            consumer = SimConsumer(
                self.world,
                self.network,
                self.broker,
                self.checker,
                name=f"h{self.generations}",
                topic=topic,
                subscription=name,
                sub_type=int(SubscriptionType.EXCLUSIVE),
                ack_delay_us=self.ack_delay_us,
                nack=self.nack,
                start=StartPosition(StartKind.EARLIEST),
            )
            self.consumers.append(consumer)
            self.judged.append((topic, name))
            consumer.start()
        self.generations += 1
        self.world.at(self.every_us, self._tick)

    @property
    def received(self) -> int:
        return sum(consumer.received for consumer in self.consumers)
