"""What an operator sets on a topic or subscription through the admin API: topic policies,
a subscription's failure policy and its dispatch window. Validated here, once, for the
core and the simulator alike; stored as JSON under Danube's keys."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from danube.machines.dispatch.failure import NO_LIMIT, Backoff, FailurePolicy, Poison
from danube.values.config import MAX_UNACKED_MESSAGES_LIMIT, Policies
from danube.values.errors import DanubeError, invalid, quoted
from danube.values.names import parse_topic

U32_MAX = (1 << 32) - 1
FAILURE_POLICY = "failure_policy"
"""The namespace policy holding the default failure policy (not a limit: a JSON object)."""
POLICY_FIELDS: tuple[str, ...] = tuple(f for f in Policies.__slots__ if f != FAILURE_POLICY)
"""The limits: whole numbers, set on a namespace or overridden by a topic."""


def policy_changes(changes: Mapping[str, Any], *, namespace: bool = False) -> dict[str, Any]:
    """The fields a SetNamespacePolicies / SetTopicPolicies call changes, checked: known
    names only, whole numbers from 0 (unlimited) to 2**32 - 1, as Danube's u32 fields; and,
    for a namespace, `failure_policy` (`namespace_failure_text`)."""
    if not isinstance(changes, Mapping) or not changes:
        raise invalid(
            "policies must be a JSON object naming at least one field of "
            + ", ".join(POLICY_FIELDS)
        )
    checked: dict[str, Any] = {}
    for name, value in changes.items():
        if name == FAILURE_POLICY:
            if not namespace:
                raise invalid(
                    "failure_policy is a namespace default; a subscription sets its own "
                    "with SetSubscriptionFailurePolicy (topics set-failure-policy)"
                )
            checked[name] = namespace_failure_text(value)
            continue
        if name not in POLICY_FIELDS:
            raise invalid(f"unknown policy {quoted(name)}; known: {', '.join(POLICY_FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32_MAX:
            raise invalid(f"{name} must be a whole number from 0 (unlimited) to {U32_MAX}")
        checked[name] = value
    return checked


def stored_policies(value: Any) -> dict[str, int]:
    """A topic's own policies as read back from the store: the fields that pass the same
    checks as a change; anything else (hand-written, another version's) is left out, so the
    namespace's value applies rather than a publish failing on a bad one."""
    if not isinstance(value, Mapping):
        return {}
    kept = {}
    for name, field in value.items():
        try:
            kept.update(policy_changes({name: field}))
        except DanubeError:
            continue
    return kept


def merged_policies(stored: Any, changes: Mapping[str, Any]) -> dict[str, Any]:
    """Every field of a namespace's policies after `changes`, over the stored value (a
    field missing from it takes its default)."""
    checked = policy_changes(changes, namespace=True)
    merged = dataclasses.replace(namespace_policies(stored), **checked)
    return policies_json(merged)


FAILURE_COUNTS = (
    "max_redelivery_count",
    "ack_timeout_ms",
    "base_redelivery_delay_ms",
    "max_redelivery_delay_ms",
)
FAILURE_FIELDS = frozenset(
    (*FAILURE_COUNTS, "backoff_strategy", "dead_letter_topic", "poison_policy")
)
"""The fields a namespace's default failure policy takes: a typo is refused, not dropped."""


def namespace_failure_text(value: Any) -> str:
    """A namespace's default failure policy as given (Danube's `SubscriptionFailurePolicy`
    fields as JSON, `max_redelivery_count` with Danube's meaning; null or {} clears it),
    checked as a subscription's and kept as canonical JSON text."""
    if value is None or value == {}:
        return ""
    if not isinstance(value, Mapping):
        raise invalid("failure_policy must be a JSON object of the failure policy's fields")
    if value.get("limits", LIMIT_MEANING) != LIMIT_MEANING:  # as read back: Danube's meaning
        raise invalid(f"failure_policy: limits can only be {LIMIT_MEANING!r}")
    unknown = sorted(set(value) - FAILURE_FIELDS - {"limits"})
    if unknown:
        raise invalid(
            f"failure_policy: unknown field(s) {', '.join(map(repr, unknown))}; "
            f"the fields are {', '.join(sorted(FAILURE_FIELDS))}"
        )
    for name in FAILURE_COUNTS:
        if name in value and (type(value[name]) is not int or value[name] < 0):
            raise invalid(f"failure_policy: {name} must be a whole number >= 0")
    try:
        settings = SubscriptionFailureSettings.from_json({**value, "limits": LIMIT_MEANING})
    except (KeyError, ValueError, TypeError, OverflowError) as error:
        raise invalid(f"failure_policy: {error}") from None
    return json.dumps(settings.to_json(), sort_keys=True)


def namespace_failure(policies: Policies) -> SubscriptionFailureSettings | None:
    """The namespace's default failure policy; None when it has none (or one this version
    cannot read: the broker's default applies rather than no dispatch at all)."""
    if not policies.failure_policy:
        return None
    try:
        return SubscriptionFailureSettings.from_json(json.loads(policies.failure_policy))
    except (DanubeError, KeyError, ValueError, TypeError):
        return None


def namespace_policies(value: Any) -> Policies:
    """A namespace's policies as stored: the limits that check, and its default failure
    policy when it checks (anything else is left out)."""
    limits = stored_policies(value)
    failure = value.get(FAILURE_POLICY) if isinstance(value, Mapping) else None
    try:
        text = namespace_failure_text(failure)
    except DanubeError:
        text = ""
    return Policies(**limits, failure_policy=text)


def policies_json(policies: Policies) -> dict[str, Any]:
    """The limits, and `failure_policy` as a JSON object when the namespace has one (absent
    otherwise, so the answer of a namespace without one is what it was)."""
    value: dict[str, Any] = {name: getattr(policies, name) for name in POLICY_FIELDS}
    if policies.failure_policy:
        value[FAILURE_POLICY] = json.loads(policies.failure_policy)
    return value


def with_overrides(policies: Policies, overrides: Mapping[str, int]) -> Policies:
    return dataclasses.replace(policies, **overrides) if overrides else policies


class PoisonPolicy(enum.IntEnum):
    """What happens to a message past `max_redelivery_count` (Danube's wire values)."""

    DEAD_LETTER = 0
    BLOCK = 1
    DROP = 2


_POISON = {
    PoisonPolicy.DEAD_LETTER: Poison.DEAD_LETTER,
    PoisonPolicy.BLOCK: Poison.BLOCK,
    PoisonPolicy.DROP: Poison.DROP,
}

LIMIT_MEANING = "danube"
"""Marks a stored policy whose `max_redelivery_count` has Danube's meaning (0: no
redelivery). One stored without it was written when 0 was the only value accepted and meant
"for ever"."""

BACKOFF_WIRE = (Backoff.FIXED, Backoff.EXPONENTIAL)
"""Danube's BackoffStrategy enum values, by position."""


@dataclass(frozen=True, slots=True)
class SubscriptionFailureSettings:
    """Danube's SubscriptionFailurePolicy, with Danube's meaning of `max_redelivery_count`
    (0: no redelivery; `NO_LIMIT`, u32's maximum: for ever, our default where Danube's is 5;
    spec/failure-policies.md); the dispatch machine enforces it with the Drop, Block or
    DeadLetter poison policy (the republish: `danube.machines.node.dead_letters`)."""

    max_redelivery_count: int = NO_LIMIT
    ack_timeout_ms: int = 30_000
    base_redelivery_delay_ms: int = 1_000
    max_redelivery_delay_ms: int = 60_000
    backoff: Backoff = Backoff.EXPONENTIAL
    dead_letter_topic: str | None = None
    poison_policy: PoisonPolicy = PoisonPolicy.BLOCK

    def __post_init__(self) -> None:
        if self.ack_timeout_ms < 1:
            raise invalid(f"ack_timeout_ms must be at least 1, not {self.ack_timeout_ms}")
        if self.base_redelivery_delay_ms > self.max_redelivery_delay_ms:
            raise invalid(
                f"base_redelivery_delay_ms ({self.base_redelivery_delay_ms}) exceeds "
                f"max_redelivery_delay_ms ({self.max_redelivery_delay_ms})"
            )
        if self.poison_policy is PoisonPolicy.DEAD_LETTER and not self.dead_letter_topic:
            raise invalid("the DeadLetter poison policy needs a dead_letter_topic")
        if self.dead_letter_topic:
            parse_topic(self.dead_letter_topic)
        if not 0 <= self.max_redelivery_count <= U32_MAX:
            raise invalid(
                f"max_redelivery_count must be 0 (no redelivery) to {U32_MAX} (no limit), "
                f"not {self.max_redelivery_count}"
            )

    @property
    def dispatch_policy(self) -> FailurePolicy:
        return FailurePolicy(
            ack_timeout_ms=self.ack_timeout_ms,
            base_redelivery_delay_ms=self.base_redelivery_delay_ms,
            max_redelivery_delay_ms=self.max_redelivery_delay_ms,
            backoff=self.backoff,
            max_redelivery_count=self.max_redelivery_count,
            poison=_POISON[self.poison_policy],
            dead_letter_topic=self.dead_letter_topic,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "limits": LIMIT_MEANING,
            "max_redelivery_count": self.max_redelivery_count,
            "ack_timeout_ms": self.ack_timeout_ms,
            "base_redelivery_delay_ms": self.base_redelivery_delay_ms,
            "max_redelivery_delay_ms": self.max_redelivery_delay_ms,
            "backoff_strategy": self.backoff.value,
            "dead_letter_topic": self.dead_letter_topic,
            "poison_policy": self.poison_policy.name.lower(),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SubscriptionFailureSettings:
        count = int(value.get("max_redelivery_count", NO_LIMIT))
        if value.get("limits") != LIMIT_MEANING and count == 0:
            count = NO_LIMIT  # stored before limits existed, when 0 was the only value: for ever
        return cls(
            max_redelivery_count=count,
            ack_timeout_ms=int(value.get("ack_timeout_ms", 30_000)),
            base_redelivery_delay_ms=int(value.get("base_redelivery_delay_ms", 1_000)),
            max_redelivery_delay_ms=int(value.get("max_redelivery_delay_ms", 60_000)),
            backoff=Backoff(value.get("backoff_strategy", Backoff.EXPONENTIAL.value)),
            dead_letter_topic=value.get("dead_letter_topic") or None,
            poison_policy=PoisonPolicy[str(value.get("poison_policy", "block")).upper()],
        )


def check_window(max_unacked_messages: int) -> int:
    if not 1 <= max_unacked_messages <= MAX_UNACKED_MESSAGES_LIMIT:
        raise invalid(
            f"max_unacked_messages must be 1 to {MAX_UNACKED_MESSAGES_LIMIT}, "
            f"not {max_unacked_messages}"
        )
    return max_unacked_messages


@dataclass(slots=True)
class SubscriptionSettings:
    """A subscription's own settings; kept for a subscription that does not exist yet too
    (Danube lets the policy be set before the first consumer subscribes)."""

    failure: SubscriptionFailureSettings | None = None
    max_unacked_messages: int | None = None

    @property
    def empty(self) -> bool:
        return self.failure is None and self.max_unacked_messages is None
