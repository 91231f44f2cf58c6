"""`danube-admin serve --mode mcp`: an MCP server whose tools are the admin operations
(`danube.admin_mcp.tools`), over stdio (an assistant starts it as a subprocess) or
streamable HTTP (`--transport streamable-http`, on loopback unless told otherwise).

Each call opens its own connection to the broker's admin port (`--endpoint`), as one
`danube-admin` command does, so a broker that restarts between calls is simply reached
again. A refusal (the broker's status and message, or the command's usage error) is a tool
result with `is_error` set and the CLI's one-line message: the assistant can read and
correct it, and nothing is logged as a server failure. The `mcp` SDK is imported here
only: `danube-admin` without `serve` never loads it.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import ServerRequestContext

from danube.admin_mcp.tools import AdminTool, ToolInputError, admin_tools
from danube.cli.admin_call import AdminError
from danube.client.security import ClientSecurity

log = logging.getLogger("danube.admin_mcp")
SCHEMES = ("http", "https")

INSTRUCTIONS = (
    "Tools to inspect and operate a Danube cluster through one broker's admin port: "
    "brokers, namespaces, topics, subscriptions, schemas and the cluster. Each tool is a "
    "danube-admin command; its result is the JSON that `danube-admin -o json` prints. "
    "Deleting and unloading are marked destructive: confirm with the user first."
)


def build_server(
    parser: argparse.ArgumentParser,
    endpoint: str,
    timeout_s: float,
    version: str,
    security: ClientSecurity | None = None,
) -> Server[Any]:
    """An MCP server with every command of the `danube-admin` parser as a tool, calling the
    admin port at `endpoint` (over TLS, with a token, as `security` says)."""
    tools = {tool.name: tool for tool in admin_tools(parser)}
    listed = [_describe(tool) for tool in tools.values()]

    async def list_tools(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        _ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = tools.get(params.name)
        if tool is None:
            return _error(f"no tool named {params.name!r}")
        try:
            result = await tool.run(endpoint, timeout_s, params.arguments or {}, security)
        except (AdminError, ToolInputError) as error:
            log.info("event=mcp_tool_refused tool=%s reason=%r", tool.name, str(error))
            return _error(str(error))
        text = json.dumps(result.data, indent=1, sort_keys=True)
        structured = result.data if isinstance(result.data, dict) else {"result": result.data}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=structured,
            is_error=result.exit_code != 0,
        )

    return Server(
        "danube-admin",
        version=version,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _describe(tool: AdminTool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.input_schema,
        annotations=types.ToolAnnotations(
            read_only_hint=tool.read_only,
            destructive_hint=tool.destructive,
            open_world_hint=False,
        ),
    )


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


async def serve_stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


async def serve_http(
    server: Server[Any], host: str, port: int, extra_hosts: Sequence[str] = ()
) -> None:
    """The streamable-HTTP transport. On loopback the SDK guards against DNS rebinding by
    itself; on any other address its guard is on too, answering only the loopback names, the
    listening address and `extra_hosts` (`--allowed-host`)."""
    import uvicorn

    security = transport_security(host, extra_hosts)
    app = server.streamable_http_app(host=host, transport_security=security)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    log.info("event=mcp_listening url=http://%s:%d/mcp", host, port)
    await uvicorn.Server(config).serve()


def transport_security(host: str, extra_hosts: Sequence[str] = ()) -> Any:
    """None on loopback (the SDK's own guard applies); elsewhere the SDK's DNS-rebinding guard
    answering only the loopback names, the listening address and `extra_hosts`."""
    from mcp.server.transport_security import TransportSecuritySettings

    if host in ("127.0.0.1", "localhost", "::1"):
        return None
    names = [*LOOPBACK_NAMES, *extra_hosts]
    if host not in ("0.0.0.0", "::", ""):
        names.append(f"[{host}]" if ":" in host else host)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{name}:*" for name in names],
        allowed_origins=[f"{scheme}://{name}:*" for name in names for scheme in SCHEMES],
    )


def tool_names(parser: argparse.ArgumentParser) -> Sequence[str]:
    return [tool.name for tool in admin_tools(parser)]
