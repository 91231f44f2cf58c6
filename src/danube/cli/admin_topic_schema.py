"""`danube-admin topics` commands binding a topic to a schema subject and choosing how its
messages are checked against it (SchemaRegistry's topic RPCs, on the admin port)."""

from __future__ import annotations

import argparse

from danube.cli.admin_args import Actions, add_topic, command, topic_name
from danube.cli.admin_call import AdminClient, require_success
from danube.cli.admin_render import Result, fields, plain
from danube.proto import danube_schema as pb

POLICIES = ("none", "warn", "enforce")


def _payload_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--enable-payload-validation", action="store_true",
        help="also check every payload against the schema (default: only its schema id)",
    )  # fmt: skip


async def configure(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    what = f"configure schema of {name}"
    request = pb.ConfigureTopicSchemaRequest(
        topic_name=name,
        schema_subject=args.subject,
        validation_policy=args.validation_policy,
        enable_payload_validation=args.enable_payload_validation,
    )
    answer = await client.call(what, client.schemas.configure_topic_schema(request))
    require_success(what, answer.success, answer.message)
    done = f"Bound {name} to subject {args.subject} (validation {args.validation_policy})"
    return Result(plain(answer), done)


async def set_validation(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    what = f"set validation policy of {name}"
    request = pb.UpdateTopicValidationPolicyRequest(
        topic_name=name,
        validation_policy=args.policy,
        enable_payload_validation=args.enable_payload_validation,
    )
    answer = await client.call(what, client.schemas.update_topic_validation_policy(request))
    require_success(what, answer.success, answer.message)
    return Result(plain(answer), f"Set validation policy of {name} to {args.policy}")


async def get_config(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    request = pb.GetTopicSchemaConfigRequest(topic_name=name)
    answer = await client.call(
        f"schema config of {name}", client.schemas.get_topic_schema_config(request)
    )
    text = fields(
        [
            ("topic", name),
            ("schema_subject", answer.schema_subject),
            ("schema_id", answer.schema_id or None),
            ("validation_policy", answer.validation_policy),
            ("enable_payload_validation", answer.enable_payload_validation),
        ]
    )
    return Result(plain(answer), text)


def add_topic_schema_commands(actions: Actions) -> None:
    sub = command(
        actions, "configure-schema", "bind a topic to a schema subject and set its validation",
        configure, "SchemaRegistry/ConfigureTopicSchema on the admin port",
    )  # fmt: skip
    add_topic(sub)
    sub.add_argument("--subject", required=True, help="a registered schema subject")
    sub.add_argument("--validation-policy", choices=POLICIES, default="warn",
                     help="what a message without the subject's schema gets: accepted (none), "
                     "accepted and counted (warn, the default) or refused (enforce)")  # fmt: skip
    _payload_flag(sub)

    sub = command(
        actions, "set-validation-policy", "change how a topic's messages are validated",
        set_validation, "SchemaRegistry/UpdateTopicValidationPolicy on the admin port",
    )  # fmt: skip
    add_topic(sub)
    sub.add_argument("--policy", required=True, choices=POLICIES, help="none, warn or enforce")
    _payload_flag(sub)

    sub = command(
        actions, "get-schema-config", "show a topic's schema subject and validation",
        get_config, "SchemaRegistry/GetTopicSchemaConfig on the admin port",
    )  # fmt: skip
    add_topic(sub)
