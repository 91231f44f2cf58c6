"""Bearer tokens (`danube.machines.security.tokens`): Danube's claims accepted, and each way a
token can be wrong refused with a reason that never quotes it; hypothesis feeds the parser
random and malformed tokens."""

from __future__ import annotations

import base64
import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.security.rbac import Principal
from danube.machines.security.tokens import (
    MAX_TOKEN_BYTES,
    TokenRejected,
    Verifier,
    bearer,
    broker_certificate,
    certificate_principal,
    mint,
    verify,
)

NOW = 1_800_000_000.0
SECRET = "a-shared-secret-of-enough-length-for-hs256!"
HS = Verifier("HS256", SECRET, issuer="danube-auth")


def _pem_pair(private: object) -> tuple[str, str]:
    private_pem = private.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        private.public_key()  # type: ignore[attr-defined]
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


RSA_PRIVATE, RSA_PUBLIC = _pem_pair(rsa.generate_private_key(public_exponent=65537, key_size=2048))
ED_PRIVATE, ED_PUBLIC = _pem_pair(ed25519.Ed25519PrivateKey.generate())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_minted_token_names_its_principal() -> None:
    token = mint("app", SECRET, now=NOW)
    assert verify(token, HS, NOW) == Principal("service_account", "app")
    user = mint("alice", SECRET, now=NOW, principal_type="user")
    assert verify(user, HS, NOW) == Principal("user", "alice")


def test_danube_claims_map_like_danube() -> None:
    """Danube's own token (no iat): an unknown principal_type is a service account."""
    claims = {"iss": "danube-auth", "sub": "x", "exp": int(NOW) + 60,
              "principal_type": "robot", "principal_name": "x"}  # fmt: skip
    token = jwt.encode(claims, SECRET, algorithm="HS256")
    assert verify(token, HS, NOW) == Principal("service_account", "x")


@pytest.mark.parametrize("algorithm", ["RS256", "EdDSA"])
def test_public_key_algorithms(algorithm: str) -> None:
    private, public = (RSA_PRIVATE, RSA_PUBLIC) if algorithm == "RS256" else (ED_PRIVATE, ED_PUBLIC)
    token = mint("app", private, now=NOW, algorithm=algorithm)
    assert verify(token, Verifier(algorithm, public), NOW).name == "app"


def test_expiry_with_leeway() -> None:
    token = mint("app", SECRET, now=NOW, ttl_s=100)
    assert verify(token, HS, NOW + 100 + HS.leeway_s).name == "app"
    with pytest.raises(TokenRejected, match="expired"):
        verify(token, HS, NOW + 101 + HS.leeway_s)


def test_a_token_from_the_future_is_refused() -> None:
    token = mint("app", SECRET, now=NOW + 3600)
    with pytest.raises(TokenRejected, match="future"):
        verify(token, HS, NOW)
    assert verify(mint("app", SECRET, now=NOW + HS.leeway_s), HS, NOW).name == "app"


def test_the_issuer_is_checked() -> None:
    token = mint("app", SECRET, now=NOW, issuer="someone-else")
    with pytest.raises(TokenRejected, match="issuer"):
        verify(token, HS, NOW)
    assert verify(token, Verifier("HS256", SECRET), NOW).name == "app"  # no issuer configured


def test_no_exp_is_refused() -> None:
    token = jwt.encode({"sub": "app", "iss": "danube-auth"}, SECRET, algorithm="HS256")
    with pytest.raises(TokenRejected, match="exp"):
        verify(token, HS, NOW)


def test_a_wrong_secret_is_refused() -> None:
    token = mint("app", "another-secret-of-enough-length-for-hs256!!", now=NOW)
    with pytest.raises(TokenRejected, match="signature"):
        verify(token, HS, NOW)


def test_algorithm_none_is_refused() -> None:
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    body = _b64(json.dumps({"sub": "app", "exp": int(NOW) + 60, "iss": "danube-auth"}).encode())
    with pytest.raises(TokenRejected):
        verify(f"{header}.{body}.", HS, NOW)


def test_algorithm_confusion_is_refused() -> None:
    """An HS256 token whose "secret" is the broker's RS256 public key: a broker that let the
    token pick its algorithm would accept it."""
    claims = {"sub": "app", "exp": int(NOW) + 60, "iss": "danube-auth"}
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims).encode())
    import hashlib
    import hmac

    signature = hmac.new(RSA_PUBLIC.encode(), f"{header}.{body}".encode(), hashlib.sha256)
    forged = f"{header}.{body}.{_b64(signature.digest())}"
    with pytest.raises(TokenRejected, match="algorithm"):
        verify(forged, Verifier("RS256", RSA_PUBLIC), NOW)


def test_an_oversized_token_is_refused_before_decoding() -> None:
    with pytest.raises(TokenRejected, match="longer"):
        verify("a" * (MAX_TOKEN_BYTES + 1), HS, NOW)


def test_bearer_header() -> None:
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer abc") == "abc"
    for bad in ("abc", "Basic abc", "Bearer ", ""):
        with pytest.raises(TokenRejected):
            bearer(bad)


def test_certificate_identity() -> None:
    cert = {"subject": ((("countryName", "XX"),), (("commonName", "svc-a"),))}
    assert certificate_principal(cert) == Principal("service_account", "svc-a")
    assert certificate_principal(None) is None
    assert certificate_principal({"subject": ()}) is None


TOKEN_TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(st.text("abcXYZ012-_=+/", max_size=80), min_size=1, max_size=5).map(".".join),
    st.binary(max_size=200).map(lambda b: ".".join([_b64(b)] * 3)),
)


FIXED_REASONS = {
    "malformed token",
    "undecodable token",
    "bad token signature",
    "token has no exp claim",
    "token expired",
    "token not valid yet (nbf)",
    "token issued in the future (iat)",
    "token issuer is not the configured one",
    "token names no principal (principal_name or sub)",
    f"token algorithm is not the configured {HS.algorithm}",
}
"""Refusals whose words come from the broker alone (none interpolates the token)."""


@settings(max_examples=400, deadline=None)
@given(TOKEN_TEXT)
def test_random_tokens_are_refused_cleanly(token: str) -> None:
    """Whatever arrives, the answer is a principal or TokenRejected, and the reason never
    quotes the token."""
    try:
        verify(token, HS, NOW)
    except TokenRejected as error:
        reason = str(error)
        # A token may happen to be a piece of the broker's own fixed wording ("malforme" of
        # "malformed token"): quoting it is then impossible to tell from not quoting it.
        if len(token) >= 8 and reason not in FIXED_REASONS:
            assert token not in reason
        assert reason in FIXED_REASONS or reason.startswith(("token longer", "claim ")), reason


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["alg", "typ", "kid", "crit"]), st.text(max_size=10)),
    st.dictionaries(
        st.sampled_from(["sub", "exp", "iss", "nbf", "iat", "principal_name"]),
        st.one_of(st.text(max_size=10), st.integers(), st.floats(), st.none()),
    ),
)
def test_malformed_headers_and_claims_are_refused_cleanly(header: dict, claims: dict) -> None:
    token = ".".join([_b64(json.dumps(header).encode()), _b64(json.dumps(claims).encode()), "x"])
    with pytest.raises(TokenRejected):
        verify(token, HS, NOW)


BROKER_CERT = {
    "subject": ((("commonName", "broker-7"),),),
    "subjectAltName": (
        ("DNS", "Broker-7.Cluster.Example"),
        ("URI", "spiffe://cluster.example/broker"),
        ("IP Address", "10.0.0.7"),
    ),
}


@pytest.mark.parametrize(
    ("names", "found"),
    [
        ({"broker-7"}, "broker-7"),  # the common name, as before
        ({"uri:spiffe://cluster.example/broker"}, "uri:spiffe://cluster.example/broker"),
        ({"dns:broker-7.cluster.example"}, "dns:broker-7.cluster.example"),  # DNS: any case
        ({"URI:spiffe://cluster.example/broker"}, "URI:spiffe://cluster.example/broker"),
        ({"uri:spiffe://cluster.example/Broker"}, None),  # a URI is matched exactly
        ({"uri:spiffe://cluster.example"}, None),  # no prefix matching
        ({"dns:cluster.example"}, None),
        ({"dns:spiffe://cluster.example/broker"}, None),  # the entry's type must match
        ({"uri:Broker-7.Cluster.Example"}, None),
        ({"dns:broker-7"}, None),  # a common name is no DNS entry
        ({"10.0.0.7"}, None),  # nor is an IP address a common name
        ({"Broker-7.Cluster.Example"}, None),  # a bare entry is a common name only
        (set(), None),
    ],
)
def test_broker_certificates_by_common_name_or_san_entry(
    names: set[str], found: str | None
) -> None:
    assert broker_certificate(BROKER_CERT, frozenset(names)) == found


def test_no_certificate_is_no_broker() -> None:
    assert broker_certificate(None, frozenset({"broker-7", "dns:x"})) is None
    assert broker_certificate({"subject": ()}, frozenset({"broker-7"})) is None


@pytest.mark.parametrize("entry", ["dns:broker-1.cluster.example", "uri:spiffe://c/broker"])
def test_a_common_name_that_spells_a_san_entry_is_no_broker(entry: str) -> None:
    """A client certificate whose common name is the text of a `dns:`/`uri:` entry, with no
    such subjectAltName, is not that broker (found in review: the common-name fallback
    compared every entry, prefixed ones included)."""
    client = {
        "subject": ((("commonName", entry),),),
        "subjectAltName": (("DNS", "alice.clients.example"),),
    }
    assert broker_certificate(client, frozenset({entry})) is None
