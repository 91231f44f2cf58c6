"""Operator settings of a reliable subscription (admin API; the rules are
`danube.machines.node.settings`): its failure policy and dispatch window, stored for a subscription
that may not exist yet and applied at once to a live one."""

from __future__ import annotations

from typing import Any

from danube.machines.dispatch import SubscriptionType
from danube.machines.dispatch import reliable as rd
from danube.machines.node import paths
from danube.machines.node import settings as settings_rules
from danube.machines.node.catalogue import Catalogue
from danube.machines.node.consumers import check_subscription_name
from danube.machines.node.effects import Effect, PersistMeta, Step
from danube.machines.node.records import TopicRecord
from danube.machines.node.reliable_log import ReliableLogs
from danube.machines.node.settings import SubscriptionFailureSettings, SubscriptionSettings
from danube.values.errors import DanubeError, ErrorCode, invalid


class SubscriptionSettingsAdmin:
    def __init__(self, catalogue: Catalogue, logs: ReliableLogs, *, clustered: bool) -> None:
        self._catalogue = catalogue
        self._logs = logs
        self._clustered = clustered

    def subscription_type(self, topic: str, subscription: str) -> SubscriptionType | None:
        sub = self._catalogue.topic(topic).subscriptions.get(subscription)
        return sub.sub_type if sub is not None else None

    def failure_policy(self, topic: str, subscription: str) -> SubscriptionFailureSettings | None:
        """The subscription's own policy; None when it runs with the broker's defaults."""
        settings = self._catalogue.topic(topic).settings.get(subscription)
        return settings.failure if settings is not None else None

    def set_failure_policy(
        self, topic: str, subscription: str, policy: SubscriptionFailureSettings, now_ms: int
    ) -> Step[None]:
        """Stored for the subscription, which may not exist yet, and applied at once to a
        live one (Danube only reads it when the subscription loads)."""
        record = self._catalogue.reliable_topic(topic, "a failure policy")
        check_subscription_name(subscription)
        if policy.poison_policy is settings_rules.PoisonPolicy.DEAD_LETTER:
            self._check_dead_letter_topic(topic, policy.dead_letter_topic)
        record.settings.setdefault(subscription, SubscriptionSettings()).failure = policy
        stored = (paths.failure_policy(record.name, subscription), policy.to_json())
        return self._configure(record, subscription, stored, now_ms, policy=policy.dispatch_policy)

    def clear_failure_policy(self, topic: str, subscription: str, now_ms: int) -> Step[bool]:
        """Drops the subscription's own policy: it follows its namespace's default again
        (else the broker's). The stored policy is deleted (a restart or a move reads none
        back) and a live subscription takes the default at once, as a policy change does
        (`configure`: blocked messages re-resolved). False: it had no policy of its own (the
        delete is written all the same, so a stray stored policy cannot survive it)."""
        record = self._catalogue.reliable_topic(topic, "a failure policy")
        check_subscription_name(subscription)
        settings = record.settings.get(subscription)
        had = settings is not None and settings.failure is not None
        if settings is not None:
            settings.failure = None
            if settings.empty:
                del record.settings[subscription]
        effects: list[Effect] = [
            PersistMeta(deletes=(paths.failure_policy(record.name, subscription),))
        ]
        sub = record.subscriptions.get(subscription)
        if sub is not None:
            policy = self._catalogue.failure_policy(record, subscription)
            found = sub.reliable.configure(now_ms, policy=policy)
            effects.extend(self._logs.dispatch(record, sub, found, now_ms))
        return Step(had, tuple(effects))

    def _check_dead_letter_topic(self, topic: str, dead_letter_topic: str | None) -> None:
        """What the republish flow cannot do is refused now rather than retried for ever:
        a topic dead-lettering to itself and a non-reliable dead-letter topic (Danube's
        strategy mismatch; in cluster mode only when this broker serves it: one served
        elsewhere is reached by forwarding, `ForwardDeadLetter`, and refused there if it is
        non-reliable, the message waiting meanwhile)."""
        if dead_letter_topic == topic:
            raise invalid("a topic cannot be its own dead-letter topic")
        target = self._catalogue.topics_by_name.get(dead_letter_topic or "")
        if target is not None and not target.reliable:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"dead-letter topic {dead_letter_topic} is non-reliable; it must be reliable",
            )

    def apply_namespace_defaults(self, now_ms: int) -> list[Effect]:
        """Namespaces whose default failure policy changed (through this broker or, in
        cluster mode, another): each live subscription without a policy of its own takes the
        new default at once (`configure`: blocked messages are re-resolved under it)."""
        changed = self._catalogue.failure_defaults_changed
        if not changed:
            return []
        namespaces = set(changed)
        changed.clear()
        effects: list[Effect] = []
        for record in self._catalogue.topic_records():
            if record.name.namespace not in namespaces or not record.reliable:
                continue
            for sub in record.subscriptions.values():
                own = record.settings.get(sub.name)
                if own is not None and own.failure is not None:
                    continue
                policy = self._catalogue.failure_policy(record, sub.name)
                found = sub.reliable.configure(now_ms, policy=policy)
                effects.extend(self._logs.dispatch(record, sub, found, now_ms))
        return effects

    def blocked(self, topic: str, subscription: str) -> tuple[int, ...]:
        sub = self._catalogue.topic(topic).subscriptions.get(subscription)
        if sub is None or not isinstance(sub.dispatcher, rd.ReliableSubscription):
            return ()
        return sub.dispatcher.blocked

    def resolve_blocked(
        self, topic: str, subscription: str, offset: int, release: bool, now_ms: int
    ) -> Step[bool]:
        """Release or skip a blocked message of a live subscription (Danube has no such
        operation: only a policy change and a reload unblock it there). A release resets the
        message's stored failure count at the next cursor write."""
        record = self._catalogue.reliable_topic(topic, "releasing a blocked message")
        sub = record.subscriptions.get(subscription)
        if sub is None or offset not in self.blocked(topic, subscription):
            return Step(False)
        dispatcher = sub.reliable
        found = (dispatcher.release if release else dispatcher.skip)(offset, now_ms)
        return Step(True, tuple(self._logs.dispatch(record, sub, found, now_ms)))

    def dispatch_window(self, topic: str, subscription: str) -> int | None:
        """The subscription's own `max_unacked_messages`; None when it uses the broker's."""
        settings = self._catalogue.topic(topic).settings.get(subscription)
        return settings.max_unacked_messages if settings is not None else None

    def set_dispatch_window(
        self, topic: str, subscription: str, max_unacked_messages: int, now_ms: int
    ) -> Step[None]:
        """Danube stores this and never reads it; here it is the subscription's window from
        now on."""
        record = self._catalogue.reliable_topic(topic, "a dispatch config")
        check_subscription_name(subscription)
        window = settings_rules.check_window(max_unacked_messages)
        settings = record.settings.setdefault(subscription, SubscriptionSettings())
        settings.max_unacked_messages = window
        value = {"max_unacked_messages": window}
        stored = (paths.dispatch_config(record.name, subscription), value)
        return self._configure(record, subscription, stored, now_ms, max_unacked_messages=window)

    def _configure(
        self,
        record: TopicRecord,
        subscription: str,
        stored: tuple[str, Any],
        now_ms: int,
        **changes: Any,
    ) -> Step[None]:
        """Persists a subscription setting (the key and value in `stored`) and applies
        `changes` to the live subscription, if there is one yet."""
        effects: list[Effect] = [PersistMeta(puts=(stored,))]
        sub = record.subscriptions.get(subscription)
        if sub is not None:
            found = sub.reliable.configure(now_ms, **changes)
            effects.extend(self._logs.dispatch(record, sub, found, now_ms))
        return Step(None, tuple(effects))
