"""The authorization decision (`danube.machines.security.rbac`): a table of cases, each a
quirk of Danube's we fix or a rule we keep, and hypothesis properties: default deny, adding a
binding never removes access, removing one never adds it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.security.rbac import (
    ANONYMOUS,
    CLUSTER,
    Binding,
    Permission,
    Principal,
    Rbac,
    Resource,
    Role,
    Scope,
    decide,
    namespace,
    subject,
    topic,
)

P = Permission
ALICE = Principal("user", "alice")
APP = Principal("service_account", "app")
ROLES = {
    "producer": Role("producer", frozenset({P.PRODUCE, P.LOOKUP})),
    "consumer": Role("consumer", frozenset({P.CONSUME, P.LOOKUP})),
    "schemas": Role("schemas", frozenset({P.MANAGE_SCHEMA})),
    "admin": Role("admin", frozenset(P)),
}


def rbac(*bindings: Binding, super_admins: frozenset[str] = frozenset()) -> Rbac:
    return Rbac(ROLES, bindings, super_admins)


def bind(scope: Scope, resource: str, *roles: str, who: Principal = APP) -> Binding:
    return Binding(f"b-{scope.value}-{resource}", who.kind, who.name, roles, scope, resource)


CASES = [
    # (what, principal, permission, resource, rbac, allowed)
    ("no binding: denied", APP, P.PRODUCE, topic("/default/t"), rbac(), False),
    ("anonymous is denied", ANONYMOUS, P.LOOKUP, CLUSTER, rbac(), False),
    (
        "anonymous is no super admin even if the name '' is listed",
        ANONYMOUS, P.LOOKUP, CLUSTER, rbac(super_admins=frozenset({""})), False,
    ),
    ("super admin", ALICE, P.MANAGE_CLUSTER, CLUSTER,
     rbac(super_admins=frozenset({"alice"})), True),
    ("topic binding", APP, P.PRODUCE, topic("/default/t"),
     rbac(bind(Scope.TOPIC, "/default/t", "producer")), True),
    ("topic binding without the leading slash", APP, P.PRODUCE, topic("/default/t"),
     rbac(bind(Scope.TOPIC, "default/t", "producer")), True),
    ("topic binding covers the topic's partitions", APP, P.PRODUCE, topic("/default/t-part-3"),
     rbac(bind(Scope.TOPIC, "/default/t", "producer")), True),
    ("topic binding does not cover a prefix-sharing topic", APP, P.PRODUCE,
     topic("/default/t2"), rbac(bind(Scope.TOPIC, "/default/t", "producer")), False),
    ("topic binding is not another topic's", APP, P.PRODUCE, topic("/default/u"),
     rbac(bind(Scope.TOPIC, "/default/t", "producer")), False),
    ("role lacks the permission", APP, P.CONSUME, topic("/default/t"),
     rbac(bind(Scope.TOPIC, "/default/t", "producer")), False),
    ("consume on the topic scope is enough (Danube wants cluster scope for receive)",
     APP, P.CONSUME, topic("/default/t"), rbac(bind(Scope.TOPIC, "/default/t", "consumer")), True),
    ("namespace binding, bare name", APP, P.PRODUCE, topic("/default/t"),
     rbac(bind(Scope.NAMESPACE, "default", "producer")), True),
    ("namespace binding, leading slash (Danube never matches it)", APP, P.PRODUCE,
     topic("/default/t"), rbac(bind(Scope.NAMESPACE, "/default", "producer")), True),
    ("namespace binding of another namespace", APP, P.PRODUCE, topic("/other/t"),
     rbac(bind(Scope.NAMESPACE, "default", "producer")), False),
    ("namespace binding on the namespace resource", APP, P.MANAGE_NAMESPACE,
     namespace("default"), rbac(bind(Scope.NAMESPACE, "/default", "admin")), True),
    ("namespace binding gives nothing at cluster scope", APP, P.MANAGE_NAMESPACE, CLUSTER,
     rbac(bind(Scope.NAMESPACE, "default", "admin")), False),
    ("cluster binding covers everything", APP, P.MANAGE_SCHEMA, subject("orders"),
     rbac(bind(Scope.CLUSTER, "", "schemas")), True),
    ("a subject is its own resource", APP, P.MANAGE_SCHEMA, subject("orders"),
     rbac(bind(Scope.SUBJECT, "orders", "schemas")), True),
    ("a topic binding named like the subject does not cover it (Danube: it does)", APP,
     P.MANAGE_SCHEMA, subject("orders"), rbac(bind(Scope.TOPIC, "orders", "schemas")), False),
    ("a subject binding does not cover a topic", APP, P.MANAGE_SCHEMA, topic("/default/orders"),
     rbac(bind(Scope.SUBJECT, "/default/orders", "schemas")), False),
    ("another principal's binding", ALICE, P.PRODUCE, topic("/default/t"),
     rbac(bind(Scope.TOPIC, "/default/t", "producer")), False),
    ("same name, another principal type", Principal("user", "app"), P.PRODUCE,
     topic("/default/t"), rbac(bind(Scope.TOPIC, "/default/t", "producer")), False),
    ("a binding naming a missing role", APP, P.PRODUCE, topic("/default/t"),
     rbac(bind(Scope.TOPIC, "/default/t", "nope")), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("principal", "permission", "resource", "state", "allowed"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decision_table(
    principal: Principal, permission: Permission, resource: Resource, state: Rbac, allowed: bool
) -> None:
    decision = decide(principal, permission, resource, state)
    assert decision.allowed is allowed, decision.reason


def test_a_denial_names_permission_and_resource_but_no_secret() -> None:
    decision = decide(APP, P.PRODUCE, topic("/default/t"), rbac())
    assert not decision.allowed
    assert "Produce" in decision.reason and "/default/t" in decision.reason


NAMES = st.sampled_from(["a", "b", "default", "/default", "default/t", "/default/t", "t"])
PRINCIPALS = st.builds(Principal, st.sampled_from(["user", "service_account"]), NAMES)
BINDINGS = st.builds(
    Binding,
    st.text("xyz", min_size=1, max_size=3),
    st.sampled_from(["user", "service_account"]),
    NAMES,
    st.lists(st.sampled_from([*sorted(ROLES), "missing"]), min_size=1, max_size=2).map(tuple),
    st.sampled_from(list(Scope)),
    NAMES,
)
RESOURCES = st.one_of(
    st.just(CLUSTER),
    st.builds(namespace, NAMES),
    st.builds(topic, st.sampled_from(["/default/t", "/default/t-part-0", "/a/b", "/b/t"])),
    st.builds(subject, NAMES),
)
QUESTIONS = st.tuples(PRINCIPALS, st.sampled_from(list(P)), RESOURCES)


@settings(max_examples=300, deadline=None)
@given(st.lists(BINDINGS, max_size=6), BINDINGS, QUESTIONS)
def test_adding_a_binding_never_removes_access(
    bindings: list[Binding], extra: Binding, question: tuple[Principal, Permission, Resource]
) -> None:
    before = decide(*question, rbac(*bindings)).allowed
    after = decide(*question, rbac(*bindings, extra)).allowed
    assert after or not before


@settings(max_examples=300, deadline=None)
@given(st.lists(BINDINGS, min_size=1, max_size=6), st.data(), QUESTIONS)
def test_removing_a_binding_never_adds_access(
    bindings: list[Binding], data: st.DataObject, question: tuple[Principal, Permission, Resource]
) -> None:
    index = data.draw(st.integers(0, len(bindings) - 1))
    before = decide(*question, rbac(*bindings)).allowed
    after = decide(*question, rbac(*(bindings[:index] + bindings[index + 1 :]))).allowed
    assert before or not after


@settings(max_examples=300, deadline=None)
@given(st.lists(BINDINGS, max_size=6), QUESTIONS)
def test_access_needs_a_binding_of_that_principal(
    bindings: list[Binding], question: tuple[Principal, Permission, Resource]
) -> None:
    """Default deny: an allowed decision always rests on a binding of the asking principal
    whose role holds the permission (no super admins here)."""
    principal, permission, _ = question
    if decide(*question, rbac(*bindings)).allowed:
        assert any(
            b.principal_kind == principal.kind
            and b.principal_name == principal.name
            and any(r in ROLES and permission in ROLES[r].permissions for r in b.roles)
            for b in bindings
        )
