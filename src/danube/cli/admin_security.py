"""`danube-admin security tokens create|validate` (Danube's commands, reference §10.2): mint
a bearer token offline, or check one, with the HS256 secret (`--secret-key`, env
`DANUBE_JWT_SECRET_KEY`) or, ours, an RS256/EdDSA key file. Neither talks to a broker.
`security roles | bindings` manage RBAC over the SecurityAdmin RPCs (standalone brokers)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from danube.cli.admin_args import Actions, command, group
from danube.cli.admin_call import AdminClient, BadUsage, require_success
from danube.cli.admin_render import Result, plain, table
from danube.machines.security.tokens import (
    ALGORITHMS,
    DEFAULT_ISSUER,
    TokenRejected,
    Verifier,
    mint,
    verify_until,
)
from danube.proto import danube_admin as pb

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


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _security(client: AdminClient) -> pb.SecurityAdminStub:
    return pb.SecurityAdminStub(client._channel, timeout=client.timeout_s)


def _role_rows(roles: list[pb.RoleDefinition]) -> list[tuple[str, str, str]]:
    return [(r.name, ",".join(r.permissions), "yes" if r.system else "") for r in roles]


async def role_create(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"create role {args.name}"
    role = pb.RoleDefinition(name=args.name, permissions=_names(args.permissions))
    answer = await client.call(what, _security(client).create_role(pb.CreateRoleRequest(role)))
    require_success(what, answer.success)
    return Result(plain(answer), f"Created role {args.name}")


async def role_get(client: AdminClient, args: argparse.Namespace) -> Result:
    answer = await client.call(
        f"role {args.name}", _security(client).get_role(pb.GetRoleRequest(args.name))
    )
    rows = _role_rows([answer.role])
    return Result(plain(answer.role), table(("role", "permissions", "system"), rows, "no role"))


async def role_list(client: AdminClient, _: argparse.Namespace) -> Result:
    answer = await client.call("list roles", _security(client).list_roles(pb.Empty()))
    rows = _role_rows(answer.roles)
    return Result(plain(answer), table(("role", "permissions", "system"), rows, "no roles"))


async def role_delete(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"delete role {args.name}"
    answer = await client.call(what, _security(client).delete_role(pb.DeleteRoleRequest(args.name)))
    require_success(what, answer.success)
    return Result(plain(answer), f"Deleted role {args.name}")


def _binding_rows(bindings: list[pb.BindingDefinition]) -> list[tuple[str, ...]]:
    return [
        (b.id, f"{b.principal_type}:{b.principal_name}", ",".join(b.role_names), b.scope,
         b.resource_name)
        for b in bindings
    ]  # fmt: skip


BINDING_HEADERS = ("id", "principal", "roles", "scope", "resource")


async def binding_create(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"create binding {args.id}"
    binding = pb.BindingDefinition(
        id=args.id, principal_type=args.principal_type, principal_name=args.principal_name,
        role_names=_names(args.roles), scope=args.scope, resource_name=args.resource or "",
    )  # fmt: skip
    request = pb.CreateBindingRequest(binding)
    answer = await client.call(what, _security(client).create_binding(request))
    require_success(what, answer.success)
    return Result(plain(answer), f"Created binding {args.id}")


async def binding_get(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.GetBindingRequest(args.scope, args.resource or "", args.id)
    answer = await client.call(f"binding {args.id}", _security(client).get_binding(request))
    rows = _binding_rows([answer.binding])
    return Result(plain(answer.binding), table(BINDING_HEADERS, rows, "no binding"))


async def binding_list(client: AdminClient, args: argparse.Namespace) -> Result:
    stub = _security(client)
    if args.scope is None:
        answer = await client.call("list bindings", stub.list_all_bindings(pb.Empty()))
    else:
        request = pb.ListBindingsRequest(args.scope, args.resource or "")
        answer = await client.call("list bindings", stub.list_bindings(request))
    rows = _binding_rows(answer.bindings)
    return Result(plain(answer), table(BINDING_HEADERS, rows, "no bindings"))


async def binding_delete(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"delete binding {args.id}"
    request = pb.DeleteBindingRequest(args.scope, args.resource or "", args.id)
    answer = await client.call(what, _security(client).delete_binding(request))
    require_success(what, answer.success)
    return Result(plain(answer), f"Deleted binding {args.id}")


SCOPES = ("cluster", "namespace", "topic", "subject")
NEEDS = "SecurityAdmin (standalone broker) and ManageCluster"


def _scope(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--scope", choices=SCOPES, required=required)
    parser.add_argument("--resource", help="namespace, topic or subject (not for cluster)")


def _roles_and_bindings(security: Actions) -> None:
    roles = group(security, "roles", "roles: named sets of permissions")
    made = command(roles, "create", "create or replace a role", role_create, NEEDS)
    made.add_argument("name")
    made.add_argument("--permissions", required=True, help="e.g. Produce,Consume,Lookup")
    for name, run in (("get", role_get), ("delete", role_delete)):
        command(roles, name, f"{name} a role", run, NEEDS).add_argument("name")
    command(roles, "list", "list roles", role_list, NEEDS)
    bindings = group(security, "bindings", "bindings: roles granted to a principal on a scope")
    made = command(bindings, "create", "grant roles", binding_create, NEEDS)
    made.add_argument("id")
    made.add_argument("--principal-type", choices=["service_account", "user"], required=True)
    made.add_argument("--principal-name", required=True)
    made.add_argument("--roles", required=True, help="role names, comma-separated")
    _scope(made)
    for name, run in (("get", binding_get), ("delete", binding_delete)):
        sub = command(bindings, name, f"{name} a binding", run, NEEDS)
        sub.add_argument("id")
        _scope(sub)
    _scope(command(bindings, "list", "list bindings (all without --scope)", binding_list, NEEDS),
           required=False)  # fmt: skip


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
    security = group(commands, "security", "tokens, roles and bindings")
    _roles_and_bindings(security)
    tokens = group(security, "tokens", "mint and check bearer tokens, offline")
    make = command(tokens, "create", "mint a token", create, "nothing (offline)")
    make.set_defaults(offline=True)
    make.add_argument("--subject", required=True, help="the principal name")
    make.add_argument("--ttl", type=duration, default=duration("8760h"), help="default 8760h")
    make.add_argument("--type", choices=["service_account", "user"], default="service_account")
    make.add_argument("--issuer", default=DEFAULT_ISSUER, help=f"default {DEFAULT_ISSUER}")
    _key_flags(make, private=True)
    check = command(tokens, "validate", "check a token", validate, "nothing (offline)")
    check.set_defaults(offline=True)
    check.add_argument("--token", required=True)
    check.add_argument("--issuer", help="require this issuer (default: any, as Danube)")
    _key_flags(check, private=False)
