"""A misbehaving S3 endpoint for fault tests: a small threaded HTTP reverse proxy on a free
loopback port in front of a real S3-compatible server (moto's). Per request, from a seeded
random stream, it forwards the request verbatim, answers `503 SlowDown` or `500 InternalError`
without forwarding, stalls before forwarding, or forwards and then answers `500` anyway (the
write landed but the client is told it failed). Faults can be switched on and off while the
proxy runs, and every injected fault is counted, so a test can tell "the store misbehaved and
we coped" from "the faults never happened".

Standard library only; bodies are buffered whole (S3 requests of tests are small), which keeps
the request/response pairing on a kept-alive connection trivially right.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Fault = Literal["forward", "throttled", "server_error", "stalled", "lost_reply"]

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)
"""Headers that describe one hop, not the request: the proxy answers `Expect: 100-continue`
itself and re-frames bodies with Content-Length, so these are not passed on."""

SLOWDOWN_MESSAGE = "Reduce your request rate."
INTERNAL_ERROR_MESSAGE = "We encountered an internal error. Please try again."
_ERRORS: dict[str, tuple[int, str, str]] = {
    "throttled": (503, "SlowDown", SLOWDOWN_MESSAGE),
    "server_error": (500, "InternalError", INTERNAL_ERROR_MESSAGE),
    "lost_reply": (500, "InternalError", INTERNAL_ERROR_MESSAGE),
}


@dataclass
class FaultRates:
    """Probabilities per request (their sum at most 1; the rest is forwarded untouched)."""

    throttled: float = 0.0
    server_error: float = 0.0
    stalled: float = 0.0
    lost_reply: float = 0.0
    stall_seconds: tuple[float, float] = (1.0, 3.0)

    def __post_init__(self) -> None:
        total = self.throttled + self.server_error + self.stalled + self.lost_reply
        if not 0.0 <= total <= 1.0:
            raise ValueError(f"fault probabilities must sum to at most 1, got {total}")


class FlakyS3Proxy:
    """`url` is the endpoint to give the client instead of `upstream`'s. Use as a context
    manager, or `start()` / `stop()`."""

    def __init__(self, upstream: str, rates: FaultRates, *, seed: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or parsed.hostname is None or parsed.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self._upstream = (parsed.hostname, parsed.port)
        self.rates = rates
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._faults_on = False
        self.counts: Counter[str] = Counter()
        """Requests by outcome ("forward", "throttled", ...); also "<METHOD> <outcome>"."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def faults_on(self) -> bool:
        return self._faults_on

    @faults_on.setter
    def faults_on(self, value: bool) -> None:
        with self._lock:
            self._faults_on = value

    def injected(self, kind: str | None = None) -> int:
        """How many faults were injected (of `kind`, or of every kind)."""
        with self._lock:
            if kind is not None:
                return self.counts[kind]
            return sum(n for k, n in self.counts.items() if k in _FAULT_KINDS)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def start(self) -> FlakyS3Proxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="flaky-s3", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FlakyS3Proxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _decide(self, method: str) -> tuple[Fault, float]:
        """The fault for one request, and how long to stall first. Drawn under the lock, so
        the sequence of decisions depends on the seed alone (which request gets which one
        depends on the client's timing)."""
        with self._lock:
            fault: Fault = "forward"
            stall = 0.0
            if self._faults_on:
                draw = self._rng.random()
                rates = self.rates
                for kind, rate in (
                    ("throttled", rates.throttled),
                    ("server_error", rates.server_error),
                    ("stalled", rates.stalled),
                    ("lost_reply", rates.lost_reply),
                ):
                    if draw < rate:
                        fault = kind  # type: ignore[assignment]
                        break
                    draw -= rate
                if fault == "stalled":
                    stall = self._rng.uniform(*rates.stall_seconds)
            self.counts[fault] += 1
            self.counts[f"{method} {fault}"] += 1
            return fault, stall

    def _forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                connection.putheader(name, value)
            if not any(name.lower() == "content-length" for name, _ in headers) and body:
                connection.putheader("Content-Length", str(len(body)))  # was chunked
            connection.endheaders(body)
            response = connection.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            connection.close()


_FAULT_KINDS = frozenset(_ERRORS) | {"stalled"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients pool connections
    server: ThreadingHTTPServer

    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest output is for the test's own failures."""

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _proxy(self) -> None:
        proxy: FlakyS3Proxy = self.server.proxy  # type: ignore[attr-defined]
        body = self._read_body()  # always read: the connection stays in step
        fault, stall = proxy._decide(self.command)
        if fault in ("throttled", "server_error"):
            self._error(fault)
            return
        if stall:
            time.sleep(stall)
        headers = [
            (name, value) for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP
        ]
        try:
            status, reason, reply_headers, data = proxy._forward(
                self.command, self.path, headers, body
            )
        except OSError:
            self._error("server_error")
            return
        if fault == "lost_reply":
            self._error(fault)
            return
        self.send_response(status, reason)
        has_length = False
        for name, value in reply_headers:
            lowered = name.lower()
            if lowered in _HOP_BY_HOP:
                continue
            if lowered == "content-length":
                if self.command != "HEAD":
                    continue  # re-framed below from the bytes actually read
                has_length = True
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        elif not has_length:
            self.send_header("Content-Length", "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, fault: str) -> None:
        status, code, message = _ERRORS[fault]
        request_id = uuid.uuid4().hex[:16].upper()
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<RequestId>{request_id}</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", request_id)
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
