"""`danube-admin security tokens create|validate` (Danube's commands, reference §10.2): mint
a bearer token offline, or check one, with the HS256 secret (`--secret-key`, env
`DANUBE_JWT_SECRET_KEY`) or, ours, an RS256/EdDSA key file. Neither talks to a broker.
Roles and bindings commands arrive with the SecurityAdmin RPCs (issue 25, part 2)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from danube.cli.admin_args import Actions, command, group
from danube.cli.admin_call import AdminClient, BadUsage
from danube.cli.admin_render import Result
from danube.machines.security.tokens import (
    ALGORITHMS,
    DEFAULT_ISSUER,
    TokenRejected,
    Verifier,
    mint,
    verify_until,
)

SECRET_ENV = "DANUBE_JWT_SECRET_KEY"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> int:
    """`8760h`, `30m`, `90s`, `7d` or plain seconds."""
    text = text.strip()
    unit = _UNITS.get(text[-1:])
    try:
        value = int(text[:-1] if unit else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration like 8760h, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("expected a positive duration")
    return value * (unit or 1)


def _key(args: argparse.Namespace, private: bool) -> str:
    if args.algorithm == "HS256":
        secret = args.secret_key or os.environ.get(SECRET_ENV)
        if not secret:
            raise BadUsage(f"HS256 needs --secret-key or {SECRET_ENV}")
        return str(secret)
    path = args.private_key if private else args.public_key
    if not path:
        flag = "--private-key" if private else "--public-key"
        raise BadUsage(f"{args.algorithm} needs {flag} (a PEM file)")
    try:
        return Path(path).read_text()
    except OSError as error:
        raise BadUsage(f"cannot read {path}: {error.strerror}") from None


async def create(_: AdminClient, args: argparse.Namespace) -> Result:
    token = mint(
        args.subject,
        _key(args, private=True),
        now=time.time(),
        algorithm=args.algorithm,
        ttl_s=args.ttl,
        principal_type=args.type,
        issuer=args.issuer,
    )
    return Result({"token": token}, token)


async def validate(_: AdminClient, args: argparse.Namespace) -> Result:
    verifier = Verifier(args.algorithm, _key(args, private=False), args.issuer)
    try:
        principal, until = verify_until(args.token, verifier, time.time())
    except TokenRejected as error:
        return Result({"valid": False, "reason": str(error)}, f"Invalid: {error}", exit_code=1)
    data = {"valid": True, "principal_type": principal.kind, "principal_name": principal.name,
            "valid_until": int(until)}  # fmt: skip
    return Result(data, f"Valid: {principal.kind} {principal.name}")


def _key_flags(parser: argparse.ArgumentParser, private: bool) -> None:
    parser.add_argument(
        "--secret-key", help=f"the HS256 shared secret (env {SECRET_ENV}; prefer the env)"
    )
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="HS256")
    if private:
        parser.add_argument("--private-key", help="RS256/EdDSA: the PEM private key file")
    else:
        parser.add_argument("--public-key", help="RS256/EdDSA: the PEM public key file")


def add_security_commands(commands: Actions) -> None:
    security = group(commands, "security", "tokens (roles and bindings: not offered yet)")
    tokens = group(security, "tokens", "mint and check bearer tokens, offline")
    make = command(tokens, "create", "mint a token", create, "nothing (offline)")
    make.add_argument("--subject", required=True, help="the principal name")
    make.add_argument("--ttl", type=duration, default=duration("8760h"), help="default 8760h")
    make.add_argument("--type", choices=["service_account", "user"], default="service_account")
    make.add_argument("--issuer", default=DEFAULT_ISSUER, help=f"default {DEFAULT_ISSUER}")
    _key_flags(make, private=True)
    check = command(tokens, "validate", "check a token", validate, "nothing (offline)")
    check.add_argument("--token", required=True)
    check.add_argument("--issuer", help="require this issuer (default: any, as Danube)")
    _key_flags(check, private=False)
