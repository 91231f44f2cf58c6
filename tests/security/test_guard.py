"""The request path's guard (`danube.runtime.auth`), in process: a caller is authenticated
before its handler runs, so before any byte of the request body is read or decoded; each RPC
names the permission and resource it needs; an unlisted RPC needs ManageCluster."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import grpclib.const
import pytest
from grpclib import GRPCError
from grpclib.const import Status
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.security.tokens import mint
from danube.proto import danube as pb
from danube.proto import danube_admin as admin_pb
from danube.proto import danube_ext as ext_pb
from danube.proto import danube_schema as schema_pb
from danube.runtime.auth import (
    AUTHORIZE,
    CONSUMER_RULES,
    RULES,
    STILL_ALLOWED,
    AuthGuard,
    rbac_of,
)
from danube.values.auth_config import AuthConfig, BindingConfig, JwtConfig, RoleConfig, TlsFiles

SECRET = "guard-secret-0123456789-0123456789-abcdef"
NOW = 1_800_000_000.0
CONFIG = AuthConfig(
    mode="tls",
    tls=TlsFiles("cert.pem", "key.pem"),
    jwt=JwtConfig(secret_key=SECRET),
    roles=(
        RoleConfig("producer", ("Produce", "Lookup")),
        RoleConfig("consumer", ("Consume",)),
        RoleConfig("manager", ("ManageTopic",)),
    ),
    bindings=(
        BindingConfig("b1", "service_account", "app", ("producer",), "topic", "/default/t"),
        BindingConfig("b2", "service_account", "app", ("consumer",), "topic", "/default/c"),
        BindingConfig("b3", "service_account", "app", ("manager",), "topic", "/default/t"),
    ),
)


@dataclass
class Peer:
    certificate: dict[str, Any] | None = None

    def cert(self) -> dict[str, Any] | None:
        return self.certificate


@dataclass
class FakeStream:
    metadata: dict[str, str] = field(default_factory=dict)
    peer: Peer = field(default_factory=Peer)


def guarded_call(guard: AuthGuard, path: str, stream: FakeStream, request: Any = None) -> list[str]:
    """Runs the wrapped handler; the handler 'reads' its body (records it) and passes the
    request through the AUTHORIZE hook, as `grpc_util.recv_bounded` does."""
    events: list[str] = []

    async def handler(_: Any) -> None:
        events.append("body read")
        authorize = AUTHORIZE.get()
        assert authorize is not None
        authorize(request)
        events.append("handled")

    wrapped = guard.wrap(
        path, grpclib.const.Handler(handler, grpclib.const.Cardinality.UNARY_UNARY, None, None)
    )
    asyncio.run(wrapped.func(stream))  # type: ignore[arg-type]
    return events


def guard() -> AuthGuard:
    return AuthGuard(
        CONFIG, consumer_topic={7: "/default/c", 8: "/default/t"}.get, clock=lambda: NOW
    )


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {mint(name, SECRET, now=NOW)}"}


CREATE = "/danube.ProducerService/CreateProducer"


def test_no_credentials_are_refused_before_the_body_is_read() -> None:
    events: list[str] = []
    with pytest.raises(GRPCError) as raised:
        events = guarded_call(
            guard(), CREATE, FakeStream(), pb.ProducerRequest(topic_name="/default/t")
        )
    assert raised.value.status is Status.UNAUTHENTICATED
    assert events == []


def test_a_bad_token_is_refused_before_the_body_is_read_and_not_echoed() -> None:
    token = mint("app", "wrong-secret-0123456789-0123456789-abcdef", now=NOW)
    with pytest.raises(GRPCError) as raised:
        guarded_call(guard(), CREATE, FakeStream({"authorization": f"Bearer {token}"}))
    assert raised.value.status is Status.UNAUTHENTICATED
    assert token not in str(raised.value.message) and token[-20:] not in str(raised.value.message)


def test_the_internal_broker_header_is_no_credential() -> None:
    with pytest.raises(GRPCError) as raised:
        guarded_call(guard(), CREATE, FakeStream({"x-danube-internal-broker": "broker/1"}))
    assert raised.value.status is Status.UNAUTHENTICATED


def test_allowed_and_denied_by_topic() -> None:
    ok = guarded_call(
        guard(), CREATE, FakeStream(bearer("app")), pb.ProducerRequest(topic_name="/default/t")
    )
    assert ok == ["body read", "handled"]
    with pytest.raises(GRPCError) as raised:
        guarded_call(
            guard(), CREATE, FakeStream(bearer("app")), pb.ProducerRequest(topic_name="/default/u")
        )
    assert raised.value.status is Status.PERMISSION_DENIED


def test_receive_is_checked_on_the_consumers_topic() -> None:
    """Danube checks Consume at cluster scope here; a topic binding must be enough, and a
    consumer on a topic the caller may not consume must not be readable."""
    path = "/danube.ConsumerService/ReceiveMessages"
    assert path in CONSUMER_RULES
    stream = FakeStream(bearer("app"))
    assert guarded_call(guard(), path, stream, pb.ReceiveRequest(consumer_id=7))[-1] == "handled"
    for other in (8, 99):  # a consumer of a topic without Consume; an unknown consumer
        with pytest.raises(GRPCError) as raised:
            guarded_call(guard(), path, stream, pb.ReceiveRequest(consumer_id=other))
        assert raised.value.status is Status.PERMISSION_DENIED


def test_a_receive_stream_is_re_decided_only_when_bindings_change() -> None:
    """A server stream reads its one request, then only sends: before each delivery it asks
    STILL_ALLOWED, which decides nothing again while the roles and bindings are the same
    (one identity check), and denies once a revocation took the stream's permission away."""
    path = "/danube.ConsumerService/ReceiveMessages"
    decisions: list[tuple[str, str, bool]] = []
    checked = AuthGuard(
        CONFIG,
        consumer_topic={7: "/default/c"}.get,
        clock=lambda: NOW,
        decided=lambda *d: decisions.append(d),
    )
    outcomes: list[str] = []

    async def deliveries(_: Any) -> None:
        authorize, still_allowed = AUTHORIZE.get(), STILL_ALLOWED.get()
        assert authorize is not None and still_allowed is not None
        authorize(pb.ReceiveRequest(consumer_id=7))
        for _ in range(3):
            still_allowed()
            outcomes.append("delivered")
        assert len(decisions) == 1  # decided once, at the request
        revoked = dataclasses.replace(
            CONFIG, bindings=tuple(b for b in CONFIG.bindings if b.id != "b2")
        )
        checked.use(rbac_of(revoked))
        still_allowed()
        outcomes.append("delivered after the revocation")

    wrapped = checked.wrap(
        path, grpclib.const.Handler(deliveries, grpclib.const.Cardinality.UNARY_STREAM, None, None)
    )
    with pytest.raises(GRPCError) as raised:
        asyncio.run(wrapped.func(FakeStream(bearer("app"))))  # type: ignore[arg-type]
    assert raised.value.status is Status.PERMISSION_DENIED
    assert outcomes == ["delivered"] * 3
    assert decisions[-1] == ("topic", "Consume", False)


def test_a_dead_letter_topic_needs_produce_on_it() -> None:
    """The broker republishes exhausted messages to the dead-letter topic for the
    subscription: ManageTopic on the origin alone must not let a caller write into a topic
    it may not produce to (review finding: it could, creating the topic too)."""
    path = "/danube_admin.TopicAdmin/SetSubscriptionFailurePolicy"

    def request(target: str | None) -> admin_pb.SetSubscriptionFailurePolicyRequest:
        policy = admin_pb.SubscriptionFailurePolicy(dead_letter_topic=target)
        return admin_pb.SetSubscriptionFailurePolicyRequest(
            topic="/default/t", subscription="s", failure_policy=policy
        )

    stream = FakeStream(bearer("app"))
    assert guarded_call(guard(), path, stream, request(None))[-1] == "handled"
    assert guarded_call(guard(), path, stream, request("/default/t"))[-1] == "handled"
    with pytest.raises(GRPCError) as raised:
        guarded_call(guard(), path, stream, request("/other/victim"))
    assert raised.value.status is Status.PERMISSION_DENIED


def test_a_namespace_default_dead_letter_topic_needs_produce_on_it() -> None:
    """The same for a namespace's default failure policy (review finding: ManageNamespace on
    one namespace let a caller name any topic, which the broker then wrote into)."""
    path = "/danube_ext.PolicyAdmin/SetNamespacePolicies"
    config = dataclasses.replace(
        CONFIG,
        roles=(*CONFIG.roles, RoleConfig("ns", ("ManageNamespace",))),
        bindings=(
            *CONFIG.bindings,
            BindingConfig("b4", "service_account", "app", ("ns",), "namespace", "default"),
        ),
    )
    checked = AuthGuard(config, consumer_topic={}.get, clock=lambda: NOW)

    def request(failure: object) -> ext_pb.SetPoliciesRequest:
        policies = json.dumps({"max_producers_per_topic": 2, "failure_policy": failure})
        return ext_pb.SetPoliciesRequest(name="default", policies=policies)

    stream = FakeStream(bearer("app"))
    for allowed in (None, {"poison_policy": "drop"}, {"dead_letter_topic": "/default/t"}):
        assert guarded_call(checked, path, stream, request(allowed))[-1] == "handled"
    unparsed = ext_pb.SetPoliciesRequest(name="default", policies="{not json")
    assert guarded_call(checked, path, stream, unparsed)[-1] == "handled"  # the handler refuses
    with pytest.raises(GRPCError) as raised:
        guarded_call(checked, path, stream, request({"dead_letter_topic": "/payments/ledger"}))
    assert raised.value.status is Status.PERMISSION_DENIED


def test_an_unlisted_rpc_needs_manage_cluster() -> None:
    with pytest.raises(GRPCError) as raised:
        guarded_call(
            guard(), "/danube_admin.SecurityAdmin/ListRoles", FakeStream(bearer("app")), object()
        )
    assert raised.value.status is Status.PERMISSION_DENIED
    assert "ManageCluster" in str(raised.value.message)


def test_a_client_certificate_authenticates() -> None:
    cert = {"subject": ((("commonName", "app"),),)}
    stream = FakeStream(peer=Peer(cert))
    request = pb.ProducerRequest(topic_name="/default/t")
    assert guarded_call(guard(), CREATE, stream, request)[-1] == "handled"


def _paths() -> set[str]:
    bases = [
        pb.ProducerServiceBase, pb.ConsumerServiceBase, pb.DiscoveryBase, pb.HealthCheckBase,
        schema_pb.SchemaRegistryBase, admin_pb.BrokerAdminBase, admin_pb.NamespaceAdminBase,
        admin_pb.TopicAdminBase, ext_pb.ConsumerExtBase, ext_pb.ProducerExtBase,
        ext_pb.PolicyAdminBase, ext_pb.ReplicationAdminBase,
    ]  # fmt: skip
    return {path for base in bases for path in base().__mapping__()}


def test_every_rule_names_a_real_rpc_and_every_client_rpc_has_a_rule() -> None:
    """A misspelt path in the table would leave its RPC at the default (ManageCluster) and
    silently lock out clients; a client-port RPC without a rule would do the same."""
    real = _paths()
    assert set(RULES) | CONSUMER_RULES <= real
    client_port = {p for p in real if p.split(".")[0] in ("/danube",) or "Ext/" in p}
    missing = client_port - set(RULES) - CONSUMER_RULES
    assert missing == set()


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1"))))
def test_any_authorization_header_is_refused_cleanly(value: str) -> None:
    """Whatever the header says (random text, `Bearer` plus junk), the answer is
    UNAUTHENTICATED with a short reason that does not quote it, and no handler runs."""
    for header in (value, f"Bearer {value}"):
        with pytest.raises(GRPCError) as raised:
            guarded_call(guard(), CREATE, FakeStream({"authorization": header}))
        assert raised.value.status is Status.UNAUTHENTICATED
        message = str(raised.value.message)
        assert len(message) < 200
        if len(value.strip()) >= 8:
            assert value.strip() not in message
