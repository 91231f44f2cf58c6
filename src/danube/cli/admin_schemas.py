"""`danube-admin schemas ...`: the schema registry over the admin port, with Danube's
admin CLI flags; the people's output is `danube-cli schema`'s (danube.cli.schema)."""

from __future__ import annotations

import argparse
from pathlib import Path

from danube.cli.admin_args import Actions, command, group, positive
from danube.cli.admin_call import AdminClient, BadUsage
from danube.cli.admin_render import Result, plain, table
from danube.cli.schema import (
    MODES,
    TYPES,
    check_text,
    definition_text,
    registered_text,
    schema_header,
    subjects_text,
    versions_text,
)
from danube.cli.usage import UsageError, read_input
from danube.proto import danube_schema as pb

REGISTRY = "the SchemaRegistry service on the admin port"


def _definition(args: argparse.Namespace) -> bytes:
    if args.schema is not None:
        return args.schema.encode()
    try:
        return read_input(args.file)
    except UsageError as error:
        raise BadUsage(str(error)) from None


def _add_definition(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schema-type", required=True, choices=TYPES, help="the schema's type")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("-f", "--file", type=Path, help="the schema's file")
    source.add_argument("--schema", help="the schema's text itself")


async def register(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.RegisterSchemaRequest(
        subject=args.subject,
        schema_type=args.schema_type,
        schema_definition=_definition(args),
        description=args.description,
        created_by="danube-admin",
        tags=args.tags or [],
    )
    answer = await client.call(f"register {args.subject}", client.schemas.register_schema(request))
    return Result(plain(answer), registered_text(args.subject, answer))


async def get(client: AdminClient, args: argparse.Namespace) -> Result:
    if args.subject is not None:
        if args.version is not None:
            raise BadUsage("--version goes with --id; --subject gets the latest version")
        request = pb.GetLatestSchemaRequest(subject=args.subject)
        call = client.schemas.get_latest_schema(request)
        what = f"latest schema of {args.subject}"
    else:
        call = client.schemas.get_schema(pb.GetSchemaRequest(args.id, args.version))
        what = f"schema {args.id}" + (f" version {args.version}" if args.version else "")
    schema = await client.call(what, call)
    return Result(plain(schema), f"{schema_header(schema)}\n\n{definition_text(schema)}")


async def versions(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.ListVersionsRequest(subject=args.subject)
    answer = await client.call(f"versions of {args.subject}", client.schemas.list_versions(request))
    return Result(plain(answer), versions_text(answer.versions))


async def check(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.CheckCompatibilityRequest(
        subject=args.subject,
        new_schema_definition=_definition(args),
        schema_type=args.schema_type,
        compatibility_mode=args.mode,
    )
    answer = await client.call(f"check {args.subject}", client.schemas.check_compatibility(request))
    failed = 0 if answer.is_compatible else 1
    return Result(plain(answer), check_text(args.subject, answer), failed)


async def get_compatibility(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.GetLatestSchemaRequest(subject=args.subject)
    schema = await client.call(
        f"compatibility mode of {args.subject}", client.schemas.get_latest_schema(request)
    )
    data = {"subject": schema.subject, "compatibility_mode": schema.compatibility_mode}
    return Result(data, f"{schema.subject}: {schema.compatibility_mode}")


async def set_compatibility(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.SetCompatibilityModeRequest(subject=args.subject, compatibility_mode=args.mode)
    answer = await client.call(
        f"set compatibility mode of {args.subject}", client.schemas.set_compatibility_mode(request)
    )
    return Result(plain(answer), answer.message or f"Set {args.subject} to {args.mode}")


async def delete(client: AdminClient, args: argparse.Namespace) -> Result:
    if not args.confirm:
        raise BadUsage(
            f"deleting version {args.version} of {args.subject} cannot be undone: add --confirm"
        )
    request = pb.DeleteSchemaVersionRequest(subject=args.subject, version=args.version)
    answer = await client.call(
        f"delete {args.subject} version {args.version}",
        client.schemas.delete_schema_version(request),
    )
    done = answer.message or f"Deleted version {args.version} of {args.subject}"
    return Result(plain(answer), done)


async def list_subjects(client: AdminClient, _: argparse.Namespace) -> Result:
    answer = await client.call(
        "list subjects", client.schemas.list_subjects(pb.ListSubjectsRequest())
    )
    if not answer.subjects:
        return Result(plain(answer), table(("subject",), [], "no subjects registered"))
    return Result(plain(answer), subjects_text(answer.subjects))


def add_schemas_commands(commands: Actions) -> None:
    actions = group(commands, "schemas", "register, inspect and check schemas")

    sub = command(actions, "register", "register a schema (a new version if it changed)",
                  register, f"SchemaRegistry/RegisterSchema, {REGISTRY}")  # fmt: skip
    sub.add_argument("subject")
    _add_definition(sub)
    sub.add_argument("--description", default="", help="stored with the version")
    sub.add_argument("--tags", action="append", help="a tag (repeatable)")

    sub = command(actions, "get", "show a schema version and its definition", get,
                  f"SchemaRegistry/GetLatestSchema or GetSchema, {REGISTRY}")  # fmt: skip
    which = sub.add_mutually_exclusive_group(required=True)
    which.add_argument("--subject", help="the subject's latest version")
    which.add_argument("--id", type=positive, help="the schema id (every version of a subject)")
    sub.add_argument("--version", type=positive, help="this version of --id (default: latest)")

    sub = command(actions, "versions", "list a subject's live versions", versions,
                  f"SchemaRegistry/ListVersions, {REGISTRY}")  # fmt: skip
    sub.add_argument("subject")

    sub = command(
        actions, "check",
        "is this schema compatible under the subject's mode, or --mode? (exit 1 if not)",
        check, f"SchemaRegistry/CheckCompatibility, {REGISTRY}",
    )  # fmt: skip
    sub.add_argument("subject")
    _add_definition(sub)
    sub.add_argument("--mode", choices=MODES, help="judge under this mode instead")

    sub = command(actions, "get-compatibility", "show a subject's compatibility mode",
                  get_compatibility, f"SchemaRegistry/GetLatestSchema, {REGISTRY}")  # fmt: skip
    sub.add_argument("subject")

    sub = command(
        actions, "set-compatibility", "set a subject's compatibility mode",
        set_compatibility, f"SchemaRegistry/SetCompatibilityMode, {REGISTRY}",
    )  # fmt: skip
    sub.add_argument("subject")
    sub.add_argument("--mode", required=True, choices=MODES)

    sub = command(actions, "delete", "delete one version (its number is never reused)", delete,
                  f"SchemaRegistry/DeleteSchemaVersion, {REGISTRY}")  # fmt: skip
    sub.add_argument("subject")
    sub.add_argument("--version", type=positive, required=True)
    sub.add_argument("--confirm", action="store_true", help="yes, delete it")

    command(actions, "list-subjects", "list every subject", list_subjects,
            f"SchemaRegistry/ListSubjects, {REGISTRY}")  # fmt: skip
