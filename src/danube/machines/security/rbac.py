"""The authorization decision: role-based access control with default deny (spec/security.md).

`decide` is a pure function of who asks, for what, on which resource and the bindings in
force, so table tests and hypothesis properties can pin it down and the broker's request path
only looks up the (permission, resource) of each RPC and asks here.

Danube's model (reference §9.3) with its quirks fixed, on purpose:
- a namespace binding matches the namespace spelled with or without its leading slash;
- a schema subject is a resource of its own (scope `subject`), not a topic of that name;
- Receive, Ack and Nack are checked on the consumer's topic, not at cluster scope (the
  request path resolves the topic; this module only sees a topic resource);
- a topic binding on a partitioned topic's base name covers its partitions (`<base>-part-N`),
  which clients address one by one;
- no principal is allowed because of a header or an unverified claim: only a principal
  listed in `super_admins` (its kind too: `is_super_admin`) and a broker of the cluster
  (proven by a token signed with the cluster key) bypass the bindings.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from danube.values.names import PARTITION_MARKER


class Permission(enum.Enum):
    """Danube's permissions, spelled as its `CreateRole` accepts them."""

    LOOKUP = "Lookup"
    PRODUCE = "Produce"
    CONSUME = "Consume"
    REPLICATE = "Replicate"
    MANAGE_NAMESPACE = "ManageNamespace"
    MANAGE_TOPIC = "ManageTopic"
    MANAGE_SCHEMA = "ManageSchema"
    MANAGE_BROKER = "ManageBroker"
    MANAGE_CLUSTER = "ManageCluster"

    @classmethod
    def parse(cls, name: str) -> Permission:
        """Exact names only, as Danube: a misspelt permission is an error, not a no-op."""
        for permission in cls:
            if permission.value == name:
                return permission
        raise ValueError(f"unknown permission {name!r} (expected one of {_NAMES})")


_NAMES = ", ".join(p.value for p in Permission)


class Scope(enum.Enum):
    CLUSTER = "cluster"
    NAMESPACE = "namespace"
    TOPIC = "topic"
    SUBJECT = "subject"
    """Ours: a schema subject (Danube treats a subject as a topic of that name)."""

    @classmethod
    def parse(cls, name: str) -> Scope:
        try:
            return cls(name.lower())
        except ValueError:
            raise ValueError(
                f"unknown scope {name!r} (expected cluster, namespace, topic or subject)"
            ) from None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call comes from: `kind` is Danube's principal type (`user`,
    `service_account`, `broker_internal`) or `anonymous` when authentication is off."""

    kind: str
    name: str


ANONYMOUS = Principal("anonymous", "")
BROKER_KIND = "broker"
"""A broker of this cluster, proven by a token signed with the cluster key (never by a
header, never by a client token's claims: `tokens.verify_broker`)."""
TOKEN_KINDS = frozenset({"user", "service_account"})
"""What a bare name in `super_admins` matches (Danube's: JWT subjects); `kind:name` matches
that kind only."""


@dataclass(frozen=True, slots=True)
class Resource:
    """What a call acts on. `name`: a topic's full name (`/ns/t`), a namespace, a subject;
    empty for the cluster."""

    scope: Scope
    name: str = ""


CLUSTER = Resource(Scope.CLUSTER)


def topic(name: str) -> Resource:
    return Resource(Scope.TOPIC, name)


def namespace(name: str) -> Resource:
    return Resource(Scope.NAMESPACE, name)


def subject(name: str) -> Resource:
    return Resource(Scope.SUBJECT, name)


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    permissions: frozenset[Permission]


@dataclass(frozen=True, slots=True)
class Binding:
    """Grants `roles` to one principal on one resource (`resource_name` empty at cluster
    scope)."""

    id: str
    principal_kind: str
    principal_name: str
    roles: tuple[str, ...]
    scope: Scope
    resource_name: str = ""


@dataclass(frozen=True, slots=True)
class Rbac:
    """Everything a decision reads: the roles, the bindings and the names that bypass them."""

    roles: Mapping[str, Role] = field(default_factory=dict)
    bindings: tuple[Binding, ...] = ()
    super_admins: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str


def _namespace_key(name: str) -> str:
    return name.strip("/")


def _topic_key(name: str) -> str:
    return "/" + name.strip("/")


def _base_topic(name: str) -> str | None:
    base, marker, index = name.rpartition(PARTITION_MARKER)
    return base if marker and index.isdigit() else None


def covers(binding: Binding, resource: Resource) -> bool:
    """Whether a binding at its scope applies to `resource`: cluster bindings to everything,
    namespace bindings to the namespace and its topics, topic bindings to the topic (and its
    partitions), subject bindings to the subject."""
    scope = binding.scope
    if scope is Scope.CLUSTER:
        return True
    if resource.scope is Scope.TOPIC:
        name = _topic_key(resource.name)
        if scope is Scope.NAMESPACE:
            return name.split("/")[1] == _namespace_key(binding.resource_name)
        if scope is Scope.TOPIC:
            bound = _topic_key(binding.resource_name)
            return bound == name or bound == _base_topic(name)
        return False
    if resource.scope is Scope.NAMESPACE:
        return scope is Scope.NAMESPACE and _namespace_key(binding.resource_name) == _namespace_key(
            resource.name
        )
    if resource.scope is Scope.SUBJECT:
        return scope is Scope.SUBJECT and binding.resource_name == resource.name
    return False


def decide(
    principal: Principal, permission: Permission, resource: Resource, rbac: Rbac
) -> Decision:
    """Allowed when the principal is a super admin, or some binding of this very principal
    that covers the resource names a role holding the permission; denied otherwise (no
    binding, a role that does not exist, the anonymous principal)."""
    if principal.kind == BROKER_KIND:
        return Decision(True, "a broker of this cluster")
    if is_super_admin(principal, rbac.super_admins):
        return Decision(True, "super admin")
    for binding in matching(principal, resource, rbac.bindings):
        for role_name in binding.roles:
            role = rbac.roles.get(role_name)
            if role is not None and permission in role.permissions:
                return Decision(True, f"binding {binding.id} role {role_name}")
    where = resource.scope.value + (f" {resource.name}" if resource.name else "")
    return Decision(False, f"{permission.value} on {where} is not granted to {principal.name!r}")


def is_super_admin(principal: Principal, super_admins: frozenset[str]) -> bool:
    """`kind:name` matches that principal exactly; a bare name matches a user or a service
    account of that name (never the anonymous principal, a `broker_internal` token or a
    broker: a super admin's name alone must not lend its powers to another kind)."""
    if f"{principal.kind}:{principal.name}" in super_admins:
        return True
    return principal.kind in TOKEN_KINDS and principal.name in super_admins


def matching(
    principal: Principal, resource: Resource, bindings: Iterable[Binding]
) -> Iterable[Binding]:
    for binding in bindings:
        if (
            binding.principal_kind == principal.kind
            and binding.principal_name == principal.name
            and covers(binding, resource)
        ):
            yield binding
