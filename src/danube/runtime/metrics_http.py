"""The broker's HTTP endpoint for Prometheus and orchestrators (spec/observability.md):
`GET /metrics`, `GET /healthz` (liveness), `GET /readyz` (readiness).

A deliberately tiny HTTP/1.1 server on trio's sockets: one request per connection
(`Connection: close`), a bounded request head, a deadline for the head and one for the whole
exchange, and a cap on connections at once, so a slow, malformed or hostile client costs a
few KiB and a few seconds, and never the broker. Health checks never queue behind anyone:
each connection is served on its own, and at the cap a newcomer takes the place of the
oldest connection still sending its head (`Admission`): forty clients that open a connection
and send half a head cannot make `/healthz` answer 503, which a liveness probe would take for
a dead broker (issue 20).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio
import trio_asyncio
from prometheus_client import CONTENT_TYPE_LATEST

from danube.runtime.broker import BrokerRuntime

log = logging.getLogger("danube.runtime")

MAX_HEAD_BYTES = 8 * 1024
"""Request line and headers; a scrape needs a few hundred bytes."""
HEAD_TIMEOUT_S = 3.0
"""From accept to the end of the request head: a scraper or a probe sends it at once."""
CONNECTION_TIMEOUT_S = 5.0
"""From accept to the last byte of the answer."""
MAX_CONNECTIONS = 64
"""Connections held at once (`Admission`)."""
MAX_SCRAPES = 4
"""`/metrics` answers being sent at once (an exposition can be large and its reader slow);
more are answered 503. `/healthz` and `/readyz` answers are a few bytes and never wait."""
LINGER_S = 1.0
"""After answering: how long to read (and drop) what the client still sends before closing,
so that unread bytes do not turn the close into a reset that destroys the answer."""
LINGER_BYTES = 64 * 1024
LIVENESS_TIMEOUT_S = 2.0
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str
    body: bytes | Sequence[bytes]
    """The body, or its parts (an exposition's metric families), sent one after the other."""
    content_type: str = TEXT

    def encode(self) -> list[bytes]:
        """The head, then the body's parts as they are: never copied into one buffer (an
        exposition of 1,000 topics is megabytes; `metrics.exposition_parts`)."""
        parts = [self.body] if isinstance(self.body, bytes) else list(self.body)
        head = (
            f"HTTP/1.1 {self.status} {self.reason}\r\n"
            f"Content-Type: {self.content_type}\r\n"
            f"Content-Length: {sum(map(len, parts))}\r\n"
            "Connection: close\r\n\r\n"
        )
        return [head.encode("ascii"), *parts]


def _text(status: int, reason: str, body: str) -> Response:
    return Response(status, reason, (body + "\n").encode())


def parse_head(head: bytes) -> Request | Response:
    """The request line of a complete head (up to the blank line), or the error answer."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith(b"/"):
        return _text(400, "Bad Request", "bad request line")
    method, target, version = parts
    if version not in (b"HTTP/1.0", b"HTTP/1.1"):
        return _text(505, "HTTP Version Not Supported", "HTTP/1.0 or HTTP/1.1 only")
    try:
        path = target.decode("ascii").split("?", 1)[0]
    except UnicodeDecodeError:
        return _text(400, "Bad Request", "the path is not ASCII")
    return Request(method.decode("ascii"), path)


async def read_head(stream: trio.abc.ReceiveStream) -> bytes | Response:
    """Bytes up to and including the blank line ending the head, or the error answer (too
    large, or the client closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            return _text(431, "Request Header Fields Too Large", "request head too large")
        chunk = await stream.receive_some(MAX_HEAD_BYTES)
        if not chunk:
            return _text(400, "Bad Request", "incomplete request")
        data += chunk
    head = data[: data.index(b"\r\n\r\n") + 4]
    if len(head) > MAX_HEAD_BYTES:
        return _text(431, "Request Header Fields Too Large", "request head too large")
    return head


@dataclass(frozen=True, slots=True)
class Endpoints:
    """What the paths answer with: the exposition, why the broker is not ready (None when
    it is), and whether its event loop answers."""

    metrics: Callable[[], bytes | Sequence[bytes]]
    not_ready: Callable[[], str | None]
    alive: Callable[[], Awaitable[bool]]
    scrape_refused: Callable[[str | None, Any], tuple[int, str] | None] | None = None
    """With authentication on (spec/security.md, "Metrics"): given the request's
    `Authorization` header and the TLS client certificate, why `/metrics` is refused
    (status, reason) or None. Probes (`/healthz`, `/readyz`) stay open."""


def header(head: bytes, name: str) -> str | None:
    """The value of header `name` (any case) in a request head; None when absent."""
    wanted = name.lower().encode("ascii") + b":"
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(wanted):
            return line[len(wanted) :].strip().decode("latin-1")
    return None


async def answer(endpoints: Endpoints, request: Request) -> Response:
    routes = ("/metrics", "/healthz", "/readyz")
    if request.path not in routes:
        return _text(404, "Not Found", f"no such path; try {', '.join(routes)}")
    if request.method != "GET":
        return _text(405, "Method Not Allowed", "only GET")
    if request.path == "/metrics":
        return Response(200, "OK", endpoints.metrics(), CONTENT_TYPE_LATEST)
    if request.path == "/healthz":
        if await endpoints.alive():
            return _text(200, "OK", "ok")
        return _text(503, "Service Unavailable", "the broker's event loop does not answer")
    reason = endpoints.not_ready()
    if reason is None:
        return _text(200, "OK", "ready")
    return _text(503, "Service Unavailable", reason)


class Health:
    """Liveness and readiness of a broker, from its runtime's state."""

    def __init__(self, runtime: BrokerRuntime) -> None:
        self._runtime = runtime
        self.started = False
        """Set once the ports are open (reliable topics recovered; in cluster mode the
        broker is registered)."""

    def not_ready(self) -> str | None:
        if self._runtime.stopping:
            return "the broker is shutting down"
        if not self.started:
            return "starting: reliable topics are recovering or the ports are not open yet"
        if self._runtime.fenced is not None:
            return f"fenced: {self._runtime.fenced}"
        return None

    async def alive(self) -> bool:
        """A round trip through the asyncio loop the gRPC handlers run on."""
        with trio.move_on_after(LIVENESS_TIMEOUT_S):
            await trio_asyncio.aio_as_trio(asyncio.sleep)(0)
            return True
        return False


class Phase(enum.Enum):
    HEAD = "head"
    """Reading the request head."""
    ANSWER = "answer"
    LINGER = "linger"
    """Answered; draining what the client still sends before closing."""


class Admission:
    """Which connections the endpoint holds (pure: connection ids in, ids to close out).

    Up to `limit` at once. At the limit a newcomer takes the place of the oldest connection
    still sending its head (a slow or hostile client: scrapers and probes send theirs at
    once), else of the oldest one lingering after its answer; only when every connection is
    being answered is the newcomer itself turned away. So slow heads cannot starve a health
    check, however many there are."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[int, Phase] = {}
        """By age: dicts keep insertion order."""

    def admit(self, connection: int) -> int | None:
        """Takes a new connection; returns the one to close to make room for it (the
        newcomer itself when none may go), or None."""
        victim = None
        if len(self._held) >= self.limit:
            victim = self._oldest(Phase.HEAD)
            if victim is None:
                victim = self._oldest(Phase.LINGER)
            if victim is None:
                return connection
            del self._held[victim]
        self._held[connection] = Phase.HEAD
        return victim

    def moved(self, connection: int, phase: Phase) -> None:
        if connection in self._held:
            self._held[connection] = phase

    def left(self, connection: int) -> None:
        self._held.pop(connection, None)

    def held(self, phase: Phase | None = None) -> list[int]:
        return [c for c, p in self._held.items() if phase is None or p is phase]

    def _oldest(self, phase: Phase) -> int | None:
        return next((c for c, p in self._held.items() if p is phase), None)


class _Scrapes:
    """`/metrics` answers in flight (MAX_SCRAPES)."""

    def __init__(self) -> None:
        self.active = 0


async def serve_http(
    sock: socket.socket, endpoints: Endpoints, tls: ssl.SSLContext | None = None
) -> None:
    """Serves the listening socket until cancelled; over TLS with a `tls` context (its
    handshake falls within the connection's deadline like any slow client)."""
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    admission = Admission(MAX_CONNECTIONS)
    scopes: dict[int, trio.CancelScope] = {}
    scrapes = _Scrapes()
    ids = itertools.count()

    async def handle(plain: trio.SocketStream) -> None:
        stream: trio.abc.Stream = plain
        if tls is not None:
            stream = trio.SSLStream(plain, tls, server_side=True)
        connection = next(ids)
        victim = admission.admit(connection)
        if victim == connection:
            await stream.aclose()
            return
        if victim is not None and victim in scopes:
            scopes[victim].cancel()
        scope = scopes[connection] = trio.CancelScope()
        try:
            async with stream:
                with scope:
                    answered = False
                    with trio.move_on_after(CONNECTION_TIMEOUT_S):
                        answered = await _exchange(
                            stream,
                            endpoints,
                            lambda: admission.moved(connection, Phase.ANSWER),
                            scrapes,
                        )
                    if answered:
                        admission.moved(connection, Phase.LINGER)
                        await _linger(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away
        except Exception:
            log.exception("event=metrics_http_error")
        finally:
            admission.left(connection)
            scopes.pop(connection, None)

    await trio.serve_listeners(handle, [listener])


async def _exchange(
    stream: trio.abc.Stream,
    endpoints: Endpoints,
    head_read: Callable[[], None],
    scrapes: _Scrapes,
) -> bool:
    """Reads the request head (within HEAD_TIMEOUT_S), then answers; False when the head
    did not come in time. A scrape beyond MAX_SCRAPES is answered 503, but still only once
    its head is read, so that the request's bytes are not left unread when the connection
    closes."""
    head: bytes | Response | None = None
    with trio.move_on_after(HEAD_TIMEOUT_S):
        head = await read_head(stream)
    if head is None:
        return False
    head_read()
    request = head if isinstance(head, Response) else parse_head(head)
    if isinstance(request, Response):
        response = request
    elif request.path != "/metrics":
        response = await _answered(endpoints, request)
    elif endpoints.scrape_refused is not None and (
        refused := endpoints.scrape_refused(
            header(head, "authorization") if isinstance(head, bytes) else None,
            _peer_certificate(stream),
        )
    ):
        response = _text(
            refused[0], "Unauthorized" if refused[0] == 401 else "Forbidden", refused[1]
        )
    elif scrapes.active >= MAX_SCRAPES:
        response = _text(503, "Service Unavailable", "too many scrapes at once")
    else:
        scrapes.active += 1
        try:
            await _send(stream, await _answered(endpoints, request))
        finally:
            scrapes.active -= 1
        return True
    await _send(stream, response)
    return True


SEND_CHUNK = 64 * 1024
"""Small parts are gathered up to about this many bytes per `send_all`: an exposition of a
few topics is some fifty families of a few hundred bytes each, and each sent alone was a TCP
segment (over TLS a record) of its own (review finding); a chunk this size adds nothing
worth counting to a scrape's memory."""


async def _send(stream: trio.abc.Stream, response: Response) -> None:
    pending: list[bytes] = []
    size = 0
    for part in response.encode():
        pending.append(part)
        size += len(part)
        if size >= SEND_CHUNK:
            await stream.send_all(b"".join(pending) if len(pending) > 1 else pending[0])
            pending, size = [], 0
    if pending:
        await stream.send_all(b"".join(pending))


def _peer_certificate(stream: trio.abc.Stream) -> Any:
    """The verified client certificate of a TLS connection (mutual TLS), else None."""
    if isinstance(stream, trio.SSLStream):
        return stream.getpeercert()
    return None


async def _linger(stream: trio.abc.Stream) -> None:
    """Half-closes, then drops what the client still sends until it closes, for at most
    LINGER_S (its own budget, so an answer sent just before the connection's deadline still
    gets its drain). TLS cannot half-close: its close_notify at `aclose` ends the exchange."""
    if not isinstance(stream, trio.abc.HalfCloseableStream):
        return
    await stream.send_eof()
    with trio.move_on_after(LINGER_S):
        dropped = 0
        while dropped < LINGER_BYTES and (chunk := await stream.receive_some(4096)):
            dropped += len(chunk)


async def _answered(endpoints: Endpoints, request: Request) -> Response:
    try:
        return await answer(endpoints, request)
    except Exception:
        log.exception("event=metrics_http_error path=%s", request.path)
        return _text(500, "Internal Server Error", "see the broker log")
