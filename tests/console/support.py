"""The console served for tests: the real Starlette app under a real uvicorn on a free
loopback port, in a thread (Starlette's TestClient needs httpx, which the project does not
depend on), and a small urllib client for its JSON API."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import uvicorn

from danube.cli.admin import build_parser
from danube.client.security import ClientSecurity
from danube.console.app import build_app


class ConsoleServer:
    def __init__(
        self, endpoint: str, timeout_s: float = 10.0, security: ClientSecurity | None = None
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = build_app(build_parser(), endpoint, timeout_s, security=security)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ConsoleServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the console did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def request(
    url: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; an HTTP error status is an answer, not a raise."""
    req = urllib.request.Request(url, data=body, headers=dict(headers or {}), method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as reply:
        return reply.code, dict(reply.headers), reply.read()


def call(
    base: str, tool: str, arguments: Any = None, headers: Mapping[str, str] | None = None
) -> tuple[int, Any]:
    """POST /api/tools/<tool> as the page does (with the console header unless `headers`
    says otherwise); (status, JSON body)."""
    sent = {"content-type": "application/json", "x-danube-console": "1"}
    if headers is not None:
        sent = {"content-type": "application/json", **headers}
    body = json.dumps({} if arguments is None else arguments).encode()
    status, _, raw = request(f"{base}/api/tools/{tool}", body, sent, "POST")
    return status, json.loads(raw)
