"""Bearer tokens: verifying them (the broker) and minting them (`danube-admin security tokens`).

Pure: the time is an argument (`now`, seconds since the epoch), so expiry and the clock-skew
allowance are table-tested; PyJWT only checks signatures here (its own time checks are off).

Compatible with Danube's claims (`iss`, `exp`, `sub`, `principal_type`, `principal_name`,
reference §9.2) and stricter where Danube is lax, on purpose:
- the algorithm is the one configured for the key, never the one a token names: `none`, and
  an HS256 token "signed" with an RS256 public key (algorithm confusion), are refused;
- `exp` is required, `nbf` and `iat` (when present) are honoured, each with `leeway_s`;
- the issuer is checked when one is configured (Danube never checks it);
- a token longer than `MAX_TOKEN_BYTES` is refused before any decoding.
Rejections carry a reason that never quotes the token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jwt
from jwt.algorithms import get_default_algorithms

from danube.machines.security.rbac import BROKER_KIND, Principal

MAX_TOKEN_BYTES = 8 * 1024
"""Longest token accepted: Danube's are ~250 bytes; an 8 KiB cap leaves room for RS256
signatures and extra claims while keeping the base64/JSON work per call small."""
DEFAULT_LEEWAY_S = 30
"""Clock skew tolerated on exp/nbf/iat (Danube's library default is 60 s)."""
DEFAULT_ISSUER = "danube-auth"
DEFAULT_TTL_S = 8760 * 3600
ALGORITHMS = ("HS256", "RS256", "EdDSA")
PRINCIPAL_KINDS = ("user", "service_account", "broker_internal")


class TokenRejected(Exception):
    """Why a token was refused, safe to send back and to log (it never contains the token)."""


@dataclass(frozen=True, slots=True)
class Verifier:
    """How tokens are checked: `key` is the HS256 shared secret (str) or a PEM public key
    (RS256, EdDSA); `issuer` None accepts any issuer (Danube's behaviour)."""

    algorithm: str
    key: str
    issuer: str | None = None
    leeway_s: int = DEFAULT_LEEWAY_S
    prepared: Any = field(default=None, compare=False, repr=False)
    """The key parsed once (a PEM parse cost more than the signature check itself)."""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unsupported algorithm {self.algorithm!r} (expected {ALGORITHMS})")
        if not self.key:
            raise ValueError("a token key is required")
        algorithm = get_default_algorithms()[self.algorithm]
        try:  # HMAC refuses a PEM key here: no algorithm confusion by configuration either
            prepared = algorithm.prepare_key(self.key)
        except (jwt.PyJWTError, ValueError, TypeError) as error:
            raise ValueError(f"unusable {self.algorithm} key ({type(error).__name__})") from None
        object.__setattr__(self, "prepared", prepared)


def bearer(value: str) -> str:
    """The token of an `authorization` header value (`Bearer x` or `bearer x`, as Danube)."""
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise TokenRejected("the authorization header is not 'Bearer <token>'")
    return token.strip()


def _principal_kind(claim: Any) -> str:
    """Danube's mapping: `user` and `broker_internal` as such, anything else a service
    account."""
    return claim if claim in ("user", "broker_internal") else "service_account"


def _time_claim(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenRejected(f"claim {name} is not a number")
    return float(value)


def verify(token: str, verifier: Verifier, now: float) -> Principal:
    """The principal a valid token names; TokenRejected otherwise."""
    return verify_until(token, verifier, now)[0]


def verify_until(token: str, verifier: Verifier, now: float) -> tuple[Principal, float]:
    """The principal a valid token names and until when (epoch seconds, the skew allowance
    included) it may be trusted; TokenRejected otherwise."""
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenRejected(f"token longer than {MAX_TOKEN_BYTES} bytes")
    if token.count(".") != 2:
        raise TokenRejected("malformed token")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise TokenRejected("malformed token") from None
    if header.get("alg") != verifier.algorithm:
        raise TokenRejected(f"token algorithm is not the configured {verifier.algorithm}")
    try:
        claims = jwt.decode(
            token,
            verifier.prepared,
            algorithms=[verifier.algorithm],
            options={
                "verify_signature": True,
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "verify_iss": False,
                "verify_aud": False,
            },
        )
    except jwt.InvalidSignatureError:
        raise TokenRejected("bad token signature") from None
    except (jwt.PyJWTError, ValueError, TypeError):
        raise TokenRejected("undecodable token") from None
    return _check_claims(claims, verifier, now)


def _check_claims(
    claims: dict[str, Any], verifier: Verifier, now: float
) -> tuple[Principal, float]:
    leeway = verifier.leeway_s
    expires = _time_claim(claims, "exp")
    if expires is None:
        raise TokenRejected("token has no exp claim")
    if now > expires + leeway:
        raise TokenRejected("token expired")
    not_before = _time_claim(claims, "nbf")
    if not_before is not None and now + leeway < not_before:
        raise TokenRejected("token not valid yet (nbf)")
    issued = _time_claim(claims, "iat")
    if issued is not None and now + leeway < issued:
        raise TokenRejected("token issued in the future (iat)")
    if verifier.issuer is not None and claims.get("iss") != verifier.issuer:
        raise TokenRejected("token issuer is not the configured one")
    name = claims.get("principal_name", claims.get("sub"))
    if not isinstance(name, str) or not name:
        raise TokenRejected("token names no principal (principal_name or sub)")
    return Principal(_principal_kind(claims.get("principal_type")), name), expires + leeway


def mint(
    subject: str,
    key: str,
    *,
    now: float,
    algorithm: str = "HS256",
    ttl_s: int = DEFAULT_TTL_S,
    principal_type: str = "service_account",
    issuer: str = DEFAULT_ISSUER,
) -> str:
    """A token with Danube's claims (what `danube-admin security tokens create` prints);
    `key` is the HS256 secret or a PEM private key."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unsupported algorithm {algorithm!r}")
    if principal_type not in PRINCIPAL_KINDS:
        raise ValueError(f"principal type must be one of {PRINCIPAL_KINDS}")
    claims = {
        "iss": issuer,
        "sub": subject,
        "iat": int(now),
        "exp": int(now) + ttl_s,
        "principal_type": principal_type,
        "principal_name": subject,
    }
    return jwt.encode(claims, key, algorithm=algorithm)


def certificate_principal(cert: dict[str, Any] | None) -> Principal | None:
    """The identity of a verified client certificate (mutual TLS): its subject's common name,
    as a service account. None without a certificate or a common name."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return Principal("service_account", str(value))
    return None


SAN_PREFIXES = {"dns:": "DNS", "uri:": "URI"}
"""`auth.broker_certificates` entries naming a subjectAltName entry rather than a common name:
`dns:broker.cluster.example`, `uri:spiffe://cluster.example/broker`."""


def broker_certificate(cert: dict[str, Any] | None, names: frozenset[str]) -> str | None:
    """The `auth.broker_certificates` entry a verified certificate matches, or None: a
    `dns:` or `uri:` entry matches a subjectAltName entry of that type exactly (case-
    insensitive for DNS names, as DNS is), any other entry the subject's common name. A
    SAN entry lets a cluster name its brokers apart from the names clients connect to (a URI
    such as SPIFFE's), where a common name is one free-text field per certificate."""
    if not cert or not names:
        return None
    for entry in names:
        prefix = entry[:4].lower()
        kind = SAN_PREFIXES.get(prefix)
        if kind is None:
            continue
        wanted = entry[4:]
        for san_kind, value in cert.get("subjectAltName", ()):
            if san_kind != kind:
                continue
            if value == wanted or (kind == "DNS" and value.lower() == wanted.lower()):
                return entry
    principal = certificate_principal(cert)
    # Only an entry without a SAN prefix names a common name: a client certificate whose
    # common name is the text "dns:broker-1..." must not pass for that SAN entry.
    if (
        principal is not None
        and principal.name in names
        and principal.name[:4].lower() not in SAN_PREFIXES
    ):
        return principal.name
    return None


BROKER_ISSUER = "danube-cluster"
"""The issuer of the tokens a cluster's brokers show each other (`auth.cluster_key`)."""
BROKER_TTL_S = 300
"""A broker token's life; the broker mints a fresh one well before the old one ends."""


def broker_verifier(cluster_key: str, leeway_s: int = DEFAULT_LEEWAY_S) -> Verifier:
    """How a broker checks another broker's token: HS256 with the cluster's own key (never
    the clients' token key: `AuthConfig.check` refuses the same secret for both), and the
    cluster issuer."""
    return Verifier("HS256", cluster_key, BROKER_ISSUER, leeway_s)


def mint_broker(name: str, cluster_key: str, now: float, ttl_s: int = BROKER_TTL_S) -> str:
    """The token broker `name` sends on every call to another broker of its cluster."""
    claims = {
        "iss": BROKER_ISSUER,
        "sub": name,
        "iat": int(now),
        "exp": int(now) + ttl_s,
        "principal_type": BROKER_KIND,
        "principal_name": name,
    }
    return jwt.encode(claims, cluster_key, algorithm="HS256")


def verify_broker(token: str, verifier: Verifier, now: float) -> tuple[Principal, float]:
    """A broker's identity (kind `broker`) and until when it holds, from a token only the
    cluster key signs: a client token (another key, another issuer) never passes, and no
    claim of a client token can make a `broker` principal (`_principal_kind`)."""
    principal, valid_until = verify_until(token, verifier, now)
    return Principal(BROKER_KIND, principal.name), valid_until
