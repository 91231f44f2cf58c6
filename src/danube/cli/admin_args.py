"""How `danube-admin` commands are declared: each leaf says what it does and which admin RPC
(and broker mode) it needs, takes `--output` after its name as Danube's CLI does, and names
its handler."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

from danube.cli.admin_call import AdminClient, BadUsage
from danube.cli.admin_render import OUTPUTS, Result

Handler = Callable[[AdminClient, argparse.Namespace], Awaitable[Result]]
Actions = argparse._SubParsersAction  # type: ignore[type-arg]

DEFAULT_NAMESPACE = "default"


def group(commands: Actions, name: str, help_text: str) -> Actions:
    parser = commands.add_parser(name, help=help_text, description=help_text)
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION")


def command(
    actions: Actions, name: str, help_text: str, run: Handler, needs: str
) -> argparse.ArgumentParser:
    """`needs` names what the broker must offer, shown at the end of `--help`."""
    parser = actions.add_parser(
        name,
        help=help_text,
        description=help_text[0].upper() + help_text[1:] + ".",
        epilog=f"Broker: needs {needs}.",
    )
    parser.add_argument(
        "-o", "--output", choices=OUTPUTS, default=argparse.SUPPRESS,
        help="table for people (default) or json for scripts",
    )  # fmt: skip
    parser.set_defaults(run=run)
    return parser


def count(text: str) -> int:
    """An argparse type: a whole number, zero or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected zero or more, not {value}")
    return value


def positive(text: str) -> int:
    value = count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected 1 or more")
    return value


def add_topic(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", help="/namespace/topic, or a topic name with --namespace")
    parser.add_argument(
        "-n", "--namespace",
        help=f"the namespace of a topic given by name alone (default {DEFAULT_NAMESPACE})",
    )  # fmt: skip


def topic_name(args: argparse.Namespace) -> str:
    """`/ns/topic` as given, or `/<--namespace>/<topic>`, as Danube's CLI resolves them."""
    given: str = args.topic
    namespace = getattr(args, "namespace", None)
    if given.startswith("/"):
        parts = given.split("/")
        if len(parts) != 3 or not all(parts[1:]):
            raise BadUsage(f"invalid topic {given!r}: expected /namespace/topic")
        if namespace and namespace != parts[1]:
            raise BadUsage(f"topic {given} is not in namespace {namespace}")
        return given
    if not given or "/" in given:
        raise BadUsage(f"invalid topic {given!r}: expected /namespace/topic or a bare name")
    return f"/{namespace or DEFAULT_NAMESPACE}/{given}"


def add_subscription(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-s", "--subscription", required=True, help="the subscription's name")
