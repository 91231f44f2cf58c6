"""Topic schema bindings and what each validation policy does with a published message
(spec/schema-registry.md "Topics"). Pure: the broker finds the facts (the topic's binding,
the subject of the message's schema id, whether the payload validates) and asks here.

Where Danube rejects under `warn` (an unknown schema id, an invalid payload) [quirk], `warn`
here accepts and reports: warn means "tell me", enforce means "refuse"."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeGuard

from danube.machines.schema.formats import ParsedSchema, validate
from danube.values.errors import DanubeError, ErrorCode, invalid, quoted


class ValidationPolicy(enum.Enum):
    NONE = "none"
    WARN = "warn"
    ENFORCE = "enforce"


def parse_policy(text: str) -> ValidationPolicy:
    """Any case; empty (a request that left the field unset) is `none`."""
    try:
        return ValidationPolicy(text.strip().lower() or "none")
    except ValueError:
        raise invalid(f"unknown validation policy {quoted(text)} (none, warn or enforce)") from None


@dataclass(frozen=True, slots=True)
class TopicSchemaConfig:
    subject: str
    policy: ValidationPolicy
    payload_validation: bool
    """Also decode each payload against the schema version the message names."""

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "validation_policy": self.policy.value,
            "enable_payload_validation": self.payload_validation,
        }

    @classmethod
    def from_json(cls, value: Any) -> TopicSchemaConfig:
        try:
            return cls(
                str(value["subject"]),
                ValidationPolicy(value["validation_policy"]),
                bool(value["enable_payload_validation"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a topic schema config: {error!r}") from None


class Problem(enum.Enum):
    """Why a message does not fit its topic's schema (the reason a warning is counted and
    logged under)."""

    MISSING_SCHEMA_ID = "missing_schema_id"
    UNKNOWN_SCHEMA = "unknown_schema"
    SUBJECT_MISMATCH = "subject_mismatch"
    PAYLOAD_INVALID = "payload_invalid"


@dataclass(frozen=True, slots=True)
class Verdict:
    accept: bool
    problem: Problem | None = None
    detail: str = ""


ACCEPT = Verdict(True)


def producer_binding(
    config: TopicSchemaConfig | None, topic: str, subject: str, registered: bool
) -> TopicSchemaConfig | None:
    """What a producer naming `subject` does to its topic: refused (FAILED_PRECONDITION, as
    Danube) when the subject is not registered or the topic is bound to another; an unbound
    topic is bound to it with policy warn (Danube's default), so messages that do not fit
    are counted and logged until an operator chooses enforce. Returns the binding to store,
    None when there is nothing to store."""
    if not registered:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"schema subject {quoted(subject)} is not registered: register it first",
        )
    if config is None:
        return TopicSchemaConfig(subject, ValidationPolicy.WARN, False)
    if config.subject != subject:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"{topic} is bound to schema subject {quoted(config.subject)}, not {quoted(subject)}",
        )
    return None


def updated_binding(
    current: TopicSchemaConfig | None,
    *,
    topic: str,
    policy: ValidationPolicy,
    payload_validation: bool,
) -> TopicSchemaConfig:
    """UpdateTopicValidationPolicy: the subject stays, policy and flag change; a topic bound
    to nothing has no policy to change (FAILED_PRECONDITION)."""
    if current is None:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"{topic} is bound to no schema subject: configure one first",
        )
    return TopicSchemaConfig(current.subject, policy, payload_validation)


def checks_payload(config: TopicSchemaConfig, subject_of_id: str | None) -> bool:
    """The payload is decoded only when asked and when the message names a schema of the
    bound subject (any other case is refused or warned without looking at it)."""
    return config.payload_validation and subject_of_id == config.subject


def judge(
    config: TopicSchemaConfig | None,
    schema_id: int | None,
    subject_of_id: str | None,
    payload_problem: str | None,
) -> Verdict:
    """`subject_of_id`: the subject the message's schema id (and version) names, None when
    the registry has no such schema; `payload_problem`: what the payload validator said
    (None: valid, or not checked)."""
    if config is None or config.policy is ValidationPolicy.NONE:
        return ACCEPT
    if schema_id is None:
        found = Verdict(
            False,
            Problem.MISSING_SCHEMA_ID,
            f"the topic requires schema subject {quoted(config.subject)} and the message names no "
            "schema id",
        )
    elif subject_of_id is None:
        found = Verdict(
            False, Problem.UNKNOWN_SCHEMA, f"the registry has no schema {schema_id} (or version)"
        )
    elif subject_of_id != config.subject:
        found = Verdict(
            False,
            Problem.SUBJECT_MISMATCH,
            f"schema {schema_id} belongs to subject {quoted(subject_of_id)}, the topic requires "
            f"{quoted(config.subject)}",
        )
    elif payload_problem is not None:
        found = Verdict(False, Problem.PAYLOAD_INVALID, payload_problem)
    else:
        return ACCEPT
    if config.policy is ValidationPolicy.WARN:
        return Verdict(True, found.problem, found.detail)
    return found


def inspects(config: TopicSchemaConfig | None) -> TypeGuard[TopicSchemaConfig]:
    """Whether publishes under this binding are looked at: the driver finds the schema a
    message names only for these (none costs a publish nothing)."""
    return config is not None and config.policy is not ValidationPolicy.NONE


def admission(
    config: TopicSchemaConfig | None,
    schema_id: int | None,
    named: tuple[str, ParsedSchema] | None,
    payload: bytes,
) -> Verdict:
    """The whole publish check once the driver has found the facts: the topic's binding and
    the subject and schema the message's (schema id, version) names (None: the registry has
    no such schema). The payload is decoded here when the binding asks for it."""
    if not inspects(config):
        return ACCEPT
    subject_of_id = None if named is None else named[0]
    payload_problem = None
    if named is not None and checks_payload(config, subject_of_id):
        payload_problem = validate(named[1], payload)
    return judge(config, schema_id, subject_of_id, payload_problem)
