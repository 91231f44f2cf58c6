"""`danube-broker`'s security flags (spec/security.md): they override `auth` from the
configuration file key by key. The HS256 secret is better passed by the environment
(`DANUBE_JWT_SECRET_KEY`) than on the command line, where `ps` shows it."""

from __future__ import annotations

import argparse
import dataclasses
import os

from danube.values.auth_config import AuthConfig, JwtConfig, TlsFiles
from danube.values.errors import ConfigError

SECRET_ENV = "DANUBE_JWT_SECRET_KEY"
CLUSTER_KEY_ENV = "DANUBE_CLUSTER_KEY"
"""auth.cluster_key (brokers' tokens to each other): environment only, never a flag."""


def add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (spec/security.md)")
    group.add_argument(
        "--auth-mode",
        choices=["none", "tls", "tls_with_jwt"],
        help="auth.mode: none (plaintext, no authentication; the default) or tls (TLS on "
        "every port, every call authenticated by token or client certificate, RBAC)",
    )
    group.add_argument("--tls-cert", help="auth.tls.cert_file: the broker's PEM certificate chain")
    group.add_argument("--tls-key", help="auth.tls.key_file: its PEM private key")
    group.add_argument(
        "--tls-ca", help="auth.tls.ca_file: CA of client certificates (identity by certificate)"
    )
    group.add_argument(
        "--tls-verify-client",
        action="store_true",
        default=None,
        help="auth.tls.verify_client: require a client certificate (mutual TLS)",
    )
    group.add_argument(
        "--tls-admin",
        action="store_true",
        default=None,
        help="admin_tls: TLS on the admin port in mode none too (its variable is not "
        "DANUBE_ADMIN_TLS, which tells danube-admin to connect over TLS)",
    )
    group.add_argument(
        "--jwt-algorithm", choices=["HS256", "RS256", "EdDSA"], help="auth.jwt.algorithm"
    )
    group.add_argument(
        "--jwt-secret-key", help=f"auth.jwt.secret_key (HS256); prefer the env {SECRET_ENV}"
    )
    group.add_argument("--jwt-public-key", help="auth.jwt.public_key_file (RS256, EdDSA)")
    group.add_argument("--jwt-issuer", help="auth.jwt.issuer: tokens must name it")
    group.add_argument(
        "--super-admin",
        action="append",
        help="auth.super_admins: a principal that bypasses RBAC: a name (a user or service "
        "account of that name) or kind:name (repeatable)",
    )


def apply_auth_arguments(auth: AuthConfig, args: argparse.Namespace) -> AuthConfig:
    updates: dict[str, object] = {}
    if args.auth_mode:
        updates["mode"] = "tls" if args.auth_mode == "tls_with_jwt" else args.auth_mode
    tls = auth.tls
    if args.tls_cert or args.tls_key or args.tls_ca or args.tls_verify_client:
        if tls is None and not (args.tls_cert and args.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        tls = TlsFiles(
            args.tls_cert or (tls.cert_file if tls else ""),
            args.tls_key or (tls.key_file if tls else ""),
            args.tls_ca or (tls.ca_file if tls else None),
            bool(args.tls_verify_client) or (tls.verify_client if tls else False),
        )
        updates["tls"] = tls
    if args.tls_admin:
        updates["admin_tls"] = True
    secret = args.jwt_secret_key or os.environ.get(SECRET_ENV)
    jwt_flags = (args.jwt_algorithm, args.jwt_public_key, args.jwt_issuer, secret)
    if any(jwt_flags) and (auth.jwt is not None or auth.enabled or args.auth_mode):
        jwt = auth.jwt or JwtConfig()
        jwt = dataclasses.replace(
            jwt,
            algorithm=args.jwt_algorithm or jwt.algorithm,
            secret_key=secret or jwt.secret_key,
            public_key_file=args.jwt_public_key or jwt.public_key_file,
            issuer=args.jwt_issuer or jwt.issuer,
        )
        updates["jwt"] = jwt
    if args.super_admin:  # repeated flags, or DANUBE_SUPER_ADMIN="a,b" (one string)
        given = [args.super_admin] if isinstance(args.super_admin, str) else args.super_admin
        names = [n.strip() for text in given for n in text.split(",") if n.strip()]
        updates["super_admins"] = (*auth.super_admins, *names)
    if cluster_key := os.environ.get(CLUSTER_KEY_ENV):
        updates["cluster_key"] = cluster_key
    return dataclasses.replace(auth, **updates)
