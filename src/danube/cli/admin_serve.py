"""`danube-admin serve --mode mcp`: serve the admin operations to AI assistants over the Model
Context Protocol (Danube's command; spec/admin-cli.md). The web console (`--mode ui`) is not
built yet, so `mcp` is the only mode offered."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys

from danube.cli.admin_args import Actions

TRANSPORTS = ("stdio", "streamable-http")
DEFAULT_HTTP_PORT = 8090


def add_serve_command(commands: Actions) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve the admin operations over MCP (Model Context Protocol)",
        description="Serve every danube-admin command as an MCP tool (Danube's tool names where "
        "it has them), calling the broker at --endpoint. stdio: an assistant starts this "
        "command itself; streamable-http: a long-running server at http://HOST:PORT/mcp.",
    )
    parser.add_argument("--mode", choices=("mcp",), required=True, help="what to serve: mcp")
    parser.add_argument(
        "--transport", choices=TRANSPORTS, default="stdio",
        help="stdio (default) or streamable-http",
    )  # fmt: skip
    parser.add_argument(
        "--host", default="127.0.0.1",
        help="streamable-http: the address to listen on (default 127.0.0.1, loopback only)",
    )  # fmt: skip
    parser.add_argument(
        "--port", type=int, default=DEFAULT_HTTP_PORT,
        help=f"streamable-http: the port (default {DEFAULT_HTTP_PORT})",
    )  # fmt: skip
    parser.set_defaults(serve=True)


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Runs the MCP server until its input closes (stdio) or it is interrupted (HTTP). Logs
    go to stderr: with stdio, stdout carries the protocol."""
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
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for noisy in ("mcp", "httpx", "uvicorn"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        version = importlib.metadata.version("pydanube")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    from danube.cli.usage import ADMIN_ENV_PREFIX, security_of

    security = security_of(args, ADMIN_ENV_PREFIX, args.endpoint)  # TLS and token, as the CLI
    server = build_server(parser, args.endpoint, args.timeout, version, security)
    try:
        if args.transport == "stdio":
            anyio.run(serve_stdio, server)
        else:
            anyio.run(serve_http, server, args.host, args.port)
    except KeyboardInterrupt:
        return 130
    return 0
