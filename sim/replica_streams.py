"""The replication streams between simulated brokers (`danube.runtime.replication_link`'s
part in the simulator): one link per (owner incarnation, follower) pair carrying `Replicate`s
one way and the follower's answers the other, over the simulated network's latency and loss,
with the runtime transport's rules:

- A stream never loses a message inside it; it breaks as a whole, when either end dies or is
  cut off (a partition of either broker), or a message on it is lost.
- On a break, what was in flight and queued is gone and the owner hears it once
  (`interpreter.replication.stream_broke`, after `DETECT_US`), if it still runs.
- What the owner sends while the link is down (also the resends it makes on hearing of the
  break) is queued for the next stream, which the link tries to open every `RECONNECT_US`;
  a queue beyond `QUEUE_LIMIT` messages is a loss like a break.

`ask` is the follower's unary `EpochEnd` call to the owner."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.network import Network
from sim.world import World

if TYPE_CHECKING:
    from sim.cluster_node import BrokerProcess, SimNode

DETECT_US = 200_000
"""How long an owner takes to notice a broken stream (the runtime's keepalive and reset)."""
RECONNECT_US = 100_000
QUEUE_LIMIT = 4_096


@dataclass(slots=True)
class _Link:
    owner: BrokerProcess
    follower: str
    stream: BrokerProcess | None = None
    """The follower incarnation of the open stream; None while down."""
    session: int = 0
    queue: deque[Any] = field(default_factory=deque)
    forward_arrival: int = 0
    back_arrival: int = 0
    reconnecting: bool = False


class ReplicaStreams:
    def __init__(self, world: World, network: Network, nodes: dict[str, SimNode]) -> None:
        self.world = world
        self.network = network
        self.nodes = nodes
        self._links: dict[tuple[str, str], _Link] = {}
        self.sent = 0
        self.broken = 0
        self.handed_over = 0
        """Moves whose owner handed the topic to its in-sync followers (no upload waited)."""
        self.handed_over_unindexed = 0
        self.kept_removed = 0
        """Handed-over directories an old owner removed once no replica set counted on it."""
        self.restarted = 0
        """Topics an owner unloaded and claimed again after a repair rewound its log below
        what it had sent (`Ownership.restart`)."""
        self.restarted_served = 0
        """Of those, the loads that served them again here, from the kept files."""
        """Records those owners held that the object index did not: the tails not uploaded."""
        self.on_ack: Callable[[str, str, int | None], None] | None = None
        """Hears every publish a broker acknowledges: (broker, topic, its claim's revision)."""
        self.on_foreign: Callable[[str, str, str, int, int], None] | None = None
        """Hears a follower append a `Replicate`'s frames although it had seen a higher epoch
        than the sender's: (follower, sender, topic, sent epoch, epoch seen) (r3)."""

    def _process(self, name: str) -> BrokerProcess | None:
        node = self.nodes.get(name)
        return None if node is None else node.running

    def _reachable(self, owner: BrokerProcess, follower: BrokerProcess | None) -> bool:
        network = self.network
        return (
            follower is not None
            and owner.alive
            and follower.alive
            and self._process(owner.name) is owner
            and self._process(follower.name) is follower
            and network.peers_reachable(owner.name, follower.name)
        )

    def _lossy(self) -> bool:
        faults = self.network.faults
        return bool(faults.loss) and self.world.rng.random() < faults.loss

    def _link(self, owner: BrokerProcess, follower: str) -> _Link:
        key = (owner.name, follower)
        link = self._links.get(key)
        if link is None or link.owner is not owner:
            link = self._links[key] = _Link(owner, follower)
        return link

    def _break(self, link: _Link) -> None:
        """A loss: the stream and the queue go; the owner hears of it once."""
        link.stream = None
        link.session += 1
        link.queue.clear()
        self.broken += 1
        owner, follower = link.owner, link.follower
        self.world.log(f"replica stream {owner.name}->{follower} broke")

        def tell() -> None:
            data = owner.data
            if owner.alive and data is not None and data.broker.interpreter is not None:
                data.broker.interpreter.replication.stream_broke(follower)

        self.world.at(DETECT_US, tell)
        self._reconnect_later(link)

    def _reconnect_later(self, link: _Link) -> None:
        if link.reconnecting:
            return
        link.reconnecting = True

        def attempt() -> None:
            link.reconnecting = False
            if (
                not link.owner.alive
                or self._links.get((link.owner.name, link.follower)) is not link
            ):
                return
            if link.stream is not None or not link.queue:
                return
            target = self._process(link.follower)
            if not self._reachable(link.owner, target):
                self._reconnect_later(link)
                return
            link.stream = target
            queued, link.queue = link.queue, deque()
            for message in queued:
                self._transmit(link, message)

        self.world.at(RECONNECT_US, attempt)

    def _transmit(self, link: _Link, message: Any) -> None:
        if link.stream is None:
            if len(link.queue) >= QUEUE_LIMIT:
                self._break(link)
                return
            link.queue.append(message)
            self._reconnect_later(link)
            return
        if not self._reachable(link.owner, link.stream) or self._lossy():
            self._break(link)
            return
        self.sent += 1
        now = self.world.now
        latency = self.network.latency() + self.network.peer_delay(link.owner.name, link.follower)
        arrival = link.forward_arrival = max(link.forward_arrival, now + latency)
        session, follower = link.session, link.stream
        owner_name = link.owner.name

        def arrive() -> None:
            if link.session != session or link.stream is not follower:
                return  # the stream broke meanwhile: lost with it
            if not self._reachable(link.owner, follower):
                self._break(link)
                return
            data = follower.data
            if data is not None and data.broker.interpreter is not None:
                before = _follower_log(follower, message.topic)
                data.broker.interpreter.replication.received(owner_name, message)
                if before is not None and message.epoch < before[0]:
                    after = _follower_log(follower, message.topic)
                    if after is not None and after[1] > before[1] and self.on_foreign:
                        self.on_foreign(follower.name, owner_name, message.topic,
                                        message.epoch, before[0])  # fmt: skip

        self.world.at(arrival - now, arrive)

    # -- the ports' calls --------------------------------------------------------------------

    def send(self, owner: BrokerProcess, follower: str, message: Any) -> None:
        """`ReplicaSend` from `owner`'s current incarnation."""
        self._transmit(self._link(owner, follower), message)

    def answer(self, follower: BrokerProcess, owner: str, answer: Any) -> None:
        """`ReplicaAnswer` from `follower`, on the stream its owner opened to it."""
        owner_process = self._process(owner)
        link = None if owner_process is None else self._links.get((owner, follower.name))
        if link is None or link.stream is not follower:
            return  # the stream it came on is gone: the owner resends after its break
        if not self._reachable(link.owner, follower) or self._lossy():
            self._break(link)
            return
        now = self.world.now
        latency = self.network.latency() + self.network.peer_delay(owner, follower.name)
        arrival = link.back_arrival = max(link.back_arrival, now + latency)
        session = link.session

        def arrive() -> None:
            if link.session != session or link.stream is not follower:
                return
            data = link.owner.data
            if link.owner.alive and data is not None and data.broker.interpreter is not None:
                data.broker.interpreter.replication.answered(follower.name, answer)

        self.world.at(arrival - now, arrive)

    def ask(
        self, follower: BrokerProcess, owner: str, topic: str, epoch: int, last_epoch: int,
        done: Callable[..., None],
    ) -> None:  # fmt: skip
        """`AskEpochEnd`: the owner's answer after a round trip, None when it is not the
        owner of `epoch`; an error when it cannot be reached."""
        target = self._process(owner)
        network = self.network
        if target is None or not self._reachable(target, follower) or self._lossy():
            self.world.at(2 * network.latency(), lambda: done(error=ConnectionError(owner)))
            return

        def answered() -> None:
            data = target.data
            if not follower.alive or not target.alive or data is None or data.broker.core is None:
                done(error=ConnectionError(owner))
                return
            if data.broker.claims.get(topic) != epoch:
                done(None)
                return
            assert data.broker.interpreter is not None
            done(data.broker.interpreter.replication.epoch_end(topic, last_epoch))

        self.world.at(2 * network.latency(), answered)


def _follower_log(process: BrokerProcess, topic: str) -> tuple[int, int] | None:
    """(highest epoch seen, log end) of the broker's follower log of `topic`, if it has one
    loaded: what r3 compares around the delivery of a `Replicate`, from outside the
    machine (a planted bug may change the machine's decision, not what it then holds)."""
    data = process.data
    core = None if data is None else data.broker.core
    replica = None if core is None else core.followers.replicas.get(topic)
    log = None if replica is None else replica.machine
    return None if log is None else (log.epoch, log.log_end)
