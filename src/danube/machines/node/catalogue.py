"""The broker's catalogue: namespaces with their policies, topics and partitions, and the
policies in force for a topic (its namespace's, with its own over them). It validates names
and existence before anything changes, and says which metadata changes make it durable."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from danube import keys
from danube.machines.dispatch.failure import DEFAULT_POLICY, FailurePolicy
from danube.machines.node import paths
from danube.machines.node import settings as settings_rules
from danube.machines.node.effects import BrokerIdentity, Effect, LoadWal, PersistMeta, Step
from danube.machines.node.records import TopicRecord, new_topic
from danube.machines.node.topic_table import TopicTable
from danube.values.config import DispatchStrategy, Policies
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.values.names import (
    TopicName,
    check_partition_conflict,
    parse_topic,
    partition_names,
    validate_namespace,
)

_OVERRIDDEN_KEPT = 1_024
_POLICY_SUFFIX = "/policy"


class Catalogue:
    def __init__(self, identity: BrokerIdentity, default_policies: Policies) -> None:
        self.identity = identity
        if default_policies.failure_policy:  # from the configuration: checked now
            try:
                given = json.loads(default_policies.failure_policy)
            except ValueError:
                raise invalid("policies.failure_policy is not JSON") from None
            text = settings_rules.namespace_failure_text(given)
            default_policies = dataclasses.replace(default_policies, failure_policy=text)
        self._default_policies = default_policies
        self.namespaces_by_name: dict[str, Policies] = {}
        self.failure_defaults_changed: dict[str, None] = {}
        self.policy_generation = 0
        """Counts changes of any namespace's or topic's policies: the next tick visits every
        topic once to apply them to live subscriptions (`ReliableLogs.tick`)."""
        """Namespaces whose default failure policy changed since the last tick."""
        self.topics_by_name: TopicTable = TopicTable()
        """Every topic this broker holds, in the order it came (iteration order is part of
        the behaviour: effects of a tick come topic by topic)."""
        self._overridden: dict[tuple[Policies, tuple[tuple[str, int], ...]], Policies] = {}
        """`policies` of topics with overrides, by what they are built from (a topic's
        reliable log asks at every tick; `dataclasses.replace` took 5 µs a call)."""
        self._overrides_unsaved: dict[str, int | None] = {}
        """Topics whose overrides' last write failed: when to write them again (None: a
        write again is under way). `metadata_written` and `overrides_to_write_again`."""

    # -- lookups ------------------------------------------------------------------------------

    def require_namespace(self, namespace: str) -> Policies:
        policies = self.namespaces_by_name.get(namespace)
        if policies is None:
            raise not_found(
                f"namespace {quoted(namespace)} does not exist; create it first "
                "(or list it in bootstrap_namespaces)"
            )
        return policies

    def topic(self, topic: str) -> TopicRecord:
        parse_topic(topic)
        record = self.topics_by_name.get(topic)
        if record is None:
            raise not_found(f"topic {topic} does not exist")
        return record

    def reliable_topic(self, topic: str, what: str) -> TopicRecord:
        record = self.topic(topic)
        if not record.reliable:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"{topic} is non-reliable: {what} applies to reliable topics only",
            )
        return record

    def policies(self, record: TopicRecord) -> Policies:
        """The limits in force: the namespace's as they are now (Danube snapshots them when
        the topic loads), with the topic's own over them."""
        namespace = self.namespaces_by_name[record.name.namespace]
        overrides = record.policies
        if not overrides:
            return namespace
        key = (namespace, tuple(overrides.items()))
        found = self._overridden.get(key)
        if found is None:
            if len(self._overridden) >= _OVERRIDDEN_KEPT:
                self._overridden.clear()
            found = self._overridden[key] = settings_rules.with_overrides(namespace, overrides)
        return found

    def topic_records(self) -> list[TopicRecord]:
        """Every topic record this broker holds, by name, for read-only views
        (`danube.machines.node.stats`); callers must not change them."""
        return [self.topics_by_name[name] for name in sorted(self.topics_by_name)]

    def served_topics(self) -> list[str]:
        return sorted(self.topics_by_name)

    def namespaces(self) -> list[str]:
        return sorted(self.namespaces_by_name)

    def topics(self, namespace: str) -> list[str]:
        self.require_namespace(namespace)
        return sorted(t for t, r in self.topics_by_name.items() if r.name.namespace == namespace)

    def topic_strategy(self, topic: str) -> DispatchStrategy:
        return self.topic(topic).strategy

    def partitions(self, base: str) -> list[str]:
        """Names of `<base>-part-<n>`, ordered by n (only exact partitions, unlike Danube's
        prefix match); from the table's index, not a look at every topic (issue 23)."""
        return self.topics_by_name.partitions(base)

    def topic_partitions(self, topic: str) -> list[str]:
        """TopicPartitions: the topic itself, its partitions, or nothing."""
        parse_topic(topic)
        if topic in self.topics_by_name:
            return [topic]
        return self.partitions(topic)

    def lookup(self, topic: str) -> BrokerIdentity:
        parse_topic(topic)
        if topic not in self.topics_by_name:
            raise not_found(f"topic {topic} does not exist")
        return self.identity

    def subscriptions(self, topic: str) -> list[str]:
        return sorted(self.topic(topic).subscriptions)

    # -- namespaces ---------------------------------------------------------------------------

    def bootstrap(self, namespaces: Iterable[str]) -> Step[None]:
        """Creates the configured namespaces that do not exist yet (`default` always)."""
        wanted = [validate_namespace(n) for n in dict.fromkeys(["default", *namespaces])]
        puts = []
        for namespace in wanted:
            if namespace not in self.namespaces_by_name:
                self.namespaces_by_name[namespace] = self._default_policies
                puts.append(
                    (paths.namespace_policy(namespace), policies_to_json(self._default_policies))
                )
        return Step(None, (PersistMeta(puts=tuple(puts)),) if puts else ())

    def create_namespace(self, name: str) -> Step[None]:
        validate_namespace(name)
        if name in self.namespaces_by_name:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"namespace {quoted(name)} already exists")
        self.namespaces_by_name[name] = self._default_policies
        put = (paths.namespace_policy(name), policies_to_json(self._default_policies))
        return Step(None, (PersistMeta(puts=(put,)),))

    def delete_namespace(self, name: str) -> Step[None]:
        self.require_namespace(name)
        topics = self.topics(name)
        if topics:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"namespace {quoted(name)} still has {len(topics)} topic(s); delete them first",
            )
        del self.namespaces_by_name[name]
        return Step(None, (PersistMeta(delete_prefixes=(paths.namespace_prefix(name),)),))

    def namespace_seen(self, name: str, policies: Mapping[str, Any] | None) -> None:
        """Cluster mode: another broker created (policies) or deleted (None) a namespace."""
        if policies is None:
            self.namespaces_by_name.pop(name, None)
        else:
            self._policies_changed(name, policies_from_json(policies))

    def _policies_changed(self, name: str, policies: Policies) -> None:
        """A namespace's default failure policy that changed is applied to its live
        subscriptions at the next tick (`SubscriptionSettingsAdmin.apply_namespace_defaults`),
        whichever broker the change came through."""
        before = self.namespaces_by_name.get(name)
        if before is not None and before.failure_policy != policies.failure_policy:
            self.failure_defaults_changed[name] = None
        self.namespaces_by_name[name] = policies
        self.policy_generation += 1

    def failure_policy(self, record: TopicRecord, subscription: str) -> FailurePolicy:
        """The failure policy a subscription runs with: its own, else its namespace's
        default, else the broker's. A namespace default that would dead-letter the topic to
        itself (the dead-letter topic's own subscriptions) gives way to the broker's."""
        settings = record.settings.get(subscription)
        if settings is not None and settings.failure is not None:
            return settings.failure.dispatch_policy
        default = settings_rules.namespace_failure(
            self.namespaces_by_name.get(record.name.namespace, Policies())
        )
        if default is None or default.dead_letter_topic == record.name.full:
            return DEFAULT_POLICY
        return default.dispatch_policy

    # -- topics -------------------------------------------------------------------------------

    def create_topic(self, topic: str, strategy: DispatchStrategy) -> Step[None]:
        name = parse_topic(topic)
        if topic in self.topics_by_name:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"topic {topic} already exists")
        return Step(None, self.add_topic(name, strategy))

    def create_partitioned_topic(
        self, base: str, partitions: int, strategy: DispatchStrategy
    ) -> Step[None]:
        names = partition_names(base, partitions)
        existing = [n.full for n in names if n.full in self.topics_by_name]
        if existing:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"topic {existing[0]} already exists")
        self.require_namespace(names[0].namespace)
        self._check_partition_conflicts(names[0])
        effects: list[Effect] = []
        for name in names:
            effects.extend(self.add_topic(name, strategy))
        return Step(None, tuple(effects))

    def add_topic(self, name: TopicName, strategy: DispatchStrategy) -> tuple[Effect, ...]:
        """Creates a topic (its namespace must exist and no partition may conflict); a
        reliable one starts loading a fresh WAL."""
        self.require_namespace(name.namespace)
        self._check_partition_conflicts(name)
        record = new_topic(name, strategy)
        self.topics_by_name[name.full] = record
        persist = PersistMeta(
            puts=(
                (paths.namespace_topic(name), None),
                (paths.topic_delivery(name), strategy.label),
            )
        )
        if record.reliable:
            return (persist, LoadWal(name.full, fresh=True))
        return (persist,)

    def _check_partition_conflicts(self, name: TopicName) -> None:
        partition = name.partition_of
        check_partition_conflict(
            name,
            base_exists=partition is not None and partition[0] in self.topics_by_name,
            partitioned=partition is None and bool(self.partitions(name.full)),
        )

    # -- policies (admin API; rules in danube.machines.node.settings) ------------------------------

    def namespace_policies(self, name: str) -> dict[str, int]:
        return policies_to_json(self.require_namespace(name))

    def set_namespace_policies(self, name: str, changes: Mapping[str, Any]) -> Step[dict]:
        """Changes the named fields; they apply at once to every topic of the namespace that
        does not set them itself. Limits already exceeded are not enforced backwards: a topic
        over a lowered limit keeps its producers and consumers and takes no new ones."""
        checked = settings_rules.policy_changes(changes, namespace=True)
        policies = dataclasses.replace(self.require_namespace(name), **checked)
        self._policies_changed(name, policies)
        value = policies_to_json(policies)
        return Step(value, (PersistMeta(puts=((paths.namespace_policy(name), value),)),))

    def topic_policies(self, topic: str) -> tuple[dict[str, int], list[str]]:
        """The policies in force for the topic, and the fields it sets itself."""
        record = self.topic(topic)
        return policies_to_json(self.policies(record)), sorted(record.policies)

    def set_topic_policies(self, topic: str, changes: Mapping[str, Any]) -> Step[dict]:
        record = self.topic(topic)
        record.policies = {**record.policies, **settings_rules.policy_changes(changes)}
        self.policy_generation += 1
        put = (paths.topic_policy(record.name), dict(record.policies))
        return Step(policies_to_json(self.policies(record)), (PersistMeta(puts=(put,)),))

    def topic_overrides(self, topic: str) -> dict[str, int]:
        """The fields the topic sets itself, with their values (what its policy key holds)."""
        return dict(self.topic(topic).policies)

    WRITE_AGAIN_MS = 1_000
    """How long after a failed write of a topic's overrides the broker writes them again
    (`persist_topic_policies_again`, from `overrides_to_write_again` at a tick)."""

    def metadata_written(self, touched: Iterable[str], failure: str | None, now_ms: int) -> None:
        """The outcome of one metadata change (`touched`: its keys), reported for every
        change in the order they were written. A failed write of a topic's overrides (its
        answer may also have been lost: the store may hold them, the previous ones, or get
        them late) leaves memory as it is, as a caller told UNAVAILABLE counts on neither
        outcome, and marks them to be written again `WRITE_AGAIN_MS` later. A stored write
        of them clears the mark: each write holds the whole overrides as memory held them
        when it was decided, and changes are written one at a time, in order, so the last
        outcome is the store's. A decision, so that the simulator runs it: it was each
        driver's loop around `persist_topic_policies_again`."""
        for key in touched:
            if not key.endswith(_POLICY_SUFFIX):
                continue
            topic = keys.topic_of_key(key)
            record = self.topics_by_name.get(topic) if topic is not None else None
            if record is None or key != paths.topic_policy(record.name):
                continue
            if failure is None:
                self._overrides_unsaved.pop(record.name.full, None)
            else:
                self._overrides_unsaved[record.name.full] = now_ms + self.WRITE_AGAIN_MS

    def overrides_to_write_again(self, now_ms: int) -> list[Effect]:
        """At a tick: the writes again of overrides whose last write failed at least
        `WRITE_AGAIN_MS` ago, one at a time per topic (the next waits for this one's
        outcome), while the topic is served here: once it leaves (or is on its way out)
        its next owner reads the store, and the write would be refused (`NotOwner`)."""
        if not self._overrides_unsaved:
            return []
        effects: list[Effect] = []
        for topic, due in list(self._overrides_unsaved.items()):
            record = self.topics_by_name.get(topic)
            if record is None or record.phase.moving:
                del self._overrides_unsaved[topic]
            elif due is not None and due <= now_ms:
                self._overrides_unsaved[topic] = None  # written again: wait for its outcome
                effects.extend(self.persist_topic_policies_again(topic).effects)
        return effects

    def overrides_unsaved(self) -> dict[str, int | None]:
        """Topics whose overrides are to be written again, with when (None: a write again
        is under way), for tests and views."""
        return dict(self._overrides_unsaved)

    def persist_topic_policies_again(self, topic: str) -> Step[dict | None]:
        """A write of the topic's overrides failed or its answer was lost (answered
        UNAVAILABLE): the store may hold them, the previous ones, or get them late. Memory
        stays as it is (a caller told UNAVAILABLE counts on neither outcome) and is written
        again, whole: whichever way the failed write went, never or late (it holds the same
        value), the store ends as memory, so the topic's next owner enforces what this one
        does. Taking the change back instead loses to a late landing of the failed write.
        Nothing to write once the topic left this broker (its next owner reads the store)."""
        record = self.topics_by_name.get(topic)
        if record is None:
            return Step(None, ())
        key = paths.topic_policy(record.name)
        policies = dict(record.policies)
        write = PersistMeta(puts=((key, policies),)) if policies else PersistMeta(deletes=(key,))
        return Step(policies_to_json(self.policies(record)), (write,))

    def clear_topic_policies(self, topic: str) -> Step[dict]:
        record = self.topic(topic)
        record.policies = {}
        self.policy_generation += 1
        delete = PersistMeta(deletes=(paths.topic_policy(record.name),))
        return Step(policies_to_json(self.policies(record)), (delete,))


def policies_to_json(policies: Policies) -> dict[str, Any]:
    return settings_rules.policies_json(policies)


def policies_from_json(value: Mapping[str, Any] | None) -> Policies:
    known = {k: v for k, v in (value or {}).items() if k in settings_rules.POLICY_FIELDS}
    failure = (value or {}).get(settings_rules.FAILURE_POLICY)
    try:
        text = settings_rules.namespace_failure_text(failure)
    except DanubeError:
        text = ""  # a default this version cannot read: the broker's applies
    return Policies(**known, failure_policy=text)
