"""A console or MCP server listening on every interface answers only the names it is told
(`--allowed-host`), never any `Host` (review finding: a wildcard bind accepted every name,
so a DNS-rebinding page was same-origin and could drive it with the operator's token)."""

from __future__ import annotations

import pytest

from danube.cli.admin import build_parser, main
from danube.cli.admin_serve import exposure_refusal
from danube.console.app import allowed_hosts


def serve_args(*extra: str) -> object:
    return build_parser().parse_args(["serve", *extra])


@pytest.mark.parametrize(
    "argv",
    [
        ["--mode", "ui", "--host", "0.0.0.0"],
        ["--mode", "mcp", "--transport", "streamable-http", "--host", "::"],
    ],
)
def test_a_wildcard_bind_needs_the_names_it_is_reached_by(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert exposure_refusal(serve_args(*argv)) is not None
    assert main(["serve", *argv]) == 2
    assert "--allowed-host" in capsys.readouterr().err
    assert exposure_refusal(serve_args(*argv, "--allowed-host", "console.example")) is None


def test_loopback_and_stdio_need_no_names() -> None:
    assert exposure_refusal(serve_args("--mode", "ui")) is None
    assert exposure_refusal(serve_args("--mode", "mcp", "--host", "0.0.0.0")) is None  # stdio


def test_the_console_never_answers_any_name() -> None:
    assert "*" not in allowed_hosts("0.0.0.0", ["console.example"])
    assert allowed_hosts("0.0.0.0", ["console.example"])[-1] == "console.example"
    assert "10.0.0.5" in allowed_hosts("10.0.0.5")


def test_the_mcp_server_off_loopback_keeps_the_rebinding_guard() -> None:
    from danube.admin_mcp.server import transport_security

    assert transport_security("127.0.0.1") is None  # the SDK guards loopback itself
    guard = transport_security("0.0.0.0", ["mcp.example"])
    assert guard.enable_dns_rebinding_protection
    assert "mcp.example:*" in guard.allowed_hosts and "*" not in guard.allowed_hosts
    assert "10.0.0.5:*" in transport_security("10.0.0.5").allowed_hosts
