"""`auth` and `admin_tls` (Danube's keys, reference §9.1 and §12.3), plus what Danube lacks:
client-certificate verification, public-key tokens, a fixed issuer, static roles and bindings.

    auth:
      mode: none | tls              # tls_with_jwt: the older Danube spelling of tls
      tls: {cert_file, key_file, ca_file, verify_client: false}
      jwt: {secret_key, public_key_file, algorithm: HS256|RS256|EdDSA, issuer,
            expiration_time, leeway_seconds}
      super_admins: [name | kind:name, ...]
      cluster_key: ...              # cluster mode: the key brokers sign their tokens with
      broker_certificates: [cn | dns:name | uri:uri, ...]  # or: the brokers' certificates
      roles: [{name, permissions: [Produce, ...]}]
      bindings: [{id, principal_type, principal_name, roles: [...], scope, resource_name}]
    admin_tls: false

`mode: tls` puts TLS on the client, admin and metrics ports and requires every call to prove
who it comes from (a bearer token, or a client certificate when `ca_file` is set); RBAC then
decides (default deny). `mode: none` is today's broker: plaintext, everyone may do everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from danube.values.errors import ConfigError

MODES = {"none": "none", "tls": "tls", "tls_with_jwt": "tls"}
ALGORITHMS = ("HS256", "RS256", "EdDSA")
SCOPES = ("cluster", "namespace", "topic", "subject")
PERMISSIONS = (
    "Lookup", "Produce", "Consume", "Replicate", "ManageNamespace", "ManageTopic",
    "ManageSchema", "ManageBroker", "ManageCluster",
)  # fmt: skip
"""Danube's permission names, exact (`danube.machines.security.rbac.Permission`)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_file: str
    key_file: str
    ca_file: str | None = None
    """CA of client certificates: with it a client may prove its identity by certificate."""
    verify_client: bool = False
    """Require a client certificate (mutual TLS) on the client and admin ports."""


@dataclass(frozen=True, slots=True)
class JwtConfig:
    algorithm: str = "HS256"
    secret_key: str | None = None
    """HS256: the shared secret (Danube's key); never logged."""
    public_key_file: str | None = None
    """RS256 / EdDSA: the PEM public key; the broker never holds the signing key."""
    issuer: str | None = None
    """Tokens must name this issuer; None accepts any (Danube's behaviour)."""
    expiration_time: int = 3600
    """Danube's key: accepted, unused by the broker (tokens carry their own exp)."""
    leeway_seconds: int = 30


@dataclass(frozen=True, slots=True)
class RoleConfig:
    name: str
    permissions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BindingConfig:
    id: str
    principal_type: str
    principal_name: str
    roles: tuple[str, ...]
    scope: str
    resource_name: str = ""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    mode: str = "none"
    tls: TlsFiles | None = None
    jwt: JwtConfig | None = None
    super_admins: tuple[str, ...] = ()
    roles: tuple[RoleConfig, ...] = ()
    bindings: tuple[BindingConfig, ...] = ()
    admin_tls: bool = False
    """Danube's key: TLS on the admin port in mode none too (mode tls always has it)."""
    cluster_key: str | None = None
    """Ours, cluster mode: the HS256 secret a cluster's brokers sign the tokens they show each
    other with (best from the env DANUBE_CLUSTER_KEY); never logged, never a client's key."""
    broker_certificates: tuple[str, ...] = ()
    """Ours, cluster mode: the brokers' certificates, by common name, or by subjectAltName
    entry (`dns:NAME`, `uri:URI`, `tokens.broker_certificate`). A client certificate verified
    against `auth.tls.ca_file` that matches one is a broker (mutual TLS between brokers,
    without a cluster key); the CA must issue these names to brokers only."""

    @property
    def enabled(self) -> bool:
        return self.mode == "tls"

    def tls_on(self, port: str) -> bool:
        """Whether `port` (client, admin, metrics) speaks TLS."""
        if self.tls is None:
            return False
        return self.enabled or (port == "admin" and self.admin_tls)

    def check(self) -> None:
        if self.enabled:
            if self.tls is None:
                raise ConfigError("auth.mode tls needs auth.tls.cert_file and auth.tls.key_file")
            if self.jwt is None and self.tls.ca_file is None:
                raise ConfigError(
                    "auth.mode tls needs auth.jwt (bearer tokens) or auth.tls.ca_file "
                    "(client certificates): otherwise no caller could authenticate"
                )
        jwt = self.jwt
        if jwt is not None and jwt.algorithm == "HS256" and jwt.secret_key is None:
            raise ConfigError(
                "auth.jwt.secret_key: required with HS256 (or the env DANUBE_JWT_SECRET_KEY)"
            )
        if jwt is not None and jwt.algorithm != "HS256" and jwt.public_key_file is None:
            raise ConfigError(f"auth.jwt.public_key_file: required with {jwt.algorithm}")
        if self.admin_tls and self.tls is None:
            raise ConfigError("admin_tls needs auth.tls.cert_file and auth.tls.key_file")
        if self.tls is not None and self.tls.verify_client and self.tls.ca_file is None:
            raise ConfigError("auth.tls.verify_client needs auth.tls.ca_file")
        if self.cluster_key is not None and jwt is not None and jwt.secret_key == self.cluster_key:
            raise ConfigError(
                "auth.cluster_key must differ from auth.jwt.secret_key: whoever can mint client "
                "tokens could otherwise pose as a broker"
            )

    def check_cluster(self) -> None:
        """Cluster mode with authentication: brokers prove who they are to each other by a
        token signed with the cluster key, or by certificates with the names listed
        (spec/security.md, "Between brokers")."""
        if self.broker_certificates and (self.tls is None or self.tls.ca_file is None):
            raise ConfigError(
                "auth.broker_certificates needs auth.tls.ca_file: a certificate proves nothing "
                "unless it is verified"
            )
        if self.enabled and not self.cluster_key and not self.broker_certificates:
            raise ConfigError(
                "auth.mode tls in cluster mode needs auth.cluster_key (or the env "
                "DANUBE_CLUSTER_KEY), the secret brokers sign the tokens they show each other "
                "with, or auth.broker_certificates, the names of their certificates (common "
                "names, or dns:/uri: subjectAltName entries)"
            )


def _keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping")
    return value


def _text(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key}: expected a string")
    return value


def _names(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of names")
    return tuple(value)


def tls_files(data: dict[str, Any]) -> TlsFiles | None:
    _keys(data, {"cert_file", "key_file", "ca_file", "verify_client"}, "auth.tls")
    cert, key = _text(data, "cert_file", "auth.tls"), _text(data, "key_file", "auth.tls")
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("auth.tls: cert_file and key_file go together")
    verify = data.get("verify_client", False)
    if not isinstance(verify, bool):
        raise ConfigError("auth.tls.verify_client: expected true or false")
    return TlsFiles(cert, key, _text(data, "ca_file", "auth.tls"), verify)


def jwt_config(data: dict[str, Any]) -> JwtConfig | None:
    where = "auth.jwt"
    allowed = {"secret_key", "public_key_file", "algorithm", "issuer", "expiration_time"}
    _keys(data, allowed | {"leeway_seconds"}, where)
    if not data:
        return None
    algorithm = data.get("algorithm", "HS256")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"{where}.algorithm: expected one of {', '.join(ALGORITHMS)}")
    secret, public = _text(data, "secret_key", where), _text(data, "public_key_file", where)
    numbers = {}
    for key, default in (("expiration_time", 3600), ("leeway_seconds", 30)):
        value = data.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where}.{key}: expected a non-negative integer")
        numbers[key] = value
    return JwtConfig(algorithm, secret, public, _text(data, "issuer", where), **numbers)


def _roles(value: Any) -> tuple[RoleConfig, ...]:
    roles = []
    for index, item in enumerate(value or ()):
        where = f"auth.roles[{index}]"
        item = _mapping(item, where)
        _keys(item, {"name", "permissions"}, where)
        name = _text(item, "name", where)
        if name is None:
            raise ConfigError(f"{where}.name: required")
        permissions = _names(item.get("permissions"), f"{where}.permissions")
        unknown = [p for p in permissions if p not in PERMISSIONS]
        if unknown:
            raise ConfigError(
                f"{where}.permissions: unknown {', '.join(unknown)} (expected some of "
                f"{', '.join(PERMISSIONS)})"
            )
        roles.append(RoleConfig(name, permissions))
    return tuple(roles)


def _bindings(value: Any) -> tuple[BindingConfig, ...]:
    bindings = []
    fields = {"id", "principal_type", "principal_name", "roles", "scope", "resource_name"}
    for index, item in enumerate(value or ()):
        where = f"auth.bindings[{index}]"
        item = _mapping(item, where)
        _keys(item, fields, where)
        texts = {k: _text(item, k, where) for k in ("id", "principal_type", "principal_name")}
        missing = [k for k, v in texts.items() if v is None]
        scope = str(item.get("scope", "")).lower()
        if missing:
            raise ConfigError(f"{where}: {', '.join(missing)} required")
        if scope not in SCOPES:
            raise ConfigError(f"{where}.scope: expected one of {', '.join(SCOPES)}")
        roles = _names(item.get("roles"), f"{where}.roles")
        if not roles:
            raise ConfigError(f"{where}.roles: at least one role")
        resource = _text(item, "resource_name", where) or ""
        if scope != "cluster" and not resource:
            raise ConfigError(f"{where}.resource_name: required at scope {scope}")
        bindings.append(
            BindingConfig(
                str(texts["id"]),
                str(texts["principal_type"]),
                str(texts["principal_name"]),
                roles,
                scope,
                resource,
            )
        )
    return tuple(bindings)


def auth_config(data: dict[str, Any], admin_tls: Any = False) -> AuthConfig:
    """`auth` from parsed YAML (and the top-level `admin_tls`); `AuthConfig.check` runs once
    flags and the environment are applied too (`BrokerConfig.check_mode`)."""
    allowed = {"mode", "tls", "jwt", "super_admins", "roles", "bindings", "cluster_key"}
    allowed.add("broker_certificates")
    _keys(data, allowed, "auth")
    mode = MODES.get(str(data.get("mode", "none")).lower())
    if mode is None:
        raise ConfigError("auth.mode: expected none or tls (tls_with_jwt: the same as tls)")
    if not isinstance(admin_tls, bool):
        raise ConfigError("admin_tls: expected true or false")
    config = AuthConfig(
        mode=mode,
        tls=tls_files(_mapping(data.get("tls"), "auth.tls")),
        jwt=jwt_config(_mapping(data.get("jwt"), "auth.jwt")),
        super_admins=_names(data.get("super_admins"), "auth.super_admins"),
        roles=_roles(data.get("roles")),
        bindings=_bindings(data.get("bindings")),
        admin_tls=admin_tls,
        cluster_key=_text(data, "cluster_key", "auth"),
        broker_certificates=_names(data.get("broker_certificates"), "auth.broker_certificates"),
    )
    return config
