"""Rebuilding the broker's state from a metadata scan: at start (`restore`) and, in cluster
mode, when this broker claims a topic (`adopt`). Every key is parsed once into what it names,
by the parsers of `danube.keys` beside the builders that wrote it (`_parse`); the state is
then rebuilt in dependency order (namespaces, topics, their settings, producers and
subscriptions, consumers, the object index), each step in key order, so the result does not
depend on the order the store returned the keys in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from danube import keys
from danube.machines.dispatch import SubscriptionType
from danube.machines.node import settings as settings_rules
from danube.machines.node.catalogue import Catalogue, policies_from_json
from danube.machines.node.consumers import Consumers
from danube.machines.node.effects import Effect, LoadWal, Step
from danube.machines.node.producers import Producers
from danube.machines.node.records import ProducerRecord, TopicRecord, new_topic
from danube.machines.node.settings import SubscriptionFailureSettings, SubscriptionSettings
from danube.machines.tiering.index import IndexEntry, IndexFormatError
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError
from danube.values.names import TopicName


class NamespacePolicyKey(NamedTuple):
    """`/namespaces/<ns>/policy` (`keys.parse_namespace_policy` returns the bare name)."""

    namespace: str


RestoredKey = (
    NamespacePolicyKey
    | keys.TopicKey
    | keys.ProducerKey
    | keys.SubscriptionKey
    | keys.SubscriptionSettingKey
    | keys.ConsumerKey
    | keys.IndexKey
)
"""Every kind of key a restore reads."""


def _parse(key: str) -> RestoredKey | None:
    """What a metadata key names, through the parsers of `danube.keys` (the module that
    builds these keys); None for keys a restore does not read (the `cur` pointer, cluster
    and schema keys, a later version's records)."""
    namespace = keys.parse_namespace_policy(key)
    if namespace is not None:
        return NamespacePolicyKey(namespace)
    if key.startswith(keys.TOPICS_PREFIX):
        return keys.parse_topic_key(key)
    index = keys.parse_index_key(key)
    return index if isinstance(index, keys.IndexKey) else None


def _parsed(entries: Mapping[str, Any]) -> list[tuple[RestoredKey, str, Any]]:
    """(what it names, key, value) of every key a restore reads."""
    found = []
    for key, value in entries.items():
        p = _parse(key)
        if p is not None:
            found.append((p, key, value))
    return found


@dataclass(slots=True)
class _Kinds:
    """A restore's keys, (what it names, key, value), split by kind: the restore's steps each
    read one or two kinds, and splitting once costs one pass over the keys where filtering
    the whole sorted scan for each step cost five (issue 23: restarts with 100,000 topics).
    Every list but `consumers` is in key order (`_by_kind`)."""

    namespaces: list[tuple[NamespacePolicyKey, str, Any]] = field(default_factory=list)
    deliveries: list[tuple[keys.TopicKey, str, Any]] = field(default_factory=list)
    """The topics' `delivery` keys: they make the topics."""
    settings: list[tuple[keys.TopicKey | keys.SubscriptionSettingKey, str, Any]] = field(
        default_factory=list
    )
    """Every topic key and subscription setting, interleaved in key order."""
    members: list[tuple[keys.ProducerKey | keys.SubscriptionKey, str, Any]] = field(
        default_factory=list
    )
    """Producers and subscriptions, interleaved in key order."""
    consumers: list[tuple[keys.ConsumerKey, str, Any]] = field(default_factory=list)
    """In the scan's order: consumers are restored in their subscribe order, ties in this."""
    index: list[tuple[keys.IndexKey, str, Any]] = field(default_factory=list)


def _by_kind(found: list[tuple[RestoredKey, str, Any]]) -> _Kinds:
    """`found` split by kind in one pass, then each list but the consumers sorted by key."""
    kinds = _Kinds()
    for item in found:
        p = item[0]
        if isinstance(p, keys.TopicKey):
            if p.kind == "delivery":
                kinds.deliveries.append(item)  # type: ignore[arg-type]
            kinds.settings.append(item)  # type: ignore[arg-type]
        elif isinstance(p, keys.SubscriptionSettingKey):
            kinds.settings.append(item)  # type: ignore[arg-type]
        elif isinstance(p, keys.ProducerKey | keys.SubscriptionKey):
            kinds.members.append(item)  # type: ignore[arg-type]
        elif isinstance(p, keys.ConsumerKey):
            kinds.consumers.append(item)  # type: ignore[arg-type]
        elif isinstance(p, keys.IndexKey):
            kinds.index.append(item)  # type: ignore[arg-type]
        elif isinstance(p, NamespacePolicyKey):
            kinds.namespaces.append(item)  # type: ignore[arg-type]
    for ordered in (kinds.namespaces, kinds.deliveries, kinds.settings, kinds.members, kinds.index):
        ordered.sort(key=_key_of)
    return kinds


def _key_of(item: tuple[RestoredKey, str, Any]) -> str:
    return item[1]


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
        kinds = _by_kind(_parsed(entries))

        def new_record(topic: TopicName) -> TopicRecord | None:
            """A topic this restore brings (not one already served here)."""
            record = topics.get(topic.full)
            if record is None or record.name.full in present:
                return None
            return record

        for p, _, value in kinds.namespaces:
            policies = policies_from_json(value)
            if namespaces.get(p.namespace) != policies:  # live subscriptions follow them
                self._catalogue.policy_generation += 1
            namespaces[p.namespace] = policies
        for p, _, value in kinds.deliveries:
            name = p.topic
            if name.namespace in namespaces and name.full not in present:
                topics[name.full] = new_topic(name, DispatchStrategy.from_label(value))
        for p, _, value in kinds.settings:
            record = new_record(p.topic)
            if record is None:
                continue
            if isinstance(p, keys.TopicKey):
                if p.kind == "policy":
                    record.policies = settings_rules.stored_policies(value)
            elif p.kind not in ("cursor", "attempts"):  # read with their subscription
                _restore_setting(record, p.subscription, p.kind, value)
        for p, _, value in kinds.members:
            record = new_record(p.topic)
            if record is None:
                continue
            if isinstance(p, keys.ProducerKey):
                producer = ProducerRecord(
                    value["producer_id"], value["producer_name"], record.name, value["access_mode"]
                )
                self._producers.restored(record, producer)
            else:
                cursor = entries.get(keys.cursor(record.name, p.subscription), -1)
                stored = entries.get(keys.attempts(record.name, p.subscription))
                self._consumers.add_subscription(
                    record,
                    value["subscription_name"],
                    SubscriptionType(value["subscription_type"]),
                    cursor + 1,
                    attempts=_attempts(stored),
                )
        self._restore_consumers(kinds.consumers, present)
        for p, _, value in kinds.index:
            record = new_record(p.topic)
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
        self, found: list[tuple[keys.ConsumerKey, str, Any]], present: set[str]
    ) -> None:
        """Consumers come back disconnected, in subscribe order: it decides Failover
        promotion, so it must survive a restart (ties keep the order the scan gave)."""
        topics = self._catalogue.topics_by_name
        consumers = []
        for p, _, value in found:
            record = topics.get(p.topic.full)
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
        for topic in {t for key in entries if (t := keys.topic_of_key(key)) is not None}:
            record = self._catalogue.topics_by_name.get(topic)
            if record is not None:  # the claim's revision fences its writes (every kind)
                record.log.epoch = epoch
        loads: list[Effect] = []
        for effect in step.effects:
            if isinstance(effect, LoadWal):
                effect = LoadWal(effect.topic, fresh=not keep_local)
            loads.append(effect)
        return Step(None, tuple(loads))


def _attempts(value: Any) -> dict[int, int]:
    """The stored failure counts (`keys.attempts`); a value this version cannot read counts
    as none (the messages get their deliveries afresh, as before counts were stored)."""
    try:
        return {int(offset): int(failures) for offset, failures in value or ()}
    except (TypeError, ValueError):
        return {}


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
