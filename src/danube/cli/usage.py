"""What the command-line tools share."""

from __future__ import annotations

import argparse
from pathlib import Path

from danube.client.security import ClientSecurity, from_environment

DEFAULT_SERVICE = "http://127.0.0.1:6650"
ADMIN_ENV_PREFIX = "DANUBE_ADMIN_"
"""Danube's `danube-admin` environment: DANUBE_ADMIN_TLS, _CA, _CERT, _KEY, _DOMAIN, _TOKEN."""
CLIENT_ENV_PREFIX = "DANUBE_"
"""`danube-cli`'s (ours; Danube's has none): DANUBE_TLS, DANUBE_CA, ..., DANUBE_TOKEN."""


class UsageError(Exception):
    """Bad flags the parser cannot see (for example `-m` and `-f` both missing)."""


def add_service_addr(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-s", "--service-addr", default=DEFAULT_SERVICE,
        help=f"broker URL, or several of a cluster comma-separated (default {DEFAULT_SERVICE})",
    )  # fmt: skip
    add_tls_arguments(parser, CLIENT_ENV_PREFIX)


def add_tls_arguments(parser: argparse.ArgumentParser, prefix: str) -> None:
    """TLS and token flags; each falls back to `<prefix>TLS`, `_CA`, ... in the environment."""
    parser.add_argument(
        "--tls", action="store_true", help=f"connect over TLS (env {prefix}TLS; https:// too)"
    )
    parser.add_argument("--tls-ca", help=f"CA file the broker's certificate chains to ({prefix}CA)")
    parser.add_argument("--tls-cert", help=f"client certificate, mutual TLS ({prefix}CERT)")
    parser.add_argument("--tls-key", help=f"its private key ({prefix}KEY)")
    parser.add_argument(
        "--tls-domain", help=f"name the broker's certificate carries ({prefix}DOMAIN)"
    )
    parser.add_argument(
        "--token", help=f"bearer token sent on every call; prefer the env {prefix}TOKEN"
    )


def security_of(args: argparse.Namespace, prefix: str, url: str = "") -> ClientSecurity:
    return from_environment(
        prefix,
        url or getattr(args, "service_addr", ""),
        tls=args.tls,
        ca_file=args.tls_ca,
        cert_file=args.tls_cert,
        key_file=args.tls_key,
        domain=args.tls_domain,
        token=args.token,
    )


def read_input(path: Path) -> bytes:
    """A file the user named (payload, schema), or a one-line error saying why not."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None
