"""`danube-admin serve --mode mcp`: serve the admin operations to AI assistants over the Model
Context Protocol (Danube's command; spec/admin-cli.md), or `--mode ui`: the web console
(danube.console, spec/console.md) over the same command registry."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from typing import Any

from danube.cli.admin_args import Actions

TRANSPORTS = ("stdio", "streamable-http")
DEFAULT_HTTP_PORT = 8090
DEFAULT_UI_PORT = 8081  # Danube's web UI port


def add_serve_command(commands: Actions) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve the admin operations over MCP (Model Context Protocol) or as a web console",
        description="Serve every danube-admin command as an MCP tool (Danube's tool names where "
        "it has them), calling the broker at --endpoint. stdio: an assistant starts this "
        "command itself; streamable-http: a long-running server at http://HOST:PORT/mcp. "
        "--mode ui: the web console at http://HOST:PORT/ (default port 8081).",
    )
    parser.add_argument(
        "--mode", choices=("mcp", "ui"), required=True, help="mcp or ui (web console)"
    )
    parser.add_argument(
        "--transport", choices=TRANSPORTS, default="stdio",
        help="stdio (default) or streamable-http",
    )  # fmt: skip
    parser.add_argument(
        "--host", default="127.0.0.1",
        help="streamable-http or ui: the address to listen on (default 127.0.0.1, loopback only)",
    )  # fmt: skip
    parser.add_argument(
        "--port", type=int, default=None,
        help=f"port (default {DEFAULT_HTTP_PORT} for streamable-http, {DEFAULT_UI_PORT} for ui)",
    )  # fmt: skip
    parser.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="streamable-http or ui: a host name browsers and clients reach this server by "
        "(repeatable); only loopback names, the --host address and these are answered (a "
        "DNS-rebinding guard). Needed when --host is 0.0.0.0 or ::",
    )  # fmt: skip
    parser.set_defaults(serve=True)


WILDCARDS = ("0.0.0.0", "::", "")


def exposure_refusal(args: argparse.Namespace) -> str | None:
    """A server listening on every interface must be told the names it is reached by: with
    any `Host` accepted, a page whose name resolves to it (DNS rebinding) is same-origin in
    the browser and can drive it with this tool's credentials."""
    http = args.mode == "ui" or args.transport == "streamable-http"
    if http and args.host in WILDCARDS and not args.allowed_host:
        return (
            f"--host {args.host or '(all)'} listens on every interface: name the host names "
            "it is reached by with --allowed-host NAME (a DNS-rebinding guard)"
        )
    return None


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Runs the MCP server until its input closes (stdio) or it is interrupted (HTTP). Logs
    go to stderr: with stdio, stdout carries the protocol."""
    refusal = exposure_refusal(args)
    if refusal is not None:
        print(f"danube-admin: error: {refusal}", file=sys.stderr)
        return 2
    if args.mode == "ui":
        return serve_ui(parser, args)
    try:
        import anyio

        from danube.admin_mcp.server import build_server, serve_http, serve_stdio
    except ImportError as error:
        print(
            f"danube-admin: error: serve --mode mcp needs the mcp extra "
            f"(pip install 'pydanube[mcp]'): {error}",
            file=sys.stderr,
        )
        return 2
    security = _serving(args, ("mcp", "httpx", "uvicorn"))
    try:
        version = importlib.metadata.version("pydanube")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    server = build_server(parser, args.endpoint, args.timeout, version, security)
    try:
        if args.transport == "stdio":
            anyio.run(serve_stdio, server)
        else:
            port = args.port or DEFAULT_HTTP_PORT
            anyio.run(serve_http, server, args.host, port, tuple(args.allowed_host))
    except KeyboardInterrupt:
        return 130
    return 0


def serve_ui(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The web console until interrupted; needs the ui extra (starlette, uvicorn)."""
    try:
        import anyio

        from danube.console.app import build_app
        from danube.console.app import serve as serve_console
    except ImportError as error:
        print(
            f"danube-admin: error: serve --mode ui needs the ui extra "
            f"(pip install 'pydanube[ui]'): {error}",
            file=sys.stderr,
        )
        return 2
    security = _serving(args, ("uvicorn",))
    app = build_app(
        parser, args.endpoint, args.timeout, args.host, security, extra_hosts=args.allowed_host
    )
    try:
        anyio.run(serve_console, app, args.host, args.port or DEFAULT_UI_PORT)
    except KeyboardInterrupt:
        return 130
    return 0


def _serving(args: argparse.Namespace, quiet: tuple[str, ...]) -> Any:
    """What both servers set up: logs on stderr (with stdio, stdout carries the protocol),
    the libraries' chatter at warning, and the TLS settings and token the CLI would use."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    from danube.cli.usage import ADMIN_ENV_PREFIX, security_of

    return security_of(args, ADMIN_ENV_PREFIX, args.endpoint)
