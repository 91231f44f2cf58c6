"""The admin operations as MCP tools, made from `danube-admin`'s own command tree.

Each leaf command of `danube-admin` (its argparse parser and handler) is one tool: the
tool's input schema is the command's arguments, a call is parsed by that command's parser
(the same checks, the same messages) and run by that command's handler, and the result is
the data `-o json` prints. So the tools and the CLI cannot drift apart: a command added to
the CLI is a tool, under Danube's MCP name where Danube has one (`DANUBE_NAMES`,
../shared/danube-reference.md §10.4) and `<action>_<group>` otherwise.

Left out on purpose: `completion` (a shell script, not an operation), and arguments that
read the server's own files (`--file` of `schemas register|check`: a tool client passes the
schema text, and an MCP server reached over HTTP must not read files for its callers).
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from danube.cli.admin_args import Handler
from danube.cli.admin_call import AdminClient, AdminError
from danube.cli.admin_render import Result
from danube.client.security import ClientSecurity

DANUBE_NAMES: Mapping[tuple[str, str], str] = {
    ("brokers", "list"): "list_brokers",
    ("brokers", "leader-broker"): "get_leader",
    ("brokers", "namespaces"): "list_namespaces",
    ("brokers", "unload"): "unload_broker",
    ("brokers", "activate"): "activate_broker",
    ("brokers", "balance"): "get_cluster_balance",
    ("brokers", "rebalance"): "trigger_rebalance",
    ("namespaces", "policies"): "get_namespace_policies",
    ("namespaces", "create"): "create_namespace",
    ("namespaces", "delete"): "delete_namespace",
    ("topics", "list"): "list_topics",
    ("topics", "create"): "create_topic",
    ("topics", "delete"): "delete_topic",
    ("topics", "unload"): "unload_topic",
    ("topics", "subscriptions"): "list_subscriptions",
    ("topics", "describe"): "describe_topic",
    ("topics", "unsubscribe"): "unsubscribe",
    ("topics", "set-failure-policy"): "set_subscription_failure_policy",
    ("topics", "get-failure-policy"): "get_subscription_failure_policy",
    ("topics", "configure-schema"): "configure_topic_schema",
    ("topics", "set-validation-policy"): "set_topic_validation_policy",
    ("topics", "get-schema-config"): "get_topic_schema_config",
    ("schemas", "register"): "register_schema",
    ("schemas", "get"): "get_schema",
    ("schemas", "versions"): "list_schema_versions",
    ("schemas", "check"): "check_schema_compatibility",
    ("schemas", "get-compatibility"): "get_schema_compatibility_mode",
    ("schemas", "set-compatibility"): "set_schema_compatibility_mode",
    ("schemas", "delete"): "delete_schema_version",
    ("schemas", "list-subjects"): "list_subjects",
    ("cluster", "status"): "cluster_status",
    ("cluster", "add-node"): "add_cluster_node",
    ("cluster", "promote-node"): "promote_cluster_node",
    ("cluster", "remove-node"): "remove_cluster_node",
}
"""Danube's MCP tool names for our commands."""

OUR_NAMES: Mapping[tuple[str, str], str] = {
    ("namespaces", "topics"): "list_namespace_topics",
    ("namespaces", "set-policies"): "set_namespace_policies",
    ("namespaces", "replication-factor"): "namespace_replication_factor",
    ("topics", "get-policies"): "get_topic_policies",
    ("topics", "set-policies"): "set_topic_policies",
    ("topics", "clear-policies"): "clear_topic_policies",
    ("topics", "replication-factor"): "topic_replication_factor",
    ("topics", "set-dispatch-config"): "set_subscription_dispatch_config",
    ("topics", "get-dispatch-config"): "get_subscription_dispatch_config",
    ("brokers", "memory"): "get_broker_memory",
    ("topics", "blocked"): "list_blocked_messages",
    ("topics", "release"): "release_blocked_message",
    ("topics", "skip"): "skip_blocked_message",
    ("topics", "clear-failure-policy"): "clear_subscription_failure_policy",
}
"""Names of the commands Danube has no tool for, in the same style."""

SECURITY_NAMES: Mapping[tuple[str, ...], str] = {
    ("security", "roles", "create"): "create_role",
    ("security", "roles", "get"): "get_role",
    ("security", "roles", "list"): "list_roles",
    ("security", "roles", "delete"): "delete_role",
    ("security", "bindings", "create"): "create_binding",
    ("security", "bindings", "get"): "get_binding",
    ("security", "bindings", "list"): "list_bindings",
    ("security", "bindings", "delete"): "delete_binding",
}
"""Danube's names of the three-word commands offered as tools. `security tokens create|
validate` are not: they take signing keys and key files, which an MCP caller must not hand
to (or make read on) the server's host."""

SKIPPED_COMMANDS = frozenset({("completion",), ("serve",)})
SKIPPED_DESTS = frozenset({"help", "output", "file"})
DESTRUCTIVE = frozenset(
    {"delete", "unload", "remove-node", "unsubscribe", "clear-policies", "skip"}
)
READ_ONLY_ACTIONS = frozenset(
    {
        "list", "leader-broker", "namespaces", "balance", "topics", "policies", "subscriptions",
        "describe", "get-policies", "get-failure-policy", "get-dispatch-config",
        "get-schema-config", "get", "versions", "check", "get-compatibility", "list-subjects",
        "status", "blocked", "memory",
    }
)  # fmt: skip


class ToolInputError(Exception):
    """Arguments the command refuses: the message is what the CLI would print."""


@dataclass(frozen=True)
class AdminTool:
    """One `danube-admin` command as an MCP tool."""

    name: str
    command: tuple[str, ...]
    description: str
    parser: argparse.ArgumentParser
    arguments: tuple[argparse.Action, ...]
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool

    def argv(self, values: Mapping[str, Any]) -> list[str]:
        """The command line that gives the command `values` (JSON arguments by dest)."""
        unknown = sorted(set(values) - {a.dest for a in self.arguments})
        if unknown:
            raise ToolInputError(f"{self.name}: unknown argument(s) {', '.join(unknown)}")
        positional: list[str] = []
        optional: list[str] = []
        for action in self.arguments:
            if action.dest not in values or values[action.dest] is None:
                continue
            value = values[action.dest]
            if not action.option_strings:
                positional.append(_text(value))
            elif action.nargs == 0:
                if value is True:
                    optional.append(action.option_strings[-1])
                elif value is not False:
                    raise ToolInputError(f"{self.name}: {action.dest} must be true or false")
            else:
                optional += [action.option_strings[-1], _text(value)]
        # `--` keeps a positional value that starts with a dash from reading as an option
        return [*optional, "--", *positional] if positional else optional

    def parse(self, values: Mapping[str, Any]) -> argparse.Namespace:
        """The command's own parser checks the arguments; its usage error is the refusal."""
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                return self.parser.parse_args(self.argv(values))
        except SystemExit:
            lines = [line for line in errors.getvalue().splitlines() if ": error: " in line]
            reason = lines[-1].split(": error: ", 1)[1] if lines else "invalid arguments"
            raise ToolInputError(f"{self.name}: {reason}") from None

    async def run(
        self,
        endpoint: str,
        timeout_s: float,
        values: Mapping[str, Any],
        security: ClientSecurity | None = None,
    ) -> Result:
        args = self.parse(values)
        args.endpoint, args.timeout, args.output = endpoint, timeout_s, "json"
        handler: Handler = args.run
        client = AdminClient(endpoint, timeout_s, security)
        try:
            return await handler(client, args)
        finally:
            client.close()


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _schema(action: argparse.Action) -> dict[str, Any]:
    if action.nargs == 0:
        schema: dict[str, Any] = {"type": "boolean"}
    elif action.type is int or getattr(action.type, "__name__", "") in ("count", "positive"):
        schema = {"type": "integer", "minimum": 1 if action.type.__name__ == "positive" else 0}
    elif action.type is float:
        schema = {"type": "number"}
    else:
        schema = {"type": "string"}
    if action.choices is not None:
        schema["enum"] = list(action.choices)
    if action.help and action.help is not argparse.SUPPRESS:
        schema["description"] = action.help % {"default": action.default}
    return schema


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*path, name))
            return
    yield path, parser


def admin_tools(parser: argparse.ArgumentParser) -> list[AdminTool]:
    """Every command of the `danube-admin` parser `parser` as a tool."""
    tools = []
    for path, leaf in _leaves(parser):
        if path in SKIPPED_COMMANDS or (len(path) != 2 and path not in SECURITY_NAMES):
            continue
        arguments = tuple(a for a in leaf._actions if a.dest not in SKIPPED_DESTS)
        properties = {a.dest: _schema(a) for a in arguments}
        required = sorted(a.dest for a in arguments if a.required)
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        schema["additionalProperties"] = False
        key = (path[0], path[1])
        name = (
            SECURITY_NAMES.get(path)
            or DANUBE_NAMES.get(key)
            or OUR_NAMES.get(key)
            or "_".join(path).replace("-", "_")
        )
        described = (leaf.description or "").rstrip(".")
        needs = (leaf.epilog or "").strip()
        tools.append(
            AdminTool(
                name=name,
                command=path,
                description=f"{described} (danube-admin {' '.join(path)}). {needs}".strip(),
                parser=leaf,
                arguments=arguments,
                input_schema=schema,
                read_only=path[-1] in READ_ONLY_ACTIONS,
                destructive=path[-1] in DESTRUCTIVE,
            )
        )
    names = [tool.name for tool in tools]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise RuntimeError(f"two commands make the same MCP tool name: {duplicated}")
    return tools


def refusal(error: AdminError | ToolInputError) -> str:
    """What a failed tool call says: the CLI's own one-line message, never a traceback."""
    return str(error)
