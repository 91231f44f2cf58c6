"""Rebuilding the broker's state from a metadata scan: at start (`restore`) and, in cluster
mode, when this broker claims a topic (`adopt`). Every key is parsed once into what it names
(`_parse`); the state is then rebuilt in dependency order (namespaces, topics, their settings,
producers and subscriptions, consumers, the object index), each step in key order, so the
result does not depend on the order the store returned the keys in."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from danube.core.config import DispatchStrategy
from danube.core.errors import DanubeError
from danube.core.names import TopicName
from danube.dispatch import SubscriptionType
from danube.node import paths
from danube.node import settings as settings_rules
from danube.node.catalogue import Catalogue, policies_from_json
from danube.node.consumers import Consumers
from danube.node.effects import Effect, LoadWal, Step
from danube.node.producers import Producers
from danube.node.records import ProducerRecord, TopicRecord, new_topic
from danube.node.settings import SubscriptionFailureSettings, SubscriptionSettings
from danube.tiering import layout as tier_layout
from danube.tiering.index import IndexEntry, IndexFormatError


class KeyKind(enum.Enum):
    NAMESPACE_POLICY = "namespace_policy"  # /namespaces/<ns>/policy
    TOPIC_DELIVERY = "topic_delivery"  # /topics/<ns>/<t>/delivery
    TOPIC_POLICY = "topic_policy"  # /topics/<ns>/<t>/policy
    SUBSCRIPTION_SETTING = "subscription_setting"  # /topics/<ns>/<t>/subscriptions/<s>/<leaf>
    PRODUCER = "producer"  # /topics/<ns>/<t>/producers/<id>
    SUBSCRIPTION = "subscription"  # /topics/<ns>/<t>/subscriptions/<s>
    CONSUMER = "consumer"  # /topics/<ns>/<t>/subscriptions/<s>/consumers/<id>
    INDEX_ENTRY = "index_entry"  # /storage/topics/<ns>/<t>/segments/<start>


@dataclass(frozen=True, slots=True)
class ParsedKey:
    kind: KeyKind
    namespace: str
    topic: str = ""
    """The topic's local name (`<t>`); empty for a namespace key."""
    subscription: str = ""
    leaf: str = ""
    """A subscription setting's kind (`failure_policy`, `dispatch_config`, `cursor`)."""

    @property
    def topic_name(self) -> str:
        return f"/{self.namespace}/{self.topic}"


def _parse(key: str) -> ParsedKey | None:
    """What a metadata key names, for a restore; None for keys a restore does not read."""
    parts = key.strip("/").split("/")
    if parts[0] == "namespaces":
        if len(parts) == 3 and parts[2] == "policy":
            return ParsedKey(KeyKind.NAMESPACE_POLICY, parts[1])
        return None
    if parts[0] == "topics" and len(parts) >= 4:
        ns, topic = parts[1], parts[2]
        if len(parts) == 4:
            if parts[3] == "delivery":
                return ParsedKey(KeyKind.TOPIC_DELIVERY, ns, topic)
            if parts[3] == "policy":
                return ParsedKey(KeyKind.TOPIC_POLICY, ns, topic)
        elif len(parts) == 5 and parts[3] == "producers":
            return ParsedKey(KeyKind.PRODUCER, ns, topic)
        elif len(parts) == 5 and parts[3] == "subscriptions":
            return ParsedKey(KeyKind.SUBSCRIPTION, ns, topic, parts[4])
        elif len(parts) == 6 and parts[3] == "subscriptions":
            return ParsedKey(KeyKind.SUBSCRIPTION_SETTING, ns, topic, parts[4], parts[5])
        elif len(parts) == 7 and parts[5] == "consumers":
            return ParsedKey(KeyKind.CONSUMER, ns, topic, parts[4])
        return None
    if (
        parts[:2] == ["storage", "topics"]
        and len(parts) == 6
        and parts[4] == "segments"
        and tier_layout.index_start(parts[5]) is not None
    ):
        return ParsedKey(KeyKind.INDEX_ENTRY, parts[2], parts[3])
    return None


class Restorer:
    def __init__(self, catalogue: Catalogue, producers: Producers, consumers: Consumers) -> None:
        self._catalogue = catalogue
        self._producers = producers
        self._consumers = consumers

    def restore(self, entries: Mapping[str, Any]) -> Step[None]:
        """See `BrokerCore.restore`."""
        topics = self._catalogue.topics_by_name
        namespaces = self._catalogue.namespaces_by_name
        present = set(topics)
        parsed = [(_parse(key), key, value) for key, value in entries.items()]
        found = [(p, key, value) for p, key, value in parsed if p is not None]
        in_order = sorted(found, key=lambda item: item[1])

        def by_kind(*kinds: KeyKind) -> list[tuple[ParsedKey, Any]]:
            return [(p, value) for p, _, value in in_order if p.kind in kinds]

        def new_record(p: ParsedKey) -> TopicRecord | None:
            """A topic this restore brings (not one already served here)."""
            record = topics.get(p.topic_name)
            if record is None or record.name.full in present:
                return None
            return record

        for p, value in by_kind(KeyKind.NAMESPACE_POLICY):
            namespaces[p.namespace] = policies_from_json(value)
        for p, value in by_kind(KeyKind.TOPIC_DELIVERY):
            name = TopicName(p.namespace, p.topic)
            if name.namespace in namespaces and name.full not in present:
                topics[name.full] = new_topic(name, DispatchStrategy.from_label(value))
        for p, value in by_kind(KeyKind.TOPIC_POLICY, KeyKind.SUBSCRIPTION_SETTING):
            record = new_record(p)
            if record is None:
                continue
            if p.kind is KeyKind.TOPIC_POLICY:
                record.policies = settings_rules.stored_policies(value)
            else:
                _restore_setting(record, p.subscription, p.leaf, value)
        for p, value in by_kind(KeyKind.PRODUCER, KeyKind.SUBSCRIPTION):
            record = new_record(p)
            if record is None:
                continue
            if p.kind is KeyKind.PRODUCER:
                producer = ProducerRecord(
                    value["producer_id"], value["producer_name"], record.name, value["access_mode"]
                )
                self._producers.restored(record, producer)
            else:
                cursor = entries.get(paths.cursor(record.name, p.subscription), -1)
                self._consumers.add_subscription(
                    record,
                    value["subscription_name"],
                    SubscriptionType(value["subscription_type"]),
                    cursor + 1,
                )
        self._restore_consumers(found, present)
        for p, value in by_kind(KeyKind.INDEX_ENTRY):
            record = new_record(p)
            if record is None:
                continue
            try:
                record.log.index.append(IndexEntry.from_json(value))
            except IndexFormatError:
                continue  # the uploader's recovery reports what is missing
        loads = tuple(
            LoadWal(t, fresh=False) for t, r in topics.items() if r.reliable and t not in present
        )
        return Step(None, loads)

    def _restore_consumers(
        self, found: list[tuple[ParsedKey, str, Any]], present: set[str]
    ) -> None:
        """Consumers come back disconnected, in subscribe order: it decides Failover
        promotion, so it must survive a restart (ties keep the order the scan gave)."""
        topics = self._catalogue.topics_by_name
        consumers = []
        for p, _, value in found:
            if p.kind is not KeyKind.CONSUMER:
                continue
            record = topics.get(p.topic_name)
            if (
                record is not None
                and record.name.full not in present
                and p.subscription in record.subscriptions
            ):
                consumers.append((value.get("order", 0), record, p.subscription, value))
        for order, record, sub_name, value in sorted(consumers, key=lambda c: c[0]):
            self._consumers.add_consumer(
                record,
                record.subscriptions[sub_name],
                value["consumer_id"],
                value["consumer_name"],
                tuple(value.get("key_filters", ())),
                order,
            )
            self._consumers.subscribe_order = max(self._consumers.subscribe_order, order)

    def adopt(self, entries: Mapping[str, Any], *, keep_local: bool, epoch: int) -> Step[None]:
        """See `BrokerCore.adopt`."""
        step = self.restore(entries)
        loads: list[Effect] = []
        for effect in step.effects:
            if isinstance(effect, LoadWal):
                self._catalogue.topics_by_name[effect.topic].log.epoch = epoch
                effect = LoadWal(effect.topic, fresh=not keep_local)
            loads.append(effect)
        return Step(None, tuple(loads))


def _restore_setting(record: TopicRecord, sub: str, kind: str, value: Any) -> None:
    """A stored setting that no longer validates (written by another version) is left out:
    the subscription runs with the broker's defaults rather than not at all."""
    settings = record.settings.setdefault(sub, SubscriptionSettings())
    try:
        if kind == "failure_policy" and isinstance(value, Mapping):
            settings.failure = SubscriptionFailureSettings.from_json(value)
        elif kind == "dispatch_config" and isinstance(value, Mapping):
            settings.max_unacked_messages = settings_rules.check_window(
                int(value["max_unacked_messages"])
            )
    except (DanubeError, KeyError, ValueError, TypeError):
        pass
    if settings.empty:
        del record.settings[sub]
