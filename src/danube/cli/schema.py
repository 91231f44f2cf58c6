"""`danube-cli schema ...`: the schema registry from the command line (register, show,
versions, list, check, mode, delete), as Danube's CLI offers it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from danube.cli.usage import (
    CLIENT_ENV_PREFIX,
    add_service_addr,
    add_tls_arguments,
    read_input,
    security_of,
)

if TYPE_CHECKING:
    from danube.proto import danube_schema as pb

# Spelled out, not derived from `SchemaType` and `CompatibilityMode`: importing the schema
# machines (jsonschema, fastavro, protobuf) costs `--help` a tenth of a second (issue 26);
# tests/cli/test_cli_startup.py checks both lists against the enums. The commands import the
# client when they run.
TYPES = ("bytes", "string", "number", "avro", "json_schema", "protobuf")
DEFAULT_ADMIN = "http://127.0.0.1:50051"
MODES = (
    "none",
    "backward",
    "backward_transitive",
    "forward",
    "forward_transitive",
    "full",
    "full_transitive",
)


def _when(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + "Z"


def registered_text(subject: str, answer: pb.RegisterSchemaResponse) -> str:
    state = "registered as" if answer.is_new_version else "already registered as"
    return (
        f"{subject}: {state} version {answer.version} (schema id {answer.schema_id}, "
        f"{answer.fingerprint})"
    )


def schema_header(schema: pb.GetSchemaResponse) -> str:
    """What a version is, beside its definition (which goes to stdout alone in danube-cli, so
    it can be redirected to a file)."""
    return (
        f"subject {schema.subject} version {schema.version} (schema id {schema.schema_id}), "
        f"{schema.schema_type}, mode {schema.compatibility_mode}\n"
        f"fingerprint {schema.fingerprint}; created {_when(schema.created_at)} by "
        f"{schema.created_by or '-'}" + (f"; {schema.description}" if schema.description else "")
    )


def definition_text(schema: pb.GetSchemaResponse) -> str:
    return schema.schema_definition.decode("utf-8", "replace").removesuffix("\n")


def versions_text(found: Sequence[pb.SchemaVersionInfo]) -> str:
    lines = [f"{'version':>7}  {'created (UTC)':<20}  {'by':<12}  fingerprint"]
    for v in found:
        lines.append(
            f"{v.version:>7}  {_when(v.created_at):<20}  {v.created_by:<12}  {v.fingerprint}"
        )
    return "\n".join(lines)


def subjects_text(found: Sequence[pb.SubjectSummary]) -> str:
    lines = [f"{'subject':<32}  {'type':<11}  {'latest':>6}  {'id':>5}  mode"]
    for s in found:
        lines.append(
            f"{s.subject:<32}  {s.schema_type:<11}  {s.latest_version:>6}  {s.schema_id:>5}  "
            f"{s.compatibility_mode}"
        )
    return "\n".join(lines)


def check_text(subject: str, answer: pb.CheckCompatibilityResponse) -> str:
    if answer.is_compatible:
        return f"{subject}: compatible"
    return "\n".join([f"{subject}: NOT compatible", *(f"  {error}" for error in answer.errors)])


async def register(args: argparse.Namespace) -> int:
    from danube.client import DanubeClient

    async with DanubeClient(
        args.service_addr, security=security_of(args, CLIENT_ENV_PREFIX)
    ) as client:
        answer = await client.schemas.register(
            args.subject, args.type, read_input(args.file),
            description=args.description, created_by="danube-cli", tags=args.tag or (),
        )  # fmt: skip
    print(registered_text(args.subject, answer))
    return 0


async def show(args: argparse.Namespace) -> int:
    from danube.client import DanubeClient

    async with DanubeClient(
        args.service_addr, security=security_of(args, CLIENT_ENV_PREFIX)
    ) as client:
        schema = await client.schemas.latest(args.subject)
        if args.version is not None and args.version != schema.version:
            schema = await client.schemas.get(schema.schema_id, args.version)
    if args.output == "json":
        fields = schema.to_pydict()
        fields["schema_definition"] = definition_text(schema)
        print(json.dumps(fields, ensure_ascii=False, default=str))
        return 0
    print(schema_header(schema), file=sys.stderr)
    print(definition_text(schema))
    return 0


async def versions(args: argparse.Namespace) -> int:
    from danube.client import DanubeClient

    async with DanubeClient(
        args.service_addr, security=security_of(args, CLIENT_ENV_PREFIX)
    ) as client:
        found = await client.schemas.versions(args.subject)
    print(versions_text(found))
    return 0


async def subjects(args: argparse.Namespace) -> int:
    from danube.client import DanubeClient

    async with DanubeClient(
        args.service_addr, security=security_of(args, CLIENT_ENV_PREFIX)
    ) as client:
        found = await client.schemas.subjects()
    print(subjects_text(found))
    return 0


async def check(args: argparse.Namespace) -> int:
    """Exit status 1 when the schema would be refused, so scripts and CI can gate on it."""
    from danube.client import DanubeClient

    async with DanubeClient(
        args.service_addr, security=security_of(args, CLIENT_ENV_PREFIX)
    ) as client:
        answer = await client.schemas.check(
            args.subject, args.type, read_input(args.file), args.mode
        )
    print(check_text(args.subject, answer))
    return 0 if answer.is_compatible else 1


async def mode(args: argparse.Namespace) -> int:
    """On the admin port: a subject's mode is the operator's (spec/protocol.md, Ports)."""
    from danube.client import DanubeClient

    async with DanubeClient(
        args.admin_addr, security=security_of(args, CLIENT_ENV_PREFIX, args.admin_addr)
    ) as client:
        answer = await client.schemas.set_mode(args.subject, args.mode)
    print(answer.message)
    return 0


async def delete(args: argparse.Namespace) -> int:
    """On the admin port, as `mode`."""
    from danube.client import DanubeClient

    async with DanubeClient(
        args.admin_addr, security=security_of(args, CLIENT_ENV_PREFIX, args.admin_addr)
    ) as client:
        answer = await client.schemas.delete_version(args.subject, args.version)
    print(answer.message)
    return 0


def add_schema_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    schema = commands.add_parser("schema", help="register, show and check schemas")
    actions = schema.add_subparsers(dest="action", required=True)

    def action(
        name: str,
        help_text: str,
        run: object,
        *,
        admin: bool = False,
        aliases: Sequence[str] = (),
    ) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help_text, aliases=list(aliases))
        if admin:
            sub.add_argument(
                "-a", "--admin-addr", default=DEFAULT_ADMIN,
                help="the broker's admin port URL, which alone changes a subject's rules "
                f"(default {DEFAULT_ADMIN})",
            )  # fmt: skip
            add_tls_arguments(sub, CLIENT_ENV_PREFIX)
        else:
            add_service_addr(sub)
        sub.set_defaults(run=run)
        return sub

    def definition(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("subject")
        sub.add_argument("-t", "--type", required=True, choices=TYPES, help="schema type")
        sub.add_argument("-f", "--file", type=Path, required=True, help="the schema's file")

    sub = action("register", "register a schema (a new version if it changed)", register)
    definition(sub)
    sub.add_argument("--description", default="")
    sub.add_argument("--tag", action="append", help="a tag (repeatable)")
    sub = action(
        "show",
        "print a version's definition (the latest by default); `get` is Danube's spelling",
        show,
        aliases=("get",),
    )
    sub.add_argument("subject")
    sub.add_argument("-v", "--version", type=int, help="this version (default: the latest)")
    sub.add_argument(
        "-o", "--output", choices=("table", "json"), default="table",
        help="table: what the version is on stderr and its definition alone on stdout "
        "(default); json: the registry's whole answer as one JSON object on stdout",
    )  # fmt: skip
    sub = action("versions", "list a subject's live versions", versions)
    sub.add_argument("subject")
    action("list", "list every subject", subjects)
    sub = action(
        "check",
        "is this schema compatible under the subject's mode, or --mode? (exit 1 if not)",
        check,
    )
    definition(sub)
    sub.add_argument("--mode", choices=MODES, help="judge under this mode instead of the subject's")
    sub = action("mode", "set a subject's compatibility mode (admin port)", mode, admin=True)
    sub.add_argument("subject")
    sub.add_argument("mode", choices=MODES)
    sub = action(
        "delete", "delete one version (its number is never reused; admin port)", delete, admin=True
    )
    sub.add_argument("subject")
    sub.add_argument("version", type=int)
