"""Poison in the cluster simulator (`python -m sim --cluster --data --poison N`, issue 24):
dead letters forwarded between simulated brokers, under the cluster's faults.

The first N topics each have a subscription (`POISON_SUB`, Shared, from the earliest message)
with one consumer (`ClusterConsumer`) that follows lookups and redirects as the producers do,
acknowledges every message except the poison ones (one payload in `POISON_SHARE`, by its
CRC), which it nacks every time. Each such subscription has a failure policy stored before it
exists, as an operator may set it (`max_redelivery_count = POISON_LIMIT`, DeadLetter, short
backoff): its dead-letter topic (`dead_letter_topic`) is a cluster topic of its own, in the
same namespace for even topics and in namespace `dlq` for odd ones, placed by the load manager
like any other, so it is on another broker most of the time and moves under the faults.

A dead letter whose topic the subscription's broker does not serve is a `ForwardDeadLetter`
(`danube.machines.node.dead_letters`), carried out by `DeadLetterForwarder` as
`runtime/dead_letter_forward.py` does: one internal producer per dead-letter topic, created
through a lookup at the broker itself (redirected to the owner, `route_for`), publishing the
record as simulated network messages (lost with the network's faults, refused by a broker
that no longer serves the topic, cut by crashes), answered only once the owner acknowledged
the copy; any failure or timeout drops the producer and is answered as an error, which the core
asks again after the policy's backoff.

Judged (`PoisonLedger`, invariant `p`): a dead letter is reported stored only while the
subscription still holds the original (the original is passed only after the copy is
acknowledged); a forwarded copy holds the original's payload and points back to it
(`x-original-topic`, `-subscription`, `-topic-offset`); every stored copy is an acknowledged
publish of its dead-letter topic, so invariant h (or r1) holds it in the end; and once the
cluster settled, every acknowledged publish of a poison topic is, for its subscription,
acknowledged by the consumer, stored in the dead-letter topic with its origin, or dropped by
policy: never none. Nothing of this runs without `--poison`: no consumer, no ledger, and the
port's `ForwardDeadLetter` branch is the existing one of `SimPort.perform`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from danube import keys
from danube.interpreter.host import Done
from danube.machines.dispatch.types import StartKind, StartPosition, SubscriptionType
from danube.machines.node.catalogue import policies_to_json
from danube.machines.node.effects import DeadLetterPublish, ForwardDeadLetter
from danube.machines.node.settings import PoisonPolicy, SubscriptionFailureSettings
from danube.machines.wal import records
from danube.metadata.model import Put
from danube.values.config import DispatchStrategy, Policies
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic
from sim.checker import Violation
from sim.clients import Caller, SimConsumer
from sim.cluster_clients import RETRY_US, _Route, route_for
from sim.cluster_node import SimNode
from sim.network import Network
from sim.requests import ProducerRequest
from sim.world import US_PER_S, World

if TYPE_CHECKING:
    from sim.cluster_data_checker import DataChecker

POISON = "p every acknowledged publish acknowledged, dead-lettered or dropped (issue 24)"
POISON_SUB = "poison-sub"
POISON_SHARE = 8
"""One message in this many is poison (by its payload's CRC: every consumer agrees)."""
POISON_LIMIT = 2
"""`max_redelivery_count` of the poison subscriptions: 3 deliveries, then the dead letter."""
DEAD_LETTER_NAMESPACE = "dlq"
FORWARD_TIMEOUT_US = 2 * US_PER_S
"""A forward's request unanswered this long fails (production's 10 s, scaled to the run)."""
ACK_DELAY_US = 20_000


def dispatch_rate_floor(rate: float) -> int:
    """The lowest `max_subscription_dispatch_rate` the operator sets in a poison run: twice
    the deliveries a poison subscription needs to keep up with its producer (`rate` messages
    a second, one in `POISON_SHARE` delivered `POISON_LIMIT` more times), so the backlog a
    topic's faults leave drains well within the run's settle limit. The judge (`p`) asks
    every acknowledged publish to be settled in that limit: at the operator's former 1 a
    second, a topic with 130 messages could not (seed 3014, sim/README.md)."""
    per_message = (POISON_SHARE + POISON_LIMIT) / POISON_SHARE
    return math.ceil(2 * rate * per_message)


def is_poison(payload: bytes) -> bool:
    return zlib.crc32(payload) % POISON_SHARE == 0


def dead_letter_topic(topic: str, index: int) -> str:
    """`topic`'s dead-letter topic: beside it for even `index`, in namespace `dlq` for odd."""
    name = parse_topic(topic)
    namespace = name.namespace if index % 2 == 0 else DEAD_LETTER_NAMESPACE
    return f"/{namespace}/{name.local}-dlq"


def failure_policy(dead_letters: str) -> SubscriptionFailureSettings:
    return SubscriptionFailureSettings(
        max_redelivery_count=POISON_LIMIT,
        poison_policy=PoisonPolicy.DEAD_LETTER,
        dead_letter_topic=dead_letters,
        ack_timeout_ms=2_000,
        base_redelivery_delay_ms=50,
        max_redelivery_delay_ms=80,
    )


def setup_ops(poisoned: dict[str, str]) -> list[Put]:
    """What the operator stored before the run: the `dlq` namespace and each poison
    subscription's failure policy (kept for a subscription that does not exist yet, read
    when its topic loads on whichever broker)."""
    ops = [Put(keys.namespace_policy(DEAD_LETTER_NAMESPACE), policies_to_json(Policies()))]
    for topic, dead_letters in poisoned.items():
        key = keys.failure_policy(parse_topic(topic), POISON_SUB)
        ops.append(Put(key, failure_policy(dead_letters).to_json()))
    return ops


class PoisonLedger:
    """Invariant `p` (module docstring), fed by the consumers, the brokers' observers and the
    dead-letter forwarders."""

    def __init__(
        self, world: World, nodes: Sequence[SimNode], poisoned: dict[str, str], data: DataChecker
    ) -> None:
        self.world = world
        self.nodes = nodes
        self.poisoned = poisoned
        """poison topic → its dead-letter topic."""
        self.data = data
        self.violations: list[Violation] = []
        self.payload_at: dict[str, dict[int, bytes]] = {t: {} for t in poisoned}
        self.consumed: dict[str, set[bytes]] = {t: set() for t in poisoned}
        self.dead_lettered: dict[str, set[bytes]] = {t: set() for t in poisoned}
        self.dropped: dict[str, set[bytes]] = {t: set() for t in poisoned}
        self.subscribed: set[str] = set()
        """Poison topics whose subscription a consumer's subscribe created or found."""
        self.counts = {"poison_forwarded": 0, "poison_stored_here": 0, "poison_forward_failed": 0}

    def _violate(self, detail: str) -> None:
        self.world.log(f"VIOLATION {POISON}: {detail}")
        self.violations.append(Violation(POISON, detail, self.world.now))

    # -- from the consumers (sim.clients.Checker) --------------------------------------------------

    def received(self, topic: str, sub: str, consumer: str, offset: int, payload: bytes) -> None:
        self.payload_at[topic][offset] = payload

    def client_acked(self, topic: str, sub: str, offset: int) -> None:
        self.consumed[topic].add(self.payload_at[topic][offset])

    def produced(self, topic: str, payload: bytes, key: str | None) -> None:
        """Publishes are known from the producers' acknowledgements (`DataChecker.acked`)."""

    # -- from the brokers' observers --------------------------------------------------------------

    def reported_stored(
        self, broker: str, topic: str, sub: str, offset: int, at: int, held: bool | None
    ) -> None:
        """The broker's interpreter reports the dead letter of `offset` stored (`at` its
        offset in the dead-letter topic, -1 when forwarded): the subscription must still
        hold the original; from now on the message is settled for it."""
        if topic not in self.poisoned or sub != POISON_SUB:
            return
        payload = self.payload_at[topic].get(offset)
        # A second copy, stored after the first let the original go, is no violation: a
        # forward reported failed (its answer lost) had landed, and so did the one asked
        # again (seed 38 of the `disk` swarm, replicated). At least once, as any publish;
        # nothing passed the original before a copy was stored.
        again = payload is not None and payload in self.dead_lettered[topic]
        if held is False and not again:
            self._violate(
                f"{topic}/{sub}: offset {offset} reported dead-lettered on broker {broker} "
                f"after the subscription passed the original"
            )
        if payload is None:
            self._violate(f"{topic}/{sub}: offset {offset} dead-lettered, never delivered")
            return
        self.dead_lettered[topic].add(payload)
        if at >= 0:  # stored by this broker: an acknowledged publish of the dead-letter topic
            self.counts["poison_stored_here"] += 1
            self.data.acknowledged(self.poisoned[topic], payload.decode(), broker)

    def policy_dropped(self, topic: str, sub: str, offset: int) -> None:
        payload = self.payload_at.get(topic, {}).get(offset)
        if payload is not None and sub == POISON_SUB:
            self.dropped[topic].add(payload)

    # -- from the forwarders ----------------------------------------------------------------------

    def forwarded(self, publish: DeadLetterPublish, record: records.Record, owner: str) -> None:
        """The owner acknowledged a forwarded copy: it holds the original and points back to
        it, and is an acknowledged publish of the dead-letter topic (invariant h keeps it)."""
        self.counts["poison_forwarded"] += 1
        origin, offset = publish.origin, publish.offset
        expected = self.payload_at.get(origin, {}).get(offset)
        names = ("x-original-topic", "x-original-subscription", "x-original-topic-offset")
        pointer = tuple(record.attributes.get(n) for n in names)
        if expected is not None and record.payload != expected:
            self._violate(f"{origin}: the dead letter of offset {offset} holds {record.payload!r}")
        if pointer != (origin, publish.subscription, str(offset)):
            self._violate(f"{origin}: the dead letter of offset {offset} points back to {pointer}")
        if publish.topic in self.data.acked:
            self.data.acknowledged(publish.topic, record.payload.decode(), owner)

    # -- at the end -------------------------------------------------------------------------------

    def judged(self, topics: Sequence[str]) -> list[str]:
        """The poison topics judged at the end, of the live `topics`: those whose dead-letter
        topic is live too (one whose every replica died for good stays unassigned, as the
        issue allows: its poison waits in the window, held, never passed) and whose
        subscription was ever created (a create refused, e.g. RESOURCE_EXHAUSTED under the
        memory budget, owes nothing)."""
        return [
            topic
            for topic, dead_letters in self.poisoned.items()
            if topic in topics and dead_letters in topics and topic in self.subscribed
        ]

    def unsettled(self, topics: Sequence[str]) -> list[str]:
        problems = []
        for topic in self.judged(topics):
            left = self._left(topic)
            if left:
                problems.append(f"{topic}/{POISON_SUB}: {len(left)} message(s) unsettled")
        return problems

    def _left(self, topic: str) -> list[str]:
        settled = self.consumed[topic] | self.dead_lettered[topic] | self.dropped[topic]
        return [p for p in self.data.acked[topic] if p.encode() not in settled]

    def final(self, topics: Sequence[str]) -> None:
        for topic in self.judged(topics):
            left = self._left(topic)
            if left:
                self._violate(
                    f"{topic}/{POISON_SUB}: {len(left)} acknowledged message(s) not acknowledged "
                    f"by the consumer, dead-lettered nor dropped by policy, e.g. {left[:3]}"
                )


class ClusterConsumer(SimConsumer):
    """The poison subscription's consumer: a lookup (`route_for`, at a random running broker)
    before each subscribe, again after any error, timeout or broken stream (a topic moved);
    it nacks every poison message, every time."""

    def __init__(
        self, world: World, network: Network, nodes: Sequence[SimNode], ledger: PoisonLedger,
        *, name: str, topic: str,
    ) -> None:  # fmt: skip
        super().__init__(
            world, network, _Route(nodes[0]), ledger,  # type: ignore[arg-type]
            name=name, topic=topic, subscription=POISON_SUB,
            sub_type=int(SubscriptionType.SHARED), ack_delay_us=ACK_DELAY_US, nack=0.0,
            start=StartPosition(StartKind.EARLIEST),
        )  # fmt: skip
        self.nodes = nodes
        self.ledger = ledger
        self.lookups = 0
        self.started = False

    def start(self) -> None:
        self._lookup()

    def _lookup(self) -> None:
        self.lookups += 1
        running = [node for node in self.nodes if node.running is not None]
        target = None
        if running:
            target = route_for(self.nodes, self.world.rng.choice(running), self.topic)
        if target is None:
            self.world.at(RETRY_US, self._lookup)
            return
        self.broker = self._caller.broker = _Route(target)  # type: ignore[assignment]
        self.world.at(2 * self.network.latency(), self._subscribe)

    def _retry_subscribe(self) -> None:
        self.world.at(RETRY_US, self._lookup)

    def _subscribed(self, answer: Any) -> None:
        if not isinstance(answer, DanubeError):
            self.ledger.subscribed.add(self.topic)
        super()._subscribed(answer)

    reopen_us = RETRY_US  # the cluster clients' pace

    def _after_refusal(self, answer: DanubeError) -> Callable[[], None]:
        return self._lookup  # the topic may have moved: look it up again

    def _reconnect(self) -> None:
        self._lookup()

    def _fails(self, record: records.Record) -> bool:
        return is_poison(record.payload)


class _Forward:
    """One dead-letter topic's internal producer at one broker incarnation."""

    __slots__ = ("creating", "owner", "producer_id", "waiting")

    def __init__(self) -> None:
        self.owner: SimNode | None = None
        self.producer_id: int | None = None
        self.creating = False
        self.waiting: list[tuple[ForwardDeadLetter, Done]] = []


class DeadLetterForwarder:
    """`runtime/dead_letter_forward.DeadLetterForward` in the simulator, for one broker
    incarnation: a lookup at the broker itself, a producer on the owner, the copy sent;
    `done` is answered once, with None only when the owner acknowledged the copy."""

    def __init__(
        self, node: SimNode, incarnation: int, nodes: Sequence[SimNode], ledger: PoisonLedger,
        alive: Callable[[], bool],
    ) -> None:  # fmt: skip
        self.node = node
        self.world = node.world
        self.network = node.network
        self.nodes = nodes
        self.ledger = ledger
        self.alive = alive
        self.name = f"broker-dead-letter-{node.name}-{incarnation}"
        self._producers: dict[str, _Forward] = {}
        self._created = 0

    def perform(self, effect: ForwardDeadLetter, done: Done) -> None:
        topic = effect.publish.topic
        state = self._producers.setdefault(topic, _Forward())
        if state.producer_id is not None:
            self._send(state, effect, done)
            return
        state.waiting.append((effect, done))
        if not state.creating:
            state.creating = True
            self._create(topic, state)

    def _caller(self, owner: SimNode) -> Caller:
        """A connection from this broker (its partitions cut it) to `owner`."""
        return Caller(self.world, self.network, _Route(owner), self.node.name, FORWARD_TIMEOUT_US)

    def _create(self, topic: str, state: _Forward) -> None:
        owner = route_for(self.nodes, self.node, topic) if self.node.running else None
        if owner is None:
            self._fail_waiting(topic, state, "no broker serves the dead-letter topic yet")
            return
        self._created += 1
        caller = self._caller(owner)
        request = ProducerRequest(
            caller.next_request_id(), f"{self.name}-{self._created}", topic,
            int(DispatchStrategy.RELIABLE),
        )  # fmt: skip

        def created(answer: Any) -> None:
            if not self.alive() or self._producers.get(topic) is not state:
                return
            if isinstance(answer, DanubeError):
                self._fail_waiting(topic, state, answer.message)
                return
            state.creating = False
            state.owner, state.producer_id = owner, answer.producer_id
            waiting, state.waiting = state.waiting, []
            for effect, done in waiting:
                self._send(state, effect, done)

        timeout = DanubeError(ErrorCode.UNAVAILABLE, "no answer within the timeout")
        caller.call(request, created, lambda: created(timeout))

    def _fail_waiting(self, topic: str, state: _Forward, why: str) -> None:
        if self._producers.get(topic) is state:
            del self._producers[topic]
        error = DanubeError(ErrorCode.UNAVAILABLE, f"forwarding a dead letter to {topic}: {why}")
        waiting, state.waiting = state.waiting, []
        for _, done in waiting:
            self.ledger.counts["poison_forward_failed"] += 1
            done(None, error)

    def _send(self, state: _Forward, effect: ForwardDeadLetter, done: Done) -> None:
        owner, producer_id = state.owner, state.producer_id
        assert owner is not None and producer_id is not None
        topic, record = effect.publish.topic, effect.record
        caller = self._caller(owner)
        message = records.Record(
            request_id=caller.next_request_id(), producer_id=producer_id, topic_name=topic,
            payload=record.payload, publish_time=self.world.now_ms,
            producer_name=self.name, attributes=dict(record.attributes),
        )  # fmt: skip

        def answered(answer: Any) -> None:
            if not self.alive():
                return
            if isinstance(answer, DanubeError):
                if self._producers.get(topic) is state:
                    del self._producers[topic]  # the next dead letter creates it again
                self.ledger.counts["poison_forward_failed"] += 1
                done(None, answer)
                return
            self.ledger.forwarded(effect.publish, record, owner.name)
            done(None, None)

        timeout = DanubeError(ErrorCode.UNAVAILABLE, "no answer within the timeout")
        caller.call(message, answered, lambda: answered(timeout))
