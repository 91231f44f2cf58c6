"""Producers of a cluster run with data planes: one reliable producer per topic, as an
application with a lookup-following client runs it. It asks a random running broker where the
topic lives (that broker's view of the assignments, stale or not), creates its producer there
and sends `<topic>#<n>` at its rate with up to `in_flight` publishes unanswered (a client's
window: at the `object` level an answer waits for the message's object to be uploaded and
indexed, so a producer with one publish in flight sends a few a second and each object holds
one message; issue 22, round 12). Any error or timeout abandons every publish in flight (a
client dropping its connection: their late answers are ignored), sends the producer back to
the lookup, and every unacknowledged payload goes again, oldest first, until it is
acknowledged; so a topic may store a payload twice or out of order, which invariant h allows
(it asks that every acknowledged payload is stored, wherever). The checker hears of every
acknowledgement.

A batched producer (`batch` above 1: `ClusterWorkload.batched` of them, drawn per topic) is
our client's batched path (`danube.client.batching`, linger 0): its application produces at
the rate whatever the window, the payloads produced while the window is full accumulate (at
most `batch`, the application's send waiting beyond that), and they leave together as one
`PublishBatch` (one WAL frame, one answer) as soon as a publish's answer opens the window;
payloads to send again go `batch` at a time (issue 22, round 13)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from danube.machines.cluster import holding
from danube.machines.cluster.placement import ViewFacts, lookup_from_view
from danube.machines.wal import records
from danube.machines.wal.format import encode_frame
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode
from sim.broker import Reply
from sim.clients import Caller
from sim.cluster_node import SimNode
from sim.network import Network
from sim.requests import ProducerRequest, PublishBatch
from sim.world import US_PER_MS, US_PER_S, Timeout, World

REQUEST_TIMEOUT_US = 2 * US_PER_S
RETRY_US = 200 * US_PER_MS
HOLD_SLACK_MS = 100
"""How late past its hold a held lookup may be answered: one recheck and the clock's ms."""


class Acknowledgements(Protocol):
    def acknowledged(self, topic: str, payload: str, broker: str) -> None: ...

    def lookup_answered(self, topic: str, held_ms: int, hold_ms: int) -> None: ...


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
        in_flight: int = 1,
        batch: int = 1,
        hold_ms: int = 0,
    ) -> None:
        """`batch` 1: one `SendMessage` a publish; above: the batched path (module doc).
        `hold_ms`: the brokers' `cluster.lookup_hold_ms` (`_ask`; 0: never held)."""
        self.world = world
        self.network = network
        self.nodes = nodes
        self.checker = checker
        self.name = name
        self.topic = topic
        self.interval_us = int(US_PER_S / rate)
        self.in_flight = in_flight
        self.batch = batch
        self.hold_ms = hold_ms
        self.started = False
        self.stopped = False
        self.lookups = 0
        self._producer_id: int | None = None
        self._sequence = 0
        """The next new payload's number."""
        self._unacked: dict[int, str] = {}
        """number → payload, of every payload sent and not yet acknowledged, oldest first."""
        self._resend: list[int] = []
        """Numbers of unacknowledged payloads not yet sent on this connection (after a
        lookup), oldest first."""
        self._sent: dict[int, _Publish] = {}
        """number → the publish of it in flight on this connection (a batch's under each
        of its numbers)."""
        self._publishes = 0
        """Publishes in flight on this connection (requests, not payloads)."""
        self._paced_from: int | None = None
        """When the last publish was sent: a new payload goes `interval_us` after it (the
        batched path: when its application produced the last payload)."""
        self._due_armed = False
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
        self._abandon()
        running = [node for node in self.nodes if node.running is not None]
        if not running:
            self.world.at(RETRY_US, self._lookup)
            return
        asked = self.world.rng.choice(running)
        self._ask(asked, asked.running, self.world.now_ms)

    def _ask(self, asked: SimNode, process: Any, asked_at_ms: int) -> None:
        """The lookup at `asked`, held as the production placement holds it: a `Settling`
        refusal is asked again from the view (`holding.hold_until`, on the simulated clock)
        until the topic has an owner or `hold_ms` has passed. A broker that went down
        meanwhile refuses the lookup (its connection is gone)."""
        if self.stopped:
            return
        target: SimNode | None = None
        if asked.running is process:
            try:
                target = locate(self.nodes, asked, self.topic)
            except DanubeError as error:
                now = self.world.now_ms
                until = holding.hold_until(
                    error,
                    asked_at_ms,
                    now,
                    self.hold_ms,
                    others_held=0,
                    max_held=holding.MAX_HELD,
                )
                if until is not None:
                    delay = (until - now) * US_PER_MS
                    self.world.at(delay, lambda: self._ask(asked, process, asked_at_ms))
                    return
        if self.hold_ms > 0:
            held = self.world.now_ms - asked_at_ms
            self.checker.lookup_answered(self.topic, held, self.hold_ms)
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

    def _abandon(self) -> None:
        """The connection is given up: its publishes' answers are ignored, and every
        unacknowledged payload goes again on the next one."""
        for publish in self._sent.values():
            publish.live = False
            publish.timer.clear()
        self._sent.clear()
        self._publishes = 0
        self._resend = list(self._unacked)

    def _send(self) -> None:
        """Fills the window: payloads to send again first, at once; then new ones, each
        `interval_us` after the last publish (a timer when it is not due yet)."""
        if self.batch > 1:
            self._send_batches()
            return
        while not self.stopped and self._producer_id is not None:
            if len(self._sent) >= self.in_flight:
                return
            if self._resend:
                self._publish(self._resend.pop(0))
                continue
            if self._paced_from is not None:
                wait = self._paced_from + self.interval_us - self.world.now
                if wait > 0:
                    if not self._due_armed:
                        self._due_armed = True
                        self.world.at(wait, self._due)
                    return
            number = self._sequence
            self._sequence += 1
            self._unacked[number] = f"{self.topic}#{number}"
            self._publish(number)

    def _send_batches(self) -> None:
        """The batched path's `_send`: while the window has room, payloads to send again
        (`batch` at a time), else every payload the application produced since the last
        publish (at most `batch`: beyond that its send waited), as one `PublishBatch`."""
        while not self.stopped and self._producer_id is not None:
            if self._publishes >= self.in_flight:
                return
            if self._resend:
                numbers, self._resend = self._resend[: self.batch], self._resend[self.batch :]
                self._publish_batch(numbers)
                continue
            now = self.world.now
            last = self._paced_from
            if last is None:
                count, self._paced_from = 1, now
            else:
                wait = last + self.interval_us - now
                if wait > 0:
                    if not self._due_armed:
                        self._due_armed = True
                        self.world.at(wait, self._due)
                    return
                produced = (now - last) // self.interval_us
                count = min(self.batch, produced)
                # beyond `batch` the application's send waited: it produces from now on
                self._paced_from = now if produced > count else last + count * self.interval_us
            numbers = []
            for _ in range(count):
                number = self._sequence
                self._sequence += 1
                self._unacked[number] = f"{self.topic}#{number}"
                numbers.append(number)
            self._publish_batch(numbers)

    def _publish_batch(self, numbers: list[int]) -> None:
        """`numbers`' payloads as one `PublishBatch`, as the client frames them."""
        assert self._producer_id is not None
        now_ms = self.world.now_ms
        encoded = [
            records.encode(
                records.Record(
                    payload=self._unacked[number].encode(),
                    publish_time=now_ms,
                    producer_name=self.name,
                    has_msg_id=False,
                )
            )
            for number in numbers
        ]
        request = PublishBatch(
            self._producer_id,
            self.topic,
            self._caller.next_request_id(),
            encode_frame(0, 0, encoded),
        )
        publish = _Publish(numbers[0], self.world.now, numbers)
        for number in numbers:
            self._sent[number] = publish
        self._publishes += 1
        publish.timer = self._caller.send(
            request,
            lambda answer: self._answered(publish, answer),
            lambda: self._answered(publish, None),
        )

    def _due(self) -> None:
        self._due_armed = False
        self._send()

    def _publish(self, number: int) -> None:
        assert self._producer_id is not None
        payload = self._unacked[number]
        message = records.Record(  # a SendMessage, decoded (`sim.requests`)
            request_id=self._caller.next_request_id(),
            producer_id=self._producer_id,
            topic_name=self.topic,
            payload=payload.encode(),
            publish_time=self.world.now_ms,
            producer_name=self.name,
        )
        self._paced_from = self.world.now
        publish = _Publish(number, self.world.now)
        self._sent[number] = publish
        self._publishes += 1
        publish.timer = self._caller.send(
            message,
            lambda answer: self._answered(publish, answer),
            lambda: self._answered(publish, None),
        )

    def _answered(self, publish: _Publish, answer: Any) -> None:
        """A publish's answer (None: its timeout), unless it was abandoned."""
        if not publish.live:
            return
        publish.live = False
        publish.timer.clear()
        self._publishes -= 1
        for number in publish.numbers:
            del self._sent[number]
        if answer is None or isinstance(answer, DanubeError):
            self.world.at(RETRY_US, self._lookup)
            self._producer_id = None  # nothing more on this connection
            self._abandon()  # and none of the others' answers counts now
            return
        broker = self._caller.broker.node.name
        for number in publish.numbers:
            self.checker.acknowledged(self.topic, self._unacked.pop(number), broker)
        self._send()

    # -- the wire ----------------------------------------------------------------------------------

    def _call(self, request: Any, answered: Callable[[Any], None]) -> None:
        """One request to the target broker; no answer in time is an error like any other
        (look the topic up again)."""
        timeout = DanubeError(ErrorCode.UNAVAILABLE, "no answer within the timeout")
        self._caller.call(request, answered, lambda: answered(timeout))


def route_for(nodes: Sequence[SimNode], asked: SimNode, topic: str) -> SimNode | None:
    """Where a TopicLookup answered by `asked` (a running broker) sends its client, answered
    at once (`locate`); None: the lookup was refused (the client asks again later). Shared
    by consumers and the brokers' own dead-letter producers (`sim.cluster_poison`)."""
    try:
        return locate(nodes, asked, topic)
    except DanubeError:
        return None


def locate(nodes: Sequence[SimNode], asked: SimNode, topic: str) -> SimNode:
    """Where a TopicLookup answered by `asked` (a running broker) sends its client: the broker
    itself when its core serves the topic (CONNECT, before any rule), else the owner by the
    broker's rule (`placement.lookup_from_view`, from its load manager's view), as the
    production lookup; what that cannot tell, the store's facts as the data plane's view has
    them. Raises the rule's refusal (`placement.Settling` for a topic between owners)."""
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
    located = lookup_from_view(topic, facts, asked.name)
    owner = broker if located is not None else process.assignments.get(topic)
    return next((n for n in nodes if n.name == owner), asked)


class _Publish:
    """One publish in flight: live until answered, timed out or abandoned."""

    __slots__ = ("live", "number", "numbers", "sent_us", "timer")

    def __init__(self, number: int, sent_us: int, numbers: list[int] | None = None) -> None:
        self.number = number
        self.sent_us = sent_us
        """When it was sent (`bench.replication_sim_latency` measures from it)."""
        self.numbers = [number] if numbers is None else numbers
        """The payloads it carries (a `PublishBatch`'s: several)."""
        self.live = True
        self.timer: Timeout = _UNSET


_UNSET = Timeout(0, lambda: None)
"""A publish's timer until `Caller.send` returns it."""


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
