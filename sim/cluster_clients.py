"""Producers of a cluster run with data planes: one reliable producer per topic, as an
application with a lookup-following client runs it. It asks a random running broker where the
topic lives (that broker's view of the assignments, stale or not), creates its producer there
and sends `<topic>#<n>` one at a time; any error or timeout sends it back to the lookup, and
the same payload goes again until it is acknowledged. The checker hears of every
acknowledgement."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from danube.machines.cluster.placement import ViewFacts, lookup_from_view
from danube.machines.wal import records
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode
from sim.broker import Reply
from sim.clients import Caller
from sim.cluster_node import SimNode
from sim.network import Network
from sim.requests import ProducerRequest
from sim.world import US_PER_MS, US_PER_S, World

REQUEST_TIMEOUT_US = 2 * US_PER_S
RETRY_US = 200 * US_PER_MS


class Acknowledgements(Protocol):
    def acknowledged(self, topic: str, payload: str, broker: str) -> None: ...


class ClusterProducer:
    def __init__(
        self,
        world: World,
        network: Network,
        nodes: Sequence[SimNode],
        checker: Acknowledgements,
        *,
        name: str,
        topic: str,
        rate: float,
    ) -> None:
        self.world = world
        self.network = network
        self.nodes = nodes
        self.checker = checker
        self.name = name
        self.topic = topic
        self.interval_us = int(US_PER_S / rate)
        self.started = False
        self.stopped = False
        self.lookups = 0
        self._producer_id: int | None = None
        self._sequence = 0
        self._caller = Caller(world, network, _Route(nodes[0]), name, REQUEST_TIMEOUT_US)

    def start(self) -> None:
        self._lookup()

    def stop(self) -> None:
        self.stopped = True

    # -- lookup and creation -----------------------------------------------------------------------

    def _lookup(self) -> None:
        """A TopicLookup answered from a random broker's view (a round trip)."""
        if self.stopped:
            return
        self.lookups += 1
        running = [node for node in self.nodes if node.running is not None]
        if not running:
            self.world.at(RETRY_US, self._lookup)
            return
        asked = self.world.rng.choice(running)
        target = route_for(self.nodes, asked, self.topic)
        if target is None:
            self.world.at(RETRY_US, self._lookup)
            return
        self._caller.broker = _Route(target)
        self._producer_id = None
        self.world.at(2 * self.network.latency(), self._create)

    def _create(self) -> None:
        if self.stopped:
            return
        request = ProducerRequest(
            self._caller.next_request_id(), self.name, self.topic, int(DispatchStrategy.RELIABLE)
        )
        self._call(request, self._created)

    def _created(self, answer: Any) -> None:
        if isinstance(answer, DanubeError):
            self.world.at(RETRY_US, self._lookup)
            return
        self._producer_id = answer.producer_id
        self._send()

    # -- publishing --------------------------------------------------------------------------------

    def _payload(self) -> str:
        return f"{self.topic}#{self._sequence}"

    def _send(self) -> None:
        if self.stopped or self._producer_id is None:
            return
        payload = self._payload()
        message = records.Record(  # a SendMessage, decoded (`sim.requests`)
            request_id=self._caller.next_request_id(),
            producer_id=self._producer_id,
            topic_name=self.topic,
            payload=payload.encode(),
            publish_time=self.world.now_ms,
            producer_name=self.name,
        )
        started = self.world.now
        self._call(message, lambda answer: self._answered(answer, payload, started))

    def _answered(self, answer: Any, payload: str, started: int) -> None:
        if isinstance(answer, DanubeError):
            self.world.at(RETRY_US, self._lookup)
            return
        self.checker.acknowledged(self.topic, payload, self._caller.broker.node.name)
        self._sequence += 1
        wait = started + self.interval_us - self.world.now
        if wait > 0:
            self.world.at(wait, self._send)
        else:  # late already (the usual case at the `object` level): no event of its own
            self._send()

    # -- the wire ----------------------------------------------------------------------------------

    def _call(self, request: Any, answered: Callable[[Any], None]) -> None:
        """One request to the target broker; no answer in time is an error like any other
        (look the topic up again)."""
        timeout = DanubeError(ErrorCode.UNAVAILABLE, "no answer within the timeout")
        self._caller.call(request, answered, lambda: answered(timeout))


def route_for(nodes: Sequence[SimNode], asked: SimNode, topic: str) -> SimNode | None:
    """Where a TopicLookup answered by `asked` (a running broker) sends its client: the broker
    itself when its core serves the topic (CONNECT, before any rule), else the owner by the
    broker's rule (`placement.lookup_from_view`, from its load manager's view), as the
    production lookup; what that cannot tell, the store's facts as the data plane's view has
    them. None: the lookup was refused (the client asks again later). Shared by producers,
    consumers and the brokers' own dead-letter producers (`sim.cluster_poison`)."""
    process = asked.running
    assert process is not None
    core = getattr(process.data, "core", None)  # none before the data plane starts
    if core is not None and core.serves(topic):
        return asked
    manager = process.manager
    assigned = manager.owner(topic)
    broker = None if assigned is None else assigned[0]
    registration = None if broker is None else manager.registration(broker)
    facts = ViewFacts(broker, manager.marker(topic) is not None, registration)
    try:
        located = lookup_from_view(topic, facts, asked.name)
    except DanubeError:
        return None
    owner = broker if located is not None else process.assignments.get(topic)
    return next((n for n in nodes if n.name == owner), asked)


class _Route:
    """A connection to one broker machine: requests land on its running data plane."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    def handle(self, request: Any, reply: Reply, **stream: Any) -> None:
        process = self.node.running
        if process is None or process.data is None:
            reply(DanubeError(ErrorCode.UNAVAILABLE, "connection refused (broker down)"))
            return
        process.data.broker.handle(request, reply, **stream)
