"""The republish flow of the DeadLetter poison policy (issue 24; rules in
spec/failure-policies.md): a reliable subscription's dispatch machine says a message is
exhausted (`DeadLetter`); this builds the dead letter (the original payload and attributes,
plus Danube's `x-original-*` attributes), appends it to the policy's dead-letter topic on
this broker through the reliable publish path (`Producers.append_record`: the WAL, its
durability level, replication and the object tier as for any producer's message), and asks
the driver to wait for it to be stored (`DeadLetterPublish`). Only the driver's report that
it is stored (`done`) tells the machine `dead_lettered`; a refusal or a loss tells it
`dead_letter_failed`, which asks again after the policy's backoff: a dead letter is never
dropped, and the original is never passed before its copy is stored.

Like Danube, a missing dead-letter topic is created (reliable) when the broker creates
topics for producers (`auto_create_topics`); a non-reliable one is refused, as Danube's
strategy mismatch. In cluster mode a dead-letter topic this broker does not serve is reached
as an internal producer through the cluster's redirect (`ForwardDeadLetter`, carried out by
the port: lookup, then the owner's reliable publish path); the owner's acknowledgement is the
"stored" that lets the original go, so the promise is the same as for a local one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from danube.machines.dispatch import reliable as rd
from danube.machines.node.effects import DeadLetterPublish, Effect, ForwardDeadLetter, Step
from danube.machines.wal import records
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError
from danube.values.names import parse_topic

if TYPE_CHECKING:
    from danube.machines.memory.state import StatePool
    from danube.machines.node.catalogue import Catalogue
    from danube.machines.node.producers import Producers
    from danube.machines.node.records import SubscriptionRecord, TopicRecord
    from danube.machines.node.reliable_log import ReliableLogs

PRODUCER_NAME = "broker-dead-letter"
"""The dead letters' `producer_name` (Danube's internal producer is
`broker-replicator-<broker_id>-<seq>`; no producer session exists for ours)."""
POISON_POLICY = "dead_letter"


def dead_letter_record(
    original: records.Record,
    *,
    origin: str,
    subscription: str,
    offset: int,
    attempts: int,
    reason: str,
    topic: str,
    broker_addr: str,
    now_ms: int,
) -> records.Record:
    """The dead letter of `original`: its payload and attributes, with Danube's
    `x-original-*` attributes over them (and `x-original-publish-time`, ours: Danube keeps
    no trace of it). As Danube, the routing key is not carried; nor is the schema, which is
    the original topic's."""
    attributes = dict(original.attributes)
    attributes.update(
        {
            "x-original-topic": origin,
            "x-original-subscription": subscription,
            "x-original-topic-offset": str(offset),
            "x-original-producer-id": str(original.producer_id),
            "x-original-broker-addr": original.broker_addr,
            "x-original-publish-time": str(original.publish_time),
            "x-poison-policy": POISON_POLICY,
            "x-delivery-attempt": str(attempts),
            "x-failure-reason": reason or "unknown",
        }
    )
    return records.Record(
        topic_name=topic,
        broker_addr=broker_addr,
        payload=original.payload,
        publish_time=now_ms,
        producer_name=PRODUCER_NAME,
        attributes=attributes,
    )


class DeadLetters:
    def __init__(
        self,
        catalogue: Catalogue,
        logs: ReliableLogs,
        producers: Producers,
        *,
        auto_create_topics: bool,
        clustered: bool,
    ) -> None:
        self._catalogue = catalogue
        self._logs = logs
        self._producers = producers
        self._auto_create = auto_create_topics
        self._clustered = clustered
        self.stored = 0
        """Dead letters stored and reported to their subscription (the metric)."""
        self.failed = 0
        """Republishes refused or lost, each asked again after the backoff."""
        self.forwarded = 0
        """Republishes sent to another broker (cluster mode), stored or not."""
        self.state: tuple[StatePool | None, Callable[[], tuple[int, int, int]]] = (
            None,
            lambda: (0, 0, 0),
        )
        """The state pool and the core's counts (`BrokerCore.state_counts`): a dead-letter
        topic created here is weighed and charged like any other topic's creation."""

    def republish(
        self, record: TopicRecord, sub: SubscriptionRecord, ask: rd.DeadLetter, now_ms: int
    ) -> list[Effect]:
        """`ReliableLogs.dispatch`'s answer to a `DeadLetter`: the append's effects after the
        `DeadLetterPublish` that waits for them (or carries the refusal)."""
        origin = record.name.full

        def wait(through: int, failure: str | None = None) -> DeadLetterPublish:
            return DeadLetterPublish(
                ask.topic, through, origin, sub.name, sub.epoch, ask.offset, ask.attempts, failure
            )

        effects: list[Effect] = []
        try:
            stored = sub.records.get(ask.offset)
            if stored is None:  # kept until resolved; a rebuilt subscription asks anew
                raise ValueError(f"no record of {origin} offset {ask.offset} is held")
            target = self._target(ask.topic, origin, effects)
            dead = dead_letter_record(
                records.decode(stored),
                origin=origin,
                subscription=sub.name,
                offset=ask.offset,
                attempts=ask.attempts,
                reason=ask.reason,
                topic=ask.topic,
                broker_addr=self._catalogue.identity.broker_url,
                now_ms=now_ms,
            )
            if target is None:  # cluster mode, served elsewhere: the owner stores it
                self.forwarded += 1
                return [ForwardDeadLetter(wait(-1), dead)]
            step = self._producers.append_record(target, dead, now_ms)
        except (DanubeError, ValueError) as error:
            return [*effects, wait(-1, str(error))]
        return [*effects, wait(step.value), *step.effects]

    def _target(self, topic: str, origin: str, effects: list[Effect]) -> TopicRecord | None:
        """The dead-letter topic, created as Danube does when missing (its WAL then loads:
        this attempt fails, the retry after the backoff finds it). None in cluster mode
        when this broker does not serve it: the owner (or the broker the cluster places a
        new topic on) creates it, as for any producer."""
        if topic == origin:
            raise ValueError("a topic cannot be its own dead-letter topic")
        name = parse_topic(topic)
        record = self._catalogue.topics_by_name.get(topic)
        if record is None:
            if self._clustered:
                return None
            if not self._auto_create:
                raise ValueError(f"{topic} does not exist and auto_create_topics is off")
            pool, counts = self.state
            if pool is not None:  # weighed and charged as a topic a producer creates
                pool.update(*counts())
                refused = pool.refusal(what=f"topic {topic}", topics=1)
                if refused is not None:
                    raise ValueError(refused)
            effects.extend(self._catalogue.add_topic(name, DispatchStrategy.RELIABLE))
            if pool is not None:  # charged now: a tick's check must not find it uncharged
                pool.update(*counts())
            record = self._catalogue.topics_by_name[topic]
        if not record.reliable:
            raise ValueError(f"{topic} is non-reliable; a dead-letter topic must be reliable")
        return record

    def done(self, publish: DeadLetterPublish, failure: str | None, now_ms: int) -> Step[None]:
        """The driver's report on a `DeadLetterPublish`: stored (failure None) or not. The
        subscription's machine hears it only if it is the incarnation that asked."""
        record = self._catalogue.topics_by_name.get(publish.origin)
        sub = record.subscriptions.get(publish.subscription) if record is not None else None
        if record is None or sub is None or sub.epoch != publish.epoch or not record.reliable:
            return Step(None)
        machine = sub.reliable
        if failure is None:
            self.stored += 1
            found = machine.dead_lettered(publish.offset, now_ms)
            if not machine.is_pending(publish.offset):
                sub.records.pop(publish.offset, None)
        else:
            self.failed += 1
            found = machine.dead_letter_failed(publish.offset, now_ms)
        return Step(None, tuple(self._logs.dispatch(record, sub, found, now_ms)))
