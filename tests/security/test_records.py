"""Stored roles and bindings (`danube.machines.security.records`): what SecurityAdmin
refuses, how resources are spelt in keys, and that a damaged stored entry grants nothing."""

from __future__ import annotations

import pytest

from danube.machines.security import records
from danube.machines.security.rbac import (
    Permission,
    Principal,
    Rbac,
    Scope,
    decide,
    namespace,
    topic,
)
from danube.values.errors import DanubeError, ErrorCode


def test_role_checks() -> None:
    assert records.role("w", ["Produce", "Produce", "Lookup"])["permissions"] == [
        "Produce",
        "Lookup",
    ]
    for name, perms in (("", ["Produce"]), ("a/b", ["Produce"]), ("w", []), ("w", ["produce"])):
        with pytest.raises(DanubeError) as raised:
            records.role(name, perms)
        assert raised.value.code is ErrorCode.INVALID_ARGUMENT


def test_binding_checks_and_canonical_resources() -> None:
    made = records.binding("b", "user", "u", ["r"], "Namespace", "/default")
    assert made["scope"] == "namespace" and made["resource_name"] == "default"
    assert (
        records.binding("b", "user", "u", ["r"], "topic", "default/t")["resource_name"]
        == "/default/t"
    )
    assert records.binding_key(Scope.TOPIC, "default/t", "b") == "/auth/bindings/topic/default/t/b"
    assert records.binding_key(Scope.CLUSTER, "", "b") == "/auth/bindings/cluster/b"
    for args in (
        ("", "user", "u", ["r"], "cluster", ""),
        ("b", "robot", "u", ["r"], "cluster", ""),
        ("b", "user", "", ["r"], "cluster", ""),
        ("b", "user", "u", [], "cluster", ""),
        ("b", "user", "u", ["r"], "galaxy", ""),
        ("b", "user", "u", ["r"], "topic", ""),
    ):
        with pytest.raises(DanubeError):
            records.binding(*args)  # type: ignore[arg-type]


def test_system_roles_cannot_be_deleted() -> None:
    with pytest.raises(DanubeError) as raised:
        records.undeletable(records.role("admin", ["ManageCluster"], system=True))
    assert raised.value.code is ErrorCode.FAILED_PRECONDITION


def test_stored_entries_join_the_configured_ones_and_damage_grants_nothing() -> None:
    entries = {
        records.role_key("w"): records.role("w", ["Produce"]),
        records.binding_key(Scope.NAMESPACE, "default", "b"): records.binding(
            "b", "user", "u", ["w"], "namespace", "default"
        ),
        "/auth/bindings/topic/x/y/broken": {"id": "broken", "scope": "cluster"},
        "/auth/roles/broken": {"name": "broken", "permissions": ["Fly"]},
    }
    state = records.rbac_from(entries, Rbac(super_admins=frozenset({"root"})))
    user = Principal("user", "u")
    assert decide(user, Permission.PRODUCE, topic("/default/t"), state).allowed
    assert not decide(user, Permission.PRODUCE, namespace("other"), state).allowed
    assert len(state.bindings) == 1 and set(state.roles) == {"w"}
    assert state.super_admins == frozenset({"root"})
