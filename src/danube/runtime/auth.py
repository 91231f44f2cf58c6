"""Authentication and authorization on the gRPC ports (spec/security.md).

One place: `AuthGuard.wrap` around every handler of a `grpc_util.Server`. It runs when the
request's headers have arrived and *before the handler reads the body*: it reads
`authorization: Bearer <token>` (or the verified client certificate under mutual TLS), and
refuses UNAUTHENTICATED with a reason that never quotes the token. An unauthenticated caller
therefore never makes the broker buffer or decode a request body, compile a schema, or touch
a topic. Danube's `x-danube-internal-broker` header is ignored: it grants nothing. Another
broker of the cluster proves itself with a token signed by the cluster key in
`BROKER_TOKEN_HEADER` (`danube.runtime.peers` sends it); a wrong one is UNAUTHENTICATED.

A call authenticated by a token lives no longer than the token: a stream still open when the
token expires (`exp` plus the leeway, what `tokens.verify_until` says) is ended with
UNAUTHENTICATED then (`wrap`).

Authorization needs the request (its topic, namespace, subject), so it runs right after the
body is decoded and before the handler acts on it: `grpc_util.recv_bounded` calls the
`AUTHORIZE` hook this module sets for the call. `RULES` maps each RPC to the permission and
resource it needs; an RPC missing from the table needs ManageCluster on the cluster, so a new
RPC is closed until someone decides otherwise. The decision is `machines.security.rbac.decide`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import grpclib.const
import grpclib.server
from grpclib import GRPCError
from grpclib.const import Status

from danube.machines.security import rbac
from danube.machines.security.rbac import CLUSTER, Permission, Principal, Rbac, Resource
from danube.machines.security.tokens import (
    TokenRejected,
    Verifier,
    bearer,
    broker_certificate,
    broker_verifier,
    certificate_principal,
    verify_broker,
    verify_until,
)
from danube.values import bounded_json
from danube.values.auth_config import AuthConfig
from danube.values.errors import DanubeError

log = logging.getLogger("danube.runtime")

AUTHORIZE: contextvars.ContextVar[Callable[[Any], None] | None] = contextvars.ContextVar(
    "authorize", default=None
)
"""Set for a call on a port with authentication: checks each decoded request."""
STILL_ALLOWED: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "still_allowed", default=None
)
"""Set for a call on a port with authentication: a server stream calls it before each
delivery (`streams.serve_consumer`); PERMISSION_DENIED once a changed binding denies what the
call's request was allowed."""
PRINCIPAL: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "principal", default=rbac.ANONYMOUS
)

BROKER_TOKEN_HEADER = "x-danube-broker-token"
"""Where a broker of the cluster puts its token (signed with `auth.cluster_key`)."""
TOKEN_CACHE_SECONDS = 30.0
"""A verified token is trusted this long (and never past its exp), as Danube caches it."""
TOKEN_CACHE_ENTRIES = 4096

P = Permission
Rule = tuple[Permission, Callable[[Any], Resource]] | None
"""What an RPC needs; None: authentication only (the health check)."""


def _topic(field: str) -> Callable[[Any], Resource]:
    return lambda request: rbac.topic(str(getattr(request, field)))


def _policy_target(request: Any) -> Resource:
    name = str(request.name)
    return rbac.topic(name) if name.startswith("/") else rbac.namespace(name)


def _subject(request: Any) -> Resource:
    return rbac.subject(str(request.subject))


def _namespace(request: Any) -> Resource:
    return rbac.namespace(str(request.name))


def _cluster(_: Any) -> Resource:
    return CLUSTER


RULES: dict[str, Rule] = {
    "/danube.ProducerService/CreateProducer": (P.PRODUCE, _topic("topic_name")),
    "/danube.ProducerService/SendMessage": (P.PRODUCE, _topic("topic_name")),
    "/danube.ConsumerService/Subscribe": (P.CONSUME, _topic("topic_name")),
    "/danube.ConsumerService/Ack": (P.CONSUME, _topic("topic_name")),
    "/danube.ConsumerService/Nack": (P.CONSUME, _topic("topic_name")),
    "/danube.Discovery/TopicLookup": (P.LOOKUP, _topic("topic")),
    "/danube.Discovery/TopicPartitions": (P.LOOKUP, _topic("topic")),
    "/danube.HealthCheck/HealthCheck": None,
    "/danube_ext.ConsumerExt/SubscribeAt": (P.CONSUME, lambda r: rbac.topic(r.request.topic_name)),
    "/danube_ext.ConsumerExt/AckBatch": (P.CONSUME, _topic("topic_name")),
    "/danube_ext.ProducerExt/PublishBatches": (P.PRODUCE, _topic("topic_name")),
    # schema registry: writes need ManageSchema on the subject (Danube), reads Lookup (ours)
    "/danube_schema.SchemaRegistry/RegisterSchema": (P.MANAGE_SCHEMA, _subject),
    "/danube_schema.SchemaRegistry/DeleteSchemaVersion": (P.MANAGE_SCHEMA, _subject),
    "/danube_schema.SchemaRegistry/SetCompatibilityMode": (P.MANAGE_SCHEMA, _subject),
    "/danube_schema.SchemaRegistry/GetSchema": (P.LOOKUP, _cluster),
    "/danube_schema.SchemaRegistry/GetLatestSchema": (P.LOOKUP, _subject),
    "/danube_schema.SchemaRegistry/ListVersions": (P.LOOKUP, _subject),
    "/danube_schema.SchemaRegistry/CheckCompatibility": (P.LOOKUP, _subject),
    "/danube_schema.SchemaRegistry/ListSubjects": (P.MANAGE_SCHEMA, _cluster),
    "/danube_schema.SchemaRegistry/ConfigureTopicSchema": (P.MANAGE_SCHEMA, _topic("topic_name")),
    "/danube_schema.SchemaRegistry/UpdateTopicValidationPolicy": (
        P.MANAGE_SCHEMA,
        _topic("topic_name"),
    ),
    "/danube_schema.SchemaRegistry/GetTopicSchemaConfig": (P.LOOKUP, _topic("topic_name")),
    # admin port
    "/danube_admin.BrokerAdmin/ListBrokers": (P.MANAGE_BROKER, _cluster),
    "/danube_admin.BrokerAdmin/GetLeaderBroker": (P.MANAGE_BROKER, _cluster),
    "/danube_admin.BrokerAdmin/ListNamespaces": (P.MANAGE_NAMESPACE, _cluster),
    "/danube_admin.BrokerAdmin/UnloadBroker": (P.MANAGE_BROKER, _cluster),
    "/danube_admin.BrokerAdmin/ActivateBroker": (P.MANAGE_BROKER, _cluster),
    "/danube_admin.NamespaceAdmin/GetNamespaceTopics": (P.MANAGE_NAMESPACE, _namespace),
    "/danube_admin.NamespaceAdmin/GetNamespacePolicies": (P.MANAGE_NAMESPACE, _namespace),
    "/danube_admin.NamespaceAdmin/CreateNamespace": (P.MANAGE_NAMESPACE, _namespace),
    "/danube_admin.NamespaceAdmin/DeleteNamespace": (P.MANAGE_NAMESPACE, _namespace),
    "/danube_admin.TopicAdmin/ListNamespaceTopics": (P.MANAGE_TOPIC, _namespace),
    "/danube_admin.TopicAdmin/ListBrokerTopics": (P.MANAGE_TOPIC, _cluster),
    "/danube_admin.TopicAdmin/CreatePartitionedTopic": (P.MANAGE_TOPIC, _topic("base_name")),
    "/danube_ext.PolicyAdmin/SetNamespacePolicies": (P.MANAGE_NAMESPACE, _namespace),
    "/danube_ext.PolicyAdmin/SetReplicationFactor": (P.MANAGE_TOPIC, _policy_target),
    "/danube_ext.PolicyAdmin/GetReplicationFactor": (P.MANAGE_TOPIC, _policy_target),
    "/danube_ext.ReplicationAdmin/TopicReplication": (P.MANAGE_TOPIC, _topic("name")),
}
for _method in ("CreateTopic", "DeleteTopic", "UnloadTopic", "ListSubscriptions", "DescribeTopic"):
    RULES[f"/danube_admin.TopicAdmin/{_method}"] = (P.MANAGE_TOPIC, _topic("name"))
for _method in (
    "Unsubscribe", "SetSubscriptionFailurePolicy", "GetSubscriptionFailurePolicy",
    "SetSubscriptionDispatchConfig", "GetSubscriptionDispatchConfig",
):  # fmt: skip
    RULES[f"/danube_admin.TopicAdmin/{_method}"] = (P.MANAGE_TOPIC, _topic("topic"))
for _method in ("SetTopicPolicies", "GetTopicPolicies", "ClearTopicPolicies"):
    RULES[f"/danube_ext.PolicyAdmin/{_method}"] = (P.MANAGE_TOPIC, _topic("name"))
for _method in ("ListBlocked", "ResolveBlocked", "ClearSubscriptionFailurePolicy"):
    RULES[f"/danube_ext.PolicyAdmin/{_method}"] = (P.MANAGE_TOPIC, _topic("topic"))
DEAD_LETTER_RULE = "/danube_admin.TopicAdmin/SetSubscriptionFailurePolicy"
"""Setting a dead-letter topic also needs Produce on it: the broker republishes there on the
subscription's behalf, so a caller could otherwise write into a topic it may not produce to."""
NAMESPACE_POLICIES_RULE = "/danube_ext.PolicyAdmin/SetNamespacePolicies"
"""The same for a namespace's default failure policy naming a dead-letter topic."""


def _namespace_dead_letter(request: Any) -> str | None:
    """The dead-letter topic a SetNamespacePolicies request's default failure policy names;
    None when it names none or the policies do not parse (the handler refuses those)."""
    try:
        value = bounded_json.loads(str(request.policies), "policies")
    except DanubeError:
        return None
    failure = value.get("failure_policy") if isinstance(value, dict) else None
    target = failure.get("dead_letter_topic") if isinstance(failure, dict) else None
    return target if isinstance(target, str) and target else None


CONSUMER_RULES = {
    "/danube.ConsumerService/ReceiveMessages",
    "/danube_ext.ConsumerExt/ReceiveBatches",
}
"""Receive calls name a consumer id: checked as Consume on that consumer's topic (Danube
checks cluster scope); an unknown consumer id needs Consume on the cluster."""
DEFAULT_RULE: tuple[Permission, Callable[[Any], Resource]] = (P.MANAGE_CLUSTER, _cluster)
"""Everything else (ClusterAdmin, SecurityAdmin, balance, inter-broker replication)."""


def verifier_of(config: AuthConfig) -> Verifier | None:
    jwt = config.jwt
    if jwt is None:
        return None
    key = jwt.secret_key if jwt.algorithm == "HS256" else None
    if key is None:
        assert jwt.public_key_file is not None
        key = Path(jwt.public_key_file).read_text()
    return Verifier(jwt.algorithm, key, jwt.issuer, jwt.leeway_seconds)


def rbac_of(config: AuthConfig) -> Rbac:
    roles = {
        role.name: rbac.Role(role.name, frozenset(Permission.parse(p) for p in role.permissions))
        for role in config.roles
    }
    bindings = tuple(
        rbac.Binding(
            b.id,
            b.principal_type,
            b.principal_name,
            b.roles,
            rbac.Scope.parse(b.scope),
            b.resource_name,
        )
        for b in config.bindings
    )
    return Rbac(roles, bindings, frozenset(config.super_admins))


Wrapper = Callable[[str, grpclib.const.Handler], grpclib.const.Handler]
"""What `grpc_util.Server` puts around each handler (`AuthGuard.wrap`)."""
Decided = Callable[[str, str, bool], None]
"""Told (resource scope, permission, allowed) for each decision (metrics)."""


class AuthGuard:
    """Authenticates every call of a port and authorizes each request it decodes."""

    def __init__(
        self,
        config: AuthConfig,
        *,
        consumer_topic: Callable[[int], str | None] = lambda _: None,
        decided: Decided | None = None,
        refused: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.verifier = verifier_of(config)
        self.brokers = broker_verifier(config.cluster_key) if config.cluster_key else None
        self.broker_certificates = frozenset(config.broker_certificates)
        self.rbac = rbac_of(config)
        self.consumer_topic = consumer_topic
        self.decided = decided
        self.refused = refused
        self.clock = clock
        self._tokens: dict[str, tuple[Principal, float, float]] = {}
        """token -> (principal, trusted until, valid until)."""

    def use(self, state: Rbac) -> None:
        """Roles and bindings changed (`SecurityAdmin`): later decisions read the new ones."""
        self.rbac = state

    def wrap(self, path: str, handler: grpclib.const.Handler) -> grpclib.const.Handler:
        func = handler.func
        rule = RULES.get(path, DEFAULT_RULE)

        streaming = handler.cardinality is not grpclib.const.Cardinality.UNARY_UNARY

        async def call(stream: grpclib.server.Stream) -> None:
            principal, valid_until = self.authenticate_until(stream)
            PRINCIPAL.set(principal)
            authorize, still_allowed = self._authorizer(path, rule, principal)
            AUTHORIZE.set(authorize)
            STILL_ALLOWED.set(still_allowed)
            if not streaming or valid_until == math.inf or principal.kind == rbac.BROKER_KIND:
                # a broker's replication stream is checked when it opens and lives on
                await func(stream)
                return
            # A stream ends when its token does (a unary call is over long before).
            limit = asyncio.timeout(max(0.0, valid_until - self.clock()))
            try:
                async with limit:
                    await func(stream)
            except TimeoutError:
                if not limit.expired():
                    raise
                self._refuse("expired", "token expired during the call")

        return handler._replace(func=call)

    # -- authentication ------------------------------------------------------------------

    def authenticate(self, stream: grpclib.server.Stream) -> Principal:
        return self.authenticate_until(stream)[0]

    def authenticate_until(self, stream: grpclib.server.Stream) -> tuple[Principal, float]:
        """Who the call comes from and until when (a token's expiry plus leeway; a
        certificate: for the connection's life, `math.inf`)."""
        metadata = stream.metadata
        if metadata is not None and (broker := metadata.get(BROKER_TOKEN_HEADER)) is not None:
            try:
                return self._token_principal(str(broker), self.brokers, verify_broker)
            except TokenRejected as error:
                self._refuse("invalid", f"broker token: {error}")
        header = metadata.get("authorization") if metadata is not None else None
        if header is not None:
            try:
                return self._token_principal(bearer(str(header)), self.verifier, verify_until)
            except TokenRejected as error:
                self._refuse("invalid", str(error))
        cert = stream.peer.cert() if stream.peer is not None else None
        broker = broker_certificate(cert, self.broker_certificates)
        if broker is not None:  # a broker's certificate (by common name or SAN entry)
            return Principal(rbac.BROKER_KIND, broker), math.inf
        principal = certificate_principal(cert)
        if principal is not None:
            return principal, math.inf
        self._refuse("missing", "no credentials: send 'authorization: Bearer <token>'")

    def _token_principal(
        self,
        token: str,
        verifier: Verifier | None,
        verify: Callable[[str, Verifier, float], tuple[Principal, float]],
    ) -> tuple[Principal, float]:
        if verifier is None:
            what = "broker tokens" if verify is verify_broker else "tokens"
            raise TokenRejected(f"this broker accepts no {what}")
        now = self.clock()
        key = token if verify is verify_until else "broker:" + token  # one cache, two kinds
        cached = self._tokens.get(key)
        if cached is not None and now < cached[1]:
            return cached[0], cached[2]
        principal, valid_until = verify(token, verifier, now)
        if len(self._tokens) >= TOKEN_CACHE_ENTRIES:
            self._tokens.clear()
        self._tokens[key] = (principal, min(valid_until, now + TOKEN_CACHE_SECONDS), valid_until)
        return principal, valid_until

    def _refuse(self, kind: str, reason: str) -> NoReturn:
        if self.refused is not None:
            self.refused(kind)
        raise GRPCError(Status.UNAUTHENTICATED, f"authentication failed: {reason}")

    def scrape_refused(self, authorization: str | None, cert: Any) -> tuple[int, str] | None:
        """`/metrics` on a broker with authentication (HTTP, `metrics_http`): a bearer token or
        a verified client certificate whose principal has Lookup on the cluster (the series
        name topics and their rates: what Lookup on the cluster reveals anyway). (401 or 403,
        reason) when refused, the token never quoted; None when allowed."""
        try:
            if authorization is not None:
                token = bearer(authorization)
                principal = self._token_principal(token, self.verifier, verify_until)[0]
            elif (principal := certificate_principal(cert)) is None:
                return 401, "no credentials: send 'Authorization: Bearer <token>'"
        except TokenRejected as error:
            return 401, f"authentication failed: {error}"
        decision = rbac.decide(principal, P.LOOKUP, CLUSTER, self.rbac)
        return None if decision.allowed else (403, decision.reason)

    # -- authorization -------------------------------------------------------------------

    def _authorizer(
        self, path: str, rule: Rule, principal: Principal
    ) -> tuple[Callable[[Any], None], Callable[[], None]]:
        """The call's `authorize` (each decoded request) and its `still_allowed` (a server
        stream's next delivery: the last request's decisions again, re-decided only when the
        roles and bindings changed since, so a revocation ends a stream that reads nothing
        more from its client)."""
        decided: dict[tuple[Permission, Resource], bool] = {}
        decided_under = [self.rbac]
        last: list[tuple[Permission, Resource]] = []

        def check(permission: Permission, resource: Resource) -> None:
            last.append((permission, resource))
            self._check(principal, permission, resource, decided)

        def authorize(request: Any) -> None:
            if self.rbac is not decided_under[0]:  # roles or bindings changed: decide again
                decided.clear()
                decided_under[0] = self.rbac
            last.clear()
            if path in CONSUMER_RULES:
                topic = self.consumer_topic(int(request.consumer_id))
                permission = P.CONSUME
                resource = rbac.topic(topic) if topic is not None else CLUSTER
            elif rule is None:
                return
            else:
                permission, resource = rule[0], rule[1](request)
                target = None
                if path == DEAD_LETTER_RULE:
                    target = getattr(request.failure_policy, "dead_letter_topic", None)
                elif path == NAMESPACE_POLICIES_RULE:
                    target = _namespace_dead_letter(request)
                if target:  # the broker will publish there for these subscriptions
                    check(P.PRODUCE, rbac.topic(target))
            check(permission, resource)

        def still_allowed() -> None:
            if self.rbac is decided_under[0]:  # the same roles and bindings: the same answer
                return
            decided.clear()
            decided_under[0] = self.rbac
            for permission, resource in last:
                self._check(principal, permission, resource, decided)

        return authorize, still_allowed

    def _check(
        self,
        principal: Principal,
        permission: Permission,
        resource: Resource,
        decided: dict[tuple[Permission, Resource], bool],
    ) -> None:
        """One decision, remembered for the call while the roles and bindings stay the same
        (a stream's messages mostly name one topic; a revocation applies from the stream's
        next message); PERMISSION_DENIED when it denies."""
        key = (permission, resource)
        allowed = decided.get(key)
        if allowed is None:
            decision = rbac.decide(principal, permission, resource, self.rbac)
            allowed = decided[key] = decision.allowed
            if self.decided is not None:
                self.decided(resource.scope.value, permission.value, allowed)
            if not allowed:
                raise GRPCError(Status.PERMISSION_DENIED, decision.reason)
        elif not allowed:
            where = resource.name or resource.scope.value
            raise GRPCError(Status.PERMISSION_DENIED, f"{permission.value} on {where}")
