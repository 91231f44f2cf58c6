"""The MCP tools are `danube-admin`'s own commands (danube.admin_mcp.tools): one tool per
command, Danube's names, input schemas from the command's arguments, and calls checked by the
command's own parser."""

from __future__ import annotations

import re

import pytest

from danube.admin_mcp.tools import DANUBE_NAMES, ToolInputError, admin_tools
from danube.cli.admin import build_parser

TOOLS = {tool.name: tool for tool in admin_tools(build_parser())}


def test_every_command_is_a_tool_under_a_deliberate_name() -> None:
    commands = {tool.command for tool in TOOLS.values()}
    assert ("completion",) not in commands and ("serve",) not in commands
    assert set(DANUBE_NAMES.values()) <= set(TOOLS)
    assert {"list_brokers", "describe_topic", "set_subscription_failure_policy"} <= set(TOOLS)
    assert all("-" not in name and name.islower() for name in TOOLS)
    assert {"create_role", "list_bindings", "delete_binding"} <= set(TOOLS)
    assert not [t for t in TOOLS.values() if t.command[:2] == ("security", "tokens")]
    assert TOOLS["delete_role"].destructive and TOOLS["list_roles"].read_only


def test_the_schema_is_the_commands_arguments() -> None:
    schema = TOOLS["set_subscription_failure_policy"].input_schema
    properties = schema["properties"]
    assert properties["max_redelivery_count"] == {
        "type": "integer",
        "minimum": 0,
        "description": properties["max_redelivery_count"]["description"],
    }
    assert "enum" in properties["poison_policy"]
    assert set(schema["required"]) >= {"topic", "subscription", "poison_policy"}
    assert schema["additionalProperties"] is False
    # a tool never reads the server's files for its caller
    assert "file" not in TOOLS["register_schema"].input_schema["properties"]
    assert TOOLS["delete_topic"].destructive and not TOOLS["delete_topic"].read_only
    assert TOOLS["list_topics"].read_only


def test_a_call_is_parsed_by_the_commands_own_parser() -> None:
    tool = TOOLS["unsubscribe"]
    args = tool.parse({"topic": "/default/t", "subscription": "s"})
    assert (args.topic, args.subscription) == ("/default/t", "s")
    rebalance = TOOLS["trigger_rebalance"].parse({"dry_run": True, "max_moves": 3})
    assert rebalance.dry_run is True and rebalance.max_moves == 3
    # a value that starts with a dash stays a value
    assert TOOLS["describe_topic"].parse({"topic": "-odd"}).topic == "-odd"


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("unsubscribe", {"topic": "/default/t"}, "the following arguments are required"),
        ("trigger_rebalance", {"max_moves": 0}, "expected 1 or more"),
        ("list_topics", {"nonsense": 1}, "unknown argument(s) nonsense"),
        ("trigger_rebalance", {"dry_run": "yes"}, "dry_run must be true or false"),
        ("set_schema_compatibility_mode", {"subject": "s", "mode": "sideways"}, "invalid choice"),
    ],
)
def test_a_bad_call_is_refused_with_the_commands_message(
    name: str, values: dict[str, object], message: str
) -> None:
    with pytest.raises(ToolInputError, match=f"^{name}: .*{re.escape(message)}"):
        TOOLS[name].parse(values)
