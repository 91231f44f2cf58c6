"""The console's HTTP side: a Starlette app with a JSON API over the `danube-admin` command
registry (`admin_tools`, the same tool objects the MCP server serves, so the CLI, MCP and the
console cannot drift apart) and the static single-page UI shipped in this package.

API:
- `GET /api/tools`: every tool's name, description, input schema, read_only, destructive.
- `POST /api/tools/<name>` with a JSON object of arguments: `{"data": ...}` (what
  `danube-admin -o json` prints), or `{"error": "<the CLI's one-line message>"}` with a 4xx
  status: 400 arguments refused (by the command's parser or its own checks), 403 CSRF check
  failed, 404 no such tool, 409 the broker refused or could not be reached. Never a
  traceback. Integers beyond JavaScript's 2**53 (broker ids) are sent as strings.
- `GET /api/topic-series?topic=T`: the topic's counters from the brokers' metrics
  (`danube.console.metrics`), polled by the charts.

CSRF: a tool that is not read-only runs only for a request that carries `X-Danube-Console: 1`
and, when the browser sends them, an `Origin` equal to this server's and a `Sec-Fetch-Site`
of `same-origin`. Another web page cannot add a custom header to a cross-origin request
without a CORS preflight, which this server never grants, so it cannot drive those tools.
Against DNS rebinding only loopback `Host` names and the listening address are answered.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from danube.admin_mcp.tools import AdminTool, ToolInputError, admin_tools
from danube.cli.admin_call import EXIT_USAGE, AdminError
from danube.client.security import ClientSecurity
from danube.console.metrics import metrics_context, metrics_urls, scrape, topic_series

log = logging.getLogger("danube.console")

STATIC = Path(__file__).with_name("static")
CSRF_HEADER = "x-danube-console"
SECURITY_HEADERS = {
    # Everything is served from here: no inline script, no CDN, no framing (clickjacking of
    # the confirmation dialog).
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


JS_SAFE_INTEGER = 2**53 - 1


def js_safe(data: Any) -> Any:
    """`data` with integers a JavaScript number cannot hold exactly (broker ids are 64-bit)
    as strings, so the page shows and sends back the id the broker has."""
    if isinstance(data, bool):
        return data
    if isinstance(data, int) and abs(data) > JS_SAFE_INTEGER:
        return str(data)
    if isinstance(data, dict):
        return {key: js_safe(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [js_safe(value) for value in data]
    return data


def error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def describe(tool: AdminTool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "command": " ".join(tool.command),
        "description": tool.description,
        "input_schema": tool.input_schema,
        "read_only": tool.read_only,
        "destructive": tool.destructive,
    }


def csrf_refusal(request: Request) -> str | None:
    """Why a state-changing request is refused, or None when it came from the console."""
    if request.headers.get(CSRF_HEADER) != "1":
        return f"refused: a state-changing call needs the {CSRF_HEADER} header (CSRF guard)"
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
        return f"refused: origin {origin} is not this console's (CSRF guard)"
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"refused: a {site} request may not change the cluster (CSRF guard)"
    return None


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def allowed_hosts(bind_host: str, extra: Sequence[str] = ()) -> list[str]:
    """The `Host` names the console answers to: loopback names, the address it listens on
    and the names the operator gives (`--allowed-host`). A DNS-rebinding page
    (attacker.example resolving to this console) is same-origin to the browser, so it could
    pass the CSRF rule; its `Host` header still names attacker.example, and that is refused.
    A wildcard bind is never "any name": `danube-admin serve` refuses one without names."""
    names = [*LOOPBACK_NAMES, *extra]
    if bind_host not in ("0.0.0.0", "::", ""):
        names.append(bind_host)
    return names


def build_app(
    parser: argparse.ArgumentParser,
    endpoint: str,
    timeout_s: float,
    bind_host: str = "127.0.0.1",
    security: ClientSecurity | None = None,
    *,
    extra_hosts: Sequence[str] = (),
) -> Starlette:
    """The console for the admin port at `endpoint`; `parser` is `danube-admin`'s. `security`:
    the TLS settings and token `danube-admin` itself would use (flags or DANUBE_ADMIN_*), so a
    secured broker sees the console as that principal."""
    tools = {tool.name: tool for tool in admin_tools(parser)}
    listing = [describe(tool) for tool in tools.values()]
    tls = (
        metrics_context(security.ca_file, security.uses_tls, security.cert_file, security.key_file)
        if security
        else None
    )

    async def list_tools(_request: Request) -> Response:
        return JSONResponse({"endpoint": endpoint, "tools": listing})

    async def call_tool(request: Request) -> Response:
        name = request.path_params["name"]
        tool = tools.get(name)
        if tool is None:
            return error(f"no tool named {name!r}", 404)
        if not tool.read_only:
            refused = csrf_refusal(request)
            if refused is not None:
                log.warning("event=console_csrf_refused tool=%s reason=%r", name, refused)
                return error(refused, 403)
        try:
            body = await request.body()
            values = json.loads(body) if body.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(f"{name}: the arguments are not JSON", 400)
        if not isinstance(values, dict):
            return error(f"{name}: the arguments must be a JSON object", 400)
        try:
            result = await tool.run(endpoint, timeout_s, values, security)
        except ToolInputError as refusal:
            return error(str(refusal), 400)
        except AdminError as refusal:
            log.info("event=console_tool_refused tool=%s reason=%r", name, str(refusal))
            return error(str(refusal), 400 if refusal.exit_code == EXIT_USAGE else 409)
        if not tool.read_only:
            log.info("event=console_action tool=%s arguments=%s", name, json.dumps(values))
        # a non-zero exit code is an answer (an incompatible schema), not a failure
        return JSONResponse({"data": js_safe(result.data), "exit_code": result.exit_code})

    async def series(request: Request) -> Response:
        topic = request.query_params.get("topic", "")
        if not topic:
            return error("topic-series: the topic query parameter is required", 400)
        try:
            brokers = await tools["list_brokers"].run(endpoint, timeout_s, {}, security)
        except AdminError as refusal:
            return error(str(refusal), 409)
        texts = await run_in_threadpool(
            scrape,
            metrics_urls(brokers.data, tls is not None),
            timeout_s,
            tls,
            security.token if security else None,
        )
        return JSONResponse({"data": {"topic": topic, **topic_series(texts, topic)}})

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "endpoint": endpoint})

    routes = [
        Route("/api/health", health),
        Route("/api/tools", list_tools),
        Route("/api/tools/{name}", call_tool, methods=["POST"]),
        Route("/api/topic-series", series),
        Mount("/", StaticFiles(directory=STATIC, html=True)),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts(bind_host, extra_hosts))
    return app


async def serve(app: Starlette, host: str, port: int) -> None:
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    log.info("event=console_listening url=http://%s:%d/", host, port)
    await uvicorn.Server(config).serve()
