"""`danube-cli`: produce, consume (Danube's flags), drive load for an audit, and manage
schemas from the command line. The commands live in `client_commands`, imported when one
runs: `--help` and a usage error load no client (issue 26)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from danube.cli.schema import TYPES, add_schema_commands
from danube.cli.usage import (
    EXIT_USAGE,
    BadInput,
    UsageError,
    add_completion_command,
    add_service_addr,
    add_version,
    completion_script,
)

DEFAULT_TOPIC = "/default/test_topic"


def _command(name: str) -> Callable[[argparse.Namespace], Awaitable[int]]:
    """The handler `client_commands.<name>`, imported when the command runs."""

    async def run(args: argparse.Namespace) -> int:
        from danube.cli import client_commands

        handler: Callable[[argparse.Namespace], Awaitable[int]] = getattr(client_commands, name)
        return await handler(args)

    run.__name__ = name
    return run


def _sub_type(text: str) -> str:
    from danube.client.consumer import SubType

    try:
        SubType.named(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _start_position(text: str) -> str | int:
    if text in ("latest", "earliest"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError("expected latest, earliest or an offset (a number)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danube-cli",
        description="Produce to and consume from a Danube broker, drive load for an audit, "
        "and manage schemas.",
        epilog="Exit status: 0 done, 1 the broker refused or the input did not fit, 2 bad usage.",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        add_service_addr(sub)
        sub.add_argument(
            "-t", "--topic", default=DEFAULT_TOPIC, help=f"topic (default {DEFAULT_TOPIC})"
        )

    prod = commands.add_parser("produce", help="send messages")
    common(prod)
    prod.add_argument("-n", "--producer-name", default="test_producer")
    prod.add_argument("-m", "--message", help="payload text")
    prod.add_argument("-f", "--file", type=Path, help="payload from a file (wins over -m)")
    prod.add_argument("-a", "--attributes", help='attributes as "k1:v1,k2:v2"')
    prod.add_argument("-k", "--key", help="routing key (Key-Shared routing, partition choice)")
    prod.add_argument(
        "-p", "--partitions", type=int, default=0, help="number of partitions (0: none)"
    )
    prod.add_argument("-c", "--count", type=int, default=1, help="messages to send (default 1)")
    prod.add_argument(
        "-i", "--interval", type=int, default=0, help="milliseconds between sends (default 0)"
    )
    prod.add_argument("--reliable", action="store_true", help="reliable (persistent) topic")
    prod.add_argument(
        "--schema-subject",
        help="write with this subject's schema (latest version unless pinned); the payload "
        "is checked against it first (JSON Schema: JSON, sent as given; Avro: JSON, sent "
        "as one binary datum)",
    )
    prod.add_argument(
        "--schema-version", type=int, metavar="N", help="pin version N of --schema-subject"
    )
    prod.add_argument(
        "--schema-min-version", type=int, metavar="N",
        help="fail unless the latest version of --schema-subject is N or later",
    )  # fmt: skip
    prod.add_argument(
        "--schema-file", type=Path,
        help="register this schema (under --schema-subject, or <namespace>-<topic>) and "
        "write with it",
    )  # fmt: skip
    prod.add_argument("--schema-type", choices=TYPES, help="the type of --schema-file")
    prod.set_defaults(run=_command("produce"))

    cons = commands.add_parser(
        "consume",
        help="receive (and acknowledge) messages",
        description="Receive and acknowledge messages, printing one line each. A message "
        "written with a schema is checked against the version it names (Avro is shown as "
        "JSON); one that does not fit is marked INVALID with the reason.",
    )
    common(cons)
    cons.add_argument("-n", "--consumer", default="consumer_pubsub", help="consumer name")
    cons.add_argument("-m", "--subscription", required=True, help="subscription name")
    cons.add_argument(
        "--sub-type", type=_sub_type, default="shared",
        metavar="{exclusive,shared,failover,key-shared}",
        help="subscription type, also spelled fail-over or key_shared (default shared)",
    )  # fmt: skip
    cons.add_argument("--key-filter", action="append", help="Key-Shared glob filter (repeatable)")
    cons.add_argument(
        "--start", type=_start_position, metavar="latest|earliest|OFFSET",
        help="where a new subscription starts (default: latest; an existing one resumes "
        "where it left off)",
    )  # fmt: skip
    cons.add_argument("-c", "--count", type=int, help="stop after this many messages")
    cons.add_argument(
        "-o", "--output", choices=("text", "json"), default="text",
        help="text: one readable line a message (default); json: one JSON object a line with "
        "the payload (UTF-8 text, else base64), attributes, topic, offset and id fields",
    )  # fmt: skip
    cons.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not print messages; show a progress line instead",
    )  # fmt: skip
    cons.set_defaults(run=_command("consume"))

    gen = commands.add_parser(
        "load",
        help="drive producers and consumers at a set rate and log what they were told and "
        "received, for an audit (spark/README.md)",
    )
    add_service_addr(gen)
    gen.add_argument("--logs", type=Path, required=True, help="directory for the Parquet logs")
    gen.add_argument(
        "--topic-prefix", default="",
        help="topics are <prefix>-0, <prefix>-1, ... (default /default/load-<run id>); "
        "generators running at once need prefixes of their own",
    )  # fmt: skip
    gen.add_argument(
        "--subscription-prefix", default="",
        help="subscriptions are <prefix>-<type>, e.g. soak-exclusive (default load-<run id>); "
        "one that exists already is resumed where it left off",
    )  # fmt: skip
    gen.add_argument("--topics", type=int, default=1, help="number of topics (default 1)")
    gen.add_argument(
        "-p", "--partitions", type=int, default=0, help="partitions per topic (default 0: none)"
    )
    gen.add_argument("--producers", type=int, default=1, help="producers per topic (default 1)")
    gen.add_argument(
        "-c", "--messages", type=int, default=1000, help="messages in all (default 1000)"
    )
    gen.add_argument(
        "-r", "--rate", type=float, default=100.0,
        help="messages per second in all; each producer sends one at a time on a schedule "
        "and catches up after a slow acknowledgement (default 100)",
    )  # fmt: skip
    gen.add_argument(
        "--payload-bytes", type=int, default=128,
        help="payload size, at least the producer name and sequence number (default 128)",
    )  # fmt: skip
    gen.add_argument(
        "--keys", type=int, default=0, help="routing keys per producer (default 0: no key)"
    )
    gen.add_argument(
        "--subscriptions", default="exclusive,shared",
        help="subscription types, one subscription each, comma-separated from exclusive, "
        "shared, failover, key_shared (or key-shared, fail-over; default exclusive,shared)",
    )  # fmt: skip
    gen.add_argument(
        "--consumers", type=int, default=2,
        help="consumers per subscription; an Exclusive one has one (default 2)",
    )  # fmt: skip
    gen.add_argument(
        "--non-reliable", action="store_true",
        help="non-reliable topics (default: reliable, at-least-once)",
    )  # fmt: skip
    gen.add_argument(
        "--drain", type=float, default=30.0,
        help="seconds to wait for deliveries without progress after the last "
        "acknowledgement (default 30)",
    )  # fmt: skip
    gen.add_argument(
        "--duration", type=float, default=0.0,
        help="stop sending after this many seconds from the start, whatever is left of "
        "--messages, then drain (default 0: send them all)",
    )  # fmt: skip
    gen.add_argument(
        "--topics-per-connection", type=int, default=100,
        help="topics whose producers and consumers share one client connection (default 100)",
    )  # fmt: skip
    gen.set_defaults(run=_command("load"))

    add_schema_commands(commands)
    add_completion_command(commands, "danube-cli")
    return parser


def _run(run: Callable[[argparse.Namespace], object], args: argparse.Namespace) -> int:
    """Runs the command; Ctrl-C and SIGTERM stop it cleanly (exit 130 / 143)."""

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        stopped: list[int] = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, lambda s=signum: (stopped.append(s), task.cancel()))
        try:
            return await run(args)  # type: ignore[misc]
        except asyncio.CancelledError:
            if stopped:
                return 128 + stopped[0]
            raise

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 the broker refused or could not be reached, or the input did not
    fit (a payload its schema rejects), 2 bad usage (as argparse's own errors), 130/143 when
    stopped by Ctrl-C or SIGTERM."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "completion":
        print(completion_script(parser, args.shell))
        return 0
    from danube.client.errors import DanubeClientError

    try:
        return _run(args.run, args)
    except UsageError as error:
        print(f"danube-cli: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (DanubeClientError, BadInput) as error:
        print(f"danube-cli: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"danube-cli: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
