"""Roles and bindings as the metadata store keeps them (Danube's keys, reference §7:
`/auth/roles/<name>`, `/auth/bindings/cluster/<id>`, `/auth/bindings/<scope>/<resource>/<id>`)
and the checks `SecurityAdmin` applies before storing one. Pure: JSON in, values out.

A stored value is the whole definition (the key only has to be unique), so a resource name
with slashes (a topic) needs no escaping: the key is never parsed back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from danube.machines.security.rbac import Binding, Permission, Rbac, Role, Scope
from danube.values.errors import DanubeError, ErrorCode, invalid, quoted

AUTH_PREFIX = "/auth/"
ROLES_PREFIX = "/auth/roles/"
BINDINGS_PREFIX = "/auth/bindings/"
PRINCIPAL_KINDS = ("user", "service_account", "broker_internal")
MAX_NAME = 255


def _name(text: str, what: str) -> str:
    if not text:
        raise invalid(f"{what} is required")
    if "/" in text or len(text.encode()) > MAX_NAME or not text.isprintable():
        raise invalid(f"{what} {quoted(text)}: no '/', printable, at most {MAX_NAME} bytes")
    return text


def resource_key(scope: Scope, resource: str) -> str:
    """The canonical spelling of a binding's resource: namespaces without slashes, topics
    as `/ns/t` (so `default` and `/default` are one namespace), subjects as given."""
    if scope is Scope.CLUSTER:
        return ""
    if not resource:
        raise invalid(f"a {scope.value}-scoped binding needs a resource name")
    if scope is Scope.NAMESPACE:
        return resource.strip("/")
    if scope is Scope.TOPIC:
        return "/" + resource.strip("/")
    return resource


def role_key(name: str) -> str:
    return ROLES_PREFIX + _name(name, "role name")


def binding_key(scope: Scope, resource: str, binding_id: str) -> str:
    _name(binding_id, "binding id")
    if scope is Scope.CLUSTER:
        return f"{BINDINGS_PREFIX}cluster/{binding_id}"
    return f"{BINDINGS_PREFIX}{scope.value}/{resource_key(scope, resource).strip('/')}/{binding_id}"


def scope_of(text: str) -> Scope:
    try:
        return Scope.parse(text)
    except ValueError as error:
        raise invalid(str(error)) from None


def role(name: str, permissions: Iterable[str], system: bool = False) -> dict[str, Any]:
    """A checked role, as stored: permissions by Danube's exact names."""
    _name(name, "role name")
    perms = list(dict.fromkeys(permissions))
    if not perms:
        raise invalid("a role needs at least one permission")
    for permission in perms:
        try:
            Permission.parse(permission)
        except ValueError as error:
            raise invalid(str(error)) from None
    return {"name": name, "permissions": perms, "system": system}


def binding(
    binding_id: str,
    principal_type: str,
    principal_name: str,
    roles: Iterable[str],
    scope: str,
    resource: str,
) -> dict[str, Any]:
    """A checked binding, as stored."""
    _name(binding_id, "binding id")
    if principal_type not in PRINCIPAL_KINDS:
        raise invalid(f"principal_type: expected one of {', '.join(PRINCIPAL_KINDS)}")
    if not principal_name:
        raise invalid("principal_name is required")
    names = list(dict.fromkeys(roles))
    if not names:
        raise invalid("a binding needs at least one role")
    kind = scope_of(scope)
    return {
        "id": binding_id,
        "principal_type": principal_type,
        "principal_name": principal_name,
        "role_names": names,
        "scope": kind.value,
        "resource_name": resource_key(kind, resource),
    }


def undeletable(stored: Mapping[str, Any]) -> None:
    if stored.get("system"):
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION, f"role {quoted(stored['name'])} is a system role"
        )


def rbac_from(entries: Mapping[str, Any], base: Rbac) -> Rbac:
    """`base` (the configuration's roles, bindings and super admins) plus every stored role
    and binding under `/auth/` (a stored role replaces a configured one of its name). Values
    that do not parse are skipped: a damaged entry must not lock everyone out, nor grant."""
    roles = dict(base.roles)
    bindings = list(base.bindings)
    for key, value in sorted(entries.items()):
        try:
            if key.startswith(ROLES_PREFIX):
                perms = frozenset(Permission.parse(p) for p in value["permissions"])
                roles[value["name"]] = Role(value["name"], perms)
            elif key.startswith(BINDINGS_PREFIX):
                bindings.append(
                    Binding(
                        str(value["id"]),
                        str(value["principal_type"]),
                        str(value["principal_name"]),
                        tuple(str(r) for r in value["role_names"]),
                        Scope.parse(str(value["scope"])),
                        str(value.get("resource_name", "")),
                    )
                )
        except (KeyError, TypeError, ValueError):
            continue
    return Rbac(roles, tuple(bindings), base.super_admins)


class AuthView:
    """The entries under `/auth/` as a cluster broker follows them (a read, then the watch's
    events; `danube.runtime.watching.follow`), and the newest revision it includes, so that a
    `SecurityAdmin` write on this broker can wait until its own change is in force here.
    Events arrive in revision order; one at or below `revision` is already in the view and
    is ignored, so a replayed or late event never undoes a newer state (a revocation is
    never put back)."""

    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}
        self.revision = 0

    def load(self, entries: Iterable[tuple[str, Any, int]]) -> int:
        """A full read: (key, value, mod_revision) of every entry. Returns the revision the
        read includes (the newest entry's; later events are newer)."""
        found = list(entries)
        self.entries = {key: value for key, value, _ in found}
        self.revision = max([self.revision, *(rev for _, _, rev in found)])
        return self.revision

    def apply(self, kind: str, key: str, value: Any, revision: int) -> bool:
        """One watch event; True when it changed the view."""
        if revision <= self.revision:
            return False
        self.revision = revision
        if kind == "delete":
            return self.entries.pop(key, None) is not None
        self.entries[key] = value
        return True
