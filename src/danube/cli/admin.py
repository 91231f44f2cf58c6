"""`danube-admin`: the operator's tool, with Danube's command structure (brokers, namespaces,
topics, schemas, cluster) over a broker's admin port.

Exit status: 0 done, 1 the broker refused (its status and message are printed), 2 bad usage,
3 the broker could not be reached."""

from __future__ import annotations

import argparse
import os
import sys

from danube.cli.admin_args import Handler
from danube.cli.admin_brokers import add_broker_commands
from danube.cli.admin_call import DEFAULT_ENDPOINT, ENDPOINT_ENV, AdminClient, AdminError
from danube.cli.admin_cluster import add_cluster_commands
from danube.cli.admin_namespaces import add_namespace_commands
from danube.cli.admin_render import OUTPUTS, Result, render
from danube.cli.admin_schemas import add_schemas_commands
from danube.cli.admin_security import add_security_commands
from danube.cli.admin_serve import add_serve_command, serve
from danube.cli.admin_topics import add_topic_commands
from danube.cli.usage import (
    ADMIN_ENV_PREFIX,
    add_completion_command,
    add_tls_arguments,
    add_version,
    completion_script,
    security_of,
)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("expected more than 0 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danube-admin",
        description="Manage Danube brokers, namespaces, topics and schemas over a broker's "
        "admin port.",
        epilog="Exit status: 0 done, 1 the broker refused, 2 bad usage, 3 broker unreachable.",
    )
    add_version(parser)
    parser.add_argument(
        "--endpoint", default=os.environ.get(ENDPOINT_ENV, DEFAULT_ENDPOINT),
        help=f"the broker's admin URL (env {ENDPOINT_ENV}; default {DEFAULT_ENDPOINT})",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", choices=OUTPUTS, default="table",
        help="table for people (default) or json for scripts; also accepted after the command",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=_seconds, default=10.0, help="seconds to wait for each call (default 10)"
    )
    add_tls_arguments(parser, ADMIN_ENV_PREFIX)
    commands = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    add_broker_commands(commands)
    add_namespace_commands(commands)
    add_topic_commands(commands)
    add_schemas_commands(commands)
    add_cluster_commands(commands)
    add_security_commands(commands)
    add_serve_command(commands)
    add_completion_command(commands, "danube-admin")
    return parser


async def _run(run: Handler, endpoint: str, timeout_s: float, args: argparse.Namespace) -> Result:
    offline = getattr(args, "offline", False)  # security tokens: no broker, no TLS files
    security = None if offline else security_of(args, ADMIN_ENV_PREFIX, endpoint)
    client = AdminClient(endpoint, timeout_s, security)
    try:
        return await run(client, args)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.group == "completion":
        print(completion_script(parser, args.shell))
        return 0
    if getattr(args, "serve", False):
        return serve(parser, args)
    try:
        import asyncio

        result = asyncio.run(_run(args.run, args.endpoint, args.timeout, args))
    except AdminError as error:
        print(f"danube-admin: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    print(render(result, args.output))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
