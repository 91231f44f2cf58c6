"""Security between a cluster's brokers and the review's leftovers (issue 25, part 2), in
process: a broker proves itself with a token signed by the cluster key (no header does it);
a super admin entry names its principal's kind too; a stream outliving its token is ended
UNAUTHENTICATED; a broker's view of `/auth/` never goes back to an older state."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import grpclib.const
import pytest
from grpclib import GRPCError
from grpclib.const import Status

from danube.machines.security import rbac
from danube.machines.security.rbac import CLUSTER, Permission, Principal, Rbac, decide
from danube.machines.security.records import AuthView
from danube.machines.security.tokens import (
    TokenRejected,
    broker_verifier,
    mint,
    mint_broker,
    verify_broker,
    verify_until,
)
from danube.proto import danube as pb
from danube.runtime.auth import AUTHORIZE, BROKER_TOKEN_HEADER, AuthGuard
from danube.runtime.peers import PeerAccess
from danube.values.errors import ConfigError
from tests.security.test_guard import CONFIG, NOW, SECRET, FakeStream, Peer, bearer, guarded_call

CLUSTER_KEY = "cluster-key-0123456789-0123456789-abcdef"
SECURED = dataclasses.replace(CONFIG, cluster_key=CLUSTER_KEY)
UNLOAD = "/danube_admin.BrokerAdmin/UnloadBroker"


def guard(now: float = NOW, config: Any = SECURED) -> AuthGuard:
    return AuthGuard(config, clock=lambda: now)


def broker_headers(key: str = CLUSTER_KEY, now: float = NOW) -> dict[str, str]:
    return {BROKER_TOKEN_HEADER: mint_broker("broker-1", key, now)}


def test_a_broker_token_makes_a_broker_that_may_do_what_brokers_ask() -> None:
    assert guarded_call(guard(), UNLOAD, FakeStream(broker_headers())) == ["body read", "handled"]


@pytest.mark.parametrize(
    "headers",
    [
        {"x-danube-internal-broker": "broker/1"},  # Danube's header: no credential at all
        {BROKER_TOKEN_HEADER: "garbage"},
        {BROKER_TOKEN_HEADER: mint_broker("broker-1", SECRET, NOW)},  # the clients' key
        {BROKER_TOKEN_HEADER: mint("broker-1", CLUSTER_KEY, now=NOW)},  # wrong issuer
        {BROKER_TOKEN_HEADER: mint_broker("broker-1", CLUSTER_KEY, NOW - 3600)},  # expired
    ],
    ids=["danube-header", "garbage", "client-key", "client-issuer", "expired"],
)
def test_nothing_but_a_cluster_signed_token_is_a_broker(headers: dict[str, str]) -> None:
    events: list[str] = []
    with pytest.raises(GRPCError) as raised:
        events = guarded_call(guard(), UNLOAD, FakeStream(headers))
    assert raised.value.status is Status.UNAUTHENTICATED
    assert events == []


def test_a_broker_header_with_a_valid_client_token_gains_nothing() -> None:
    """A client with a good token adds Danube's header, or claims to be a broker: it stays
    itself, and itself may not unload brokers."""
    claims_broker = mint("app", SECRET, now=NOW, principal_type="broker_internal")
    for headers in (
        {**bearer("app"), "x-danube-internal-broker": "broker/1"},
        {"authorization": f"Bearer {claims_broker}"},
    ):
        with pytest.raises(GRPCError) as raised:
            guarded_call(guard(), UNLOAD, FakeStream(headers))
        assert raised.value.status is Status.PERMISSION_DENIED


def test_a_broker_without_a_cluster_key_accepts_no_broker_token() -> None:
    with pytest.raises(GRPCError) as raised:
        guarded_call(guard(config=CONFIG), UNLOAD, FakeStream(broker_headers()))
    assert raised.value.status is Status.UNAUTHENTICATED


def test_broker_and_client_tokens_do_not_pass_for_each_other() -> None:
    brokers = broker_verifier(CLUSTER_KEY)
    principal, _ = verify_broker(mint_broker("broker-7", CLUSTER_KEY, NOW), brokers, NOW)
    assert principal == Principal(rbac.BROKER_KIND, "broker-7")
    clients = dataclasses.replace(brokers, issuer=None)
    with pytest.raises(TokenRejected):  # signed with the cluster key: not a client's token
        verify_until(mint_broker("broker-7", CLUSTER_KEY, NOW), broker_verifier(SECRET), NOW)
    # and a broker token read as a client token never yields a broker principal
    assert verify_until(mint_broker("b", CLUSTER_KEY, NOW), clients, NOW)[0].kind != "broker"


@pytest.mark.parametrize(
    ("principal", "entries", "allowed"),
    [
        (Principal("service_account", "root"), {"root"}, True),
        (Principal("user", "root"), {"root"}, True),
        (Principal("broker_internal", "root"), {"root"}, False),
        (Principal("anonymous", "root"), {"root"}, False),
        (Principal("user", "root"), {"service_account:root"}, False),
        (Principal("service_account", "root"), {"service_account:root"}, True),
        (Principal("broker_internal", "root"), {"broker_internal:root"}, True),
        (Principal(rbac.BROKER_KIND, "broker-1"), set(), True),
        (Principal("service_account", "broker-1"), set(), False),
    ],
)
def test_super_admins_and_brokers_by_kind(
    principal: Principal, entries: set[str], allowed: bool
) -> None:
    state = Rbac({}, (), frozenset(entries))
    assert decide(principal, Permission.MANAGE_CLUSTER, CLUSTER, state).allowed is allowed


def _stream_call(guard: AuthGuard, stream: FakeStream, seconds: float) -> None:
    async def handler(_: Any) -> None:
        assert AUTHORIZE.get() is not None
        await asyncio.sleep(seconds)

    wrapped = guard.wrap(
        "/danube.ConsumerService/ReceiveMessages",
        grpclib.const.Handler(handler, grpclib.const.Cardinality.UNARY_STREAM, None, None),
    )
    asyncio.run(wrapped.func(stream))  # type: ignore[arg-type]


def test_a_stream_outliving_its_token_is_ended_unauthenticated() -> None:
    leeway = SECURED.jwt.leeway_seconds if SECURED.jwt else 0
    token = mint("app", SECRET, now=NOW, ttl_s=1)
    # 0.2 s of the token left (its exp plus the leeway) when the call arrives
    almost = guard(now=NOW + 1 + leeway - 0.2)
    with pytest.raises(GRPCError) as raised:
        _stream_call(almost, FakeStream({"authorization": f"Bearer {token}"}), 5.0)
    assert raised.value.status is Status.UNAUTHENTICATED
    assert "expired" in str(raised.value.message)
    # the same stream ending before the token does is untouched
    _stream_call(almost, FakeStream({"authorization": f"Bearer {token}"}), 0.05)
    # a broker's stream (replication) is checked when it opens and then lives on
    near = {BROKER_TOKEN_HEADER: mint_broker("b", CLUSTER_KEY, NOW - 300 + 1)}
    _stream_call(guard(now=NOW + 0.8 + leeway), FakeStream(near), 0.5)


def test_the_auth_view_never_goes_back() -> None:
    view = AuthView()
    assert view.load([("/auth/roles/a", {"n": 1}, 5), ("/auth/roles/b", {"n": 2}, 7)]) == 7
    assert not view.apply("put", "/auth/roles/a", {"n": 0}, 6)  # older than the read
    assert view.apply("delete", "/auth/roles/b", None, 8)
    assert not view.apply("put", "/auth/roles/b", {"n": 2}, 8)  # replayed: stays deleted
    assert view.apply("put", "/auth/roles/c", {"n": 3}, 9)
    assert view.entries == {"/auth/roles/a": {"n": 1}, "/auth/roles/c": {"n": 3}}
    assert view.load([("/auth/roles/a", {"n": 1}, 5)]) == 9  # a re-read never lowers it


def test_a_broker_sends_a_fresh_token_and_no_header_without_a_key() -> None:
    clock = [NOW]
    peers = PeerAccess(name="broker-3", cluster_key=CLUSTER_KEY, clock=lambda: clock[0])
    first = peers.metadata()[BROKER_TOKEN_HEADER]
    assert peers.metadata()[BROKER_TOKEN_HEADER] == first
    clock[0] += 200  # past half its life: a new one
    second = peers.metadata()[BROKER_TOKEN_HEADER]
    assert second != first
    principal, until = verify_broker(second, broker_verifier(CLUSTER_KEY), clock[0])
    assert principal.name == "broker-3" and until > clock[0] + 100
    assert PeerAccess(name="x").metadata() == {}


def test_a_revocation_applies_to_the_next_message_of_an_open_stream() -> None:
    """A stream's decisions are remembered while the RBAC stays the same: replaced (a
    binding deleted on any broker of the cluster), the next message is decided again."""
    checks = guard()
    wrapped_calls: list[str] = []

    async def handler(_: Any) -> None:
        authorize = AUTHORIZE.get()
        assert authorize is not None
        request = pb.ProducerRequest(topic_name="/default/t")
        authorize(request)
        wrapped_calls.append("first allowed")
        checks.use(dataclasses.replace(checks.rbac, bindings=()))  # the binding is gone
        authorize(request)
        wrapped_calls.append("second allowed")

    wrapped = checks.wrap(
        "/danube.ProducerService/CreateProducer",
        grpclib.const.Handler(handler, grpclib.const.Cardinality.STREAM_STREAM, None, None),
    )
    with pytest.raises(GRPCError) as raised:
        asyncio.run(wrapped.func(FakeStream(bearer("app"))))  # type: ignore[arg-type]
    assert raised.value.status is Status.PERMISSION_DENIED
    assert wrapped_calls == ["first allowed"]


def _certificate(name: str) -> dict[str, Any]:
    return {"subject": ((("commonName", name),),)}


def test_a_listed_broker_certificate_makes_a_broker_and_only_that() -> None:
    by_certificate = dataclasses.replace(CONFIG, broker_certificates=("broker.cluster.test",))
    checks = guard(config=by_certificate)
    broker = FakeStream(peer=Peer(_certificate("broker.cluster.test")))
    assert guarded_call(checks, UNLOAD, broker) == ["body read", "handled"]
    for stream in (
        FakeStream(peer=Peer(_certificate("app"))),  # a client's certificate: itself
        FakeStream(bearer("broker.cluster.test")),  # a token naming it: a service account
    ):
        with pytest.raises(GRPCError) as raised:
            guarded_call(checks, UNLOAD, stream)
        assert raised.value.status is Status.PERMISSION_DENIED


def test_a_broker_certificate_may_be_named_by_a_san_uri() -> None:
    """A SAN URI (SPIFFE-style) names the brokers apart from anything a client certificate
    carries: a certificate with it is a broker whatever its common name; one with the same
    common name but without the URI is not."""
    spiffe = "uri:spiffe://cluster.test/broker"
    checks = guard(config=dataclasses.replace(CONFIG, broker_certificates=(spiffe,)))
    with_uri = {
        **_certificate("anything"),
        "subjectAltName": (("URI", "spiffe://cluster.test/broker"),),
    }
    broker = FakeStream(peer=Peer(with_uri))
    assert guarded_call(checks, UNLOAD, broker) == ["body read", "handled"]
    with pytest.raises(GRPCError) as raised:
        guarded_call(checks, UNLOAD, FakeStream(peer=Peer(_certificate("anything"))))
    assert raised.value.status is Status.PERMISSION_DENIED


def test_cluster_mode_takes_a_key_or_broker_certificates_with_a_ca() -> None:
    tls_with_ca = dataclasses.replace(CONFIG.tls, ca_file="ca.pem") if CONFIG.tls else None
    dataclasses.replace(CONFIG, broker_certificates=("b",), tls=tls_with_ca).check_cluster()
    dataclasses.replace(CONFIG, cluster_key=CLUSTER_KEY).check_cluster()
    for config in (CONFIG, dataclasses.replace(CONFIG, broker_certificates=("b",))):
        with pytest.raises(ConfigError):
            config.check_cluster()
