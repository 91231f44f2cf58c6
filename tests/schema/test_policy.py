"""What each validation policy does with a message (danube.machines.schema.policy): the table of
spec/schema-registry.md "Topics", and the properties that make the policies what they say."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.machines.schema.formats import SchemaType, parse
from danube.machines.schema.policy import (
    ACCEPT,
    Problem,
    TopicSchemaConfig,
    ValidationPolicy,
    admission,
    checks_payload,
    judge,
    parse_policy,
    producer_binding,
    updated_binding,
)
from danube.values.errors import DanubeError, ErrorCode

SUBJECT = "orders"


def config(policy: ValidationPolicy, payloads: bool = True) -> TopicSchemaConfig:
    return TopicSchemaConfig(SUBJECT, policy, payloads)


@pytest.mark.parametrize(
    ("schema_id", "subject_of_id", "payload_problem", "problem"),
    [
        (None, None, None, Problem.MISSING_SCHEMA_ID),
        (9, None, None, Problem.UNKNOWN_SCHEMA),
        (3, "payments", None, Problem.SUBJECT_MISMATCH),
        (1, SUBJECT, "$.qty: 'x' is not of type 'integer'", Problem.PAYLOAD_INVALID),
        (1, SUBJECT, None, None),
    ],
)
def test_enforce_refuses_and_warn_accepts_every_problem(
    schema_id: int | None, subject_of_id: str | None, payload_problem: str | None,
    problem: Problem | None,
) -> None:  # fmt: skip
    enforced = judge(config(ValidationPolicy.ENFORCE), schema_id, subject_of_id, payload_problem)
    warned = judge(config(ValidationPolicy.WARN), schema_id, subject_of_id, payload_problem)
    assert enforced.problem is warned.problem is problem
    assert enforced.accept is (problem is None)
    assert warned.accept
    if payload_problem:
        assert payload_problem in enforced.detail


def test_no_binding_or_policy_none_accepts_anything() -> None:
    assert judge(None, None, None, "garbage").accept
    verdict = judge(config(ValidationPolicy.NONE), None, None, "garbage")
    assert verdict.accept and verdict.problem is None


@given(
    st.sampled_from(list(ValidationPolicy)),
    st.one_of(st.none(), st.integers(0, 5)),
    st.one_of(st.none(), st.sampled_from([SUBJECT, "other"])),
    st.one_of(st.none(), st.text(min_size=1, max_size=5)),
)
def test_only_enforce_ever_refuses_and_it_always_says_why(
    policy: ValidationPolicy, schema_id: int | None, subject: str | None, problem: str | None
) -> None:
    verdict = judge(config(policy), schema_id, subject, problem)
    if policy is not ValidationPolicy.ENFORCE:
        assert verdict.accept
    if not verdict.accept:
        assert verdict.problem is not None and verdict.detail


def test_a_binding_survives_its_stored_form() -> None:
    bound = config(ValidationPolicy.WARN, payloads=False)
    assert TopicSchemaConfig.from_json(bound.to_json()) == bound
    with pytest.raises(ValueError):
        TopicSchemaConfig.from_json({"subject": "x"})


def test_policies_are_read_in_any_case_and_unknown_ones_named() -> None:
    assert parse_policy(" Enforce ") is ValidationPolicy.ENFORCE
    with pytest.raises(DanubeError) as refused:
        parse_policy("strict")
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT and "none, warn or enforce" in str(
        refused.value.message
    )


def test_a_producer_binds_an_unbound_topic_with_warn_and_is_refused_elsewhere() -> None:
    bound = producer_binding(None, "/default/t", SUBJECT, registered=True)
    assert bound == TopicSchemaConfig(SUBJECT, ValidationPolicy.WARN, False)
    assert producer_binding(config(ValidationPolicy.ENFORCE), "/default/t", SUBJECT, True) is None
    for topic_config, registered, words in (
        (None, False, "is not registered"),
        (TopicSchemaConfig("payments", ValidationPolicy.NONE, False), True, "bound to"),
    ):
        with pytest.raises(DanubeError) as refused:
            producer_binding(topic_config, "/default/t", SUBJECT, registered)
        assert refused.value.code is ErrorCode.FAILED_PRECONDITION and words in str(
            refused.value.message
        )


def test_payloads_are_decoded_only_when_asked_and_of_the_bound_subject() -> None:
    assert checks_payload(config(ValidationPolicy.WARN, payloads=True), SUBJECT)
    assert not checks_payload(config(ValidationPolicy.WARN, payloads=False), SUBJECT)
    assert not checks_payload(config(ValidationPolicy.WARN, payloads=True), "other")
    assert not checks_payload(config(ValidationPolicy.WARN, payloads=True), None)


def test_an_update_keeps_the_subject_and_needs_a_binding() -> None:
    changed = updated_binding(
        config(ValidationPolicy.WARN, payloads=False), topic="/default/t",
        policy=ValidationPolicy.ENFORCE, payload_validation=True,
    )  # fmt: skip
    assert changed == TopicSchemaConfig(SUBJECT, ValidationPolicy.ENFORCE, True)
    with pytest.raises(DanubeError) as unbound:
        updated_binding(
            None, topic="/default/t", policy=ValidationPolicy.WARN, payload_validation=False
        )
    assert unbound.value.code is ErrorCode.FAILED_PRECONDITION


def test_an_unset_policy_is_none() -> None:
    assert parse_policy("") is ValidationPolicy.NONE


def test_admission_decodes_the_payload_only_of_the_bound_subject_when_asked() -> None:
    """The whole publish check the broker's gate and the simulator both call."""
    schema = parse(SchemaType.STRING, b"")
    bad = b"\xff"
    enforce = config(ValidationPolicy.ENFORCE)
    assert admission(enforce, 1, (SUBJECT, schema), b"fine").accept
    refused = admission(enforce, 1, (SUBJECT, schema), bad)
    assert (refused.accept, refused.problem) == (False, Problem.PAYLOAD_INVALID)
    assert admission(
        config(ValidationPolicy.ENFORCE, payloads=False), 1, (SUBJECT, schema), bad
    ).accept
    other = admission(enforce, 1, ("another", schema), bad)
    assert other.problem is Problem.SUBJECT_MISMATCH
    assert admission(config(ValidationPolicy.NONE), None, None, bad) == ACCEPT
    assert admission(None, None, None, bad) == ACCEPT
