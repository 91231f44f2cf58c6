"""grpclib plumbing shared by every service: bounded reads, error mapping, unary handlers."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import socket
import ssl as ssl_module
import struct
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import betterproto
import grpclib.const
import grpclib.protocol
import grpclib.server
import h2.exceptions
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError
from grpclib.protocol import H2Protocol

from danube.machines.wal.records import RecordError
from danube.runtime.auth import AUTHORIZE, Wrapper
from danube.runtime.h2_guard import (
    GatedConnections,
    GuardedHandler,
    GuardedProtocol,
    TransportCount,
    grpclib_config,
)
from danube.runtime.request_check import RequestRejected, check, narrow
from danube.values.config import GrpcConfig
from danube.values.errors import DanubeError

log = logging.getLogger("danube.runtime")

DEFAULT_REQUEST_LIMIT = 1024 * 1024
"""Largest request other than a published message; anything bigger is not a Danube request."""

MESSAGE_HEADER = struct.Struct(">?I")
"""A gRPC message's prefix on the wire: compressed flag, body length."""

FORWARDED_HEADER = "x-danube-forwarded"
"""Marks an admin call one broker forwarded to another (`danube.runtime.forwarding`)."""

FORWARDED: contextvars.ContextVar[bool] = contextvars.ContextVar("forwarded", default=False)
"""The call being handled reached this broker forwarded by another one: it must not be
forwarded again."""


RECEIVED: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "received", default=None
)
"""The request this task read last: (`perf_counter` of the connection's socket read that
brought it, of its decoding), the `receive` stage; the request driver observes it and the
`check` stage that starts there (`danube.runtime.stage_metrics`)."""

STATUS_MESSAGE_LIMIT = 1024
"""Bytes (UTF-8) of a status message the broker sends. Messages travel in HTTP/2 trailers,
which grpclib HPACK-encodes in pure Python on the event loop in time that grows faster than
their length (a 400 KB message stalled every client for 25 s, issue 20); messages quote
client strings through `errors.quoted` already, this is the limit for whatever else."""


def grpc_error(error: DanubeError) -> GRPCError:
    return GRPCError(Status[error.code.name], error.message)


def capped(message: str, limit: int = STATUS_MESSAGE_LIMIT) -> str:
    """`message` cut to at most `limit` UTF-8 bytes on a character boundary, marked "…"."""
    encoded = message.encode("utf-8", "replace")
    if len(encoded) <= limit:
        return message
    return encoded[: limit - 3].decode("utf-8", "ignore") + "…"


_LOGGED_INTERNAL: set[tuple[str, type]] = set()


def internal_error(rpc: str, error: BaseException) -> GRPCError:
    """INTERNAL for a failure no rule foresaw, logged with its traceback the first time an
    rpc fails this way and in one line afterwards, so a flood of requests that trip the same
    bug cannot fill the log (a 5-byte request once wrote 2 KB of traceback)."""
    kind = (rpc, type(error))
    if kind in _LOGGED_INTERNAL:
        log.error(
            "event=internal_error rpc=%s error=%s: %s (traceback logged before)",
            rpc, type(error).__name__, capped(str(error), 200),
        )  # fmt: skip
    else:
        _LOGGED_INTERNAL.add(kind)
        log.error("event=internal_error rpc=%s", rpc, exc_info=error)
    return GRPCError(Status.INTERNAL, "internal broker error (see broker log)")


async def recv_bounded(stream: grpclib.server.Stream, limit: int, *, end_ok: bool = False) -> Any:
    """Reads one request, refusing it before buffering when its length prefix exceeds `limit`.
    With `end_ok` (client streams), the end of the client's stream returns None.

    grpclib 0.4.9 has no receive limit of its own, so a client could make the broker buffer a
    4 GiB message; this reads the gRPC length prefix itself (grpclib's internals are pinned)."""
    header = await _recv_data(stream, 5, "truncated gRPC message header")
    if not header and end_ok:
        return None
    if not header:
        raise GRPCError(Status.INVALID_ARGUMENT, "the request carried no message")
    if len(header) < 5:
        raise GRPCError(Status.INVALID_ARGUMENT, "truncated gRPC message header")
    compressed, length = MESSAGE_HEADER.unpack(header)
    if compressed:
        raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not supported")
    if length > limit:
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"message of {length} bytes exceeds the broker's limit of {limit} bytes",
        )
    body = await _recv_data(stream, length, "truncated gRPC message")
    if len(body) != length:
        raise GRPCError(Status.INVALID_ARGUMENT, "truncated gRPC message")
    request = decode_request(body, stream._recv_type, stream._codec)
    RECEIVED.set((getattr(stream._stream.connection, "read_at", 0.0), time.perf_counter()))
    authorize = AUTHORIZE.get()
    if authorize is not None:  # a port with authentication: may this caller ask this?
        authorize(request)
    return request


async def _recv_data(stream: grpclib.server.Stream, size: int, truncated: str) -> bytes:
    """`size` bytes of the request stream, b"" at its end. grpclib's buffer asserts when the
    stream ends inside the bytes asked for (a client that cut a message short): that is the
    client's mistake, INVALID_ARGUMENT, not an internal error."""
    try:
        data: bytes = await stream._stream.recv_data(size)
    except AssertionError:
        raise GRPCError(Status.INVALID_ARGUMENT, truncated) from None
    return data


async def recv_single(stream: grpclib.server.Stream, limit: int) -> Any:
    """The request of a unary or server-streaming call, which must be exactly one message:
    a second one is refused, as grpc-core does, not silently ignored."""
    request = await recv_bounded(stream, limit)
    if await stream._stream.recv_data(1):
        raise GRPCError(Status.INVALID_ARGUMENT, "a unary request must carry exactly one message")
    return request


def decode_request(body: bytes, request_type: Any, codec: Any) -> Any:
    """Decodes a request body: a betterproto message only after `request_check` found it
    valid and bounded (it runs in time linear in the body); the hand-decoded types
    (`wire_codec`) check themselves and raise `RecordError`. Anything refused answers
    INVALID_ARGUMENT with a short message."""
    name = getattr(request_type, "__name__", "request")
    try:
        if isinstance(request_type, type) and issubclass(request_type, betterproto.Message):
            wide = check(body, request_type)
            request = codec.decode(body, request_type)
            if wide:
                narrow(request)
            return request
        return codec.decode(body, request_type)
    except (RequestRejected, RecordError) as error:
        reason = capped(str(error), 200)
        raise GRPCError(Status.INVALID_ARGUMENT, f"undecodable request: {reason}") from None
    except Exception as error:  # a decoder's bug, not the client's: once with its traceback
        internal_error(f"decode {name}", error)
        raise GRPCError(Status.INVALID_ARGUMENT, f"undecodable request ({name})") from None


async def send_encoded(stream: grpclib.server.Stream, messages: list[bytes]) -> None:
    """Sends encoded messages on a server stream whose initial metadata went out: each is its
    own gRPC message (its own length prefix), but all go in one HTTP/2 send, where grpclib's
    `send_message` costs a send (flow-control check, frame, socket write) per message."""
    pack = MESSAGE_HEADER.pack
    await stream._stream.send_data(b"".join([pack(False, len(m)) + m for m in messages]))
    stream._messages_sent += len(messages)  # grpclib's counters (channelz), kept true
    connection = stream._stream.connection
    connection.messages_sent += len(messages)
    connection.last_message_sent = time.monotonic()


def send_message_now(raw: grpclib.protocol.Stream, body: bytes) -> bool:
    """`body` as one uncompressed gRPC message, sent at once when `send_data_now` can; the
    connection's counters (channelz) kept as `send_encoded` keeps them. False, nothing sent:
    the caller goes the awaiting way."""
    if not send_data_now(raw, MESSAGE_HEADER.pack(False, len(body)) + body):
        return False
    connection = raw.connection
    connection.messages_sent += 1
    connection.last_message_sent = time.monotonic()
    return True


def send_data_now(raw: grpclib.protocol.Stream, data: bytes) -> bool:
    """Sends `data` on an open HTTP/2 stream at once, without awaiting, when it fits in one
    DATA frame and the stream's flow-control window and the connection is writable: what
    grpclib's `send_data` does when it would not wait. False, with nothing sent, otherwise
    (or when h2 refuses the frame): the caller then goes the awaiting way, which waits or
    raises as grpclib does. Saves the replication path a task wake-up per message
    (issue 27 point 6: the queue and writer task cost one loop turn on a busy broker)."""
    size = len(data)
    try:  # grpclib's private names: anything unexpected goes the awaiting way, nothing sent
        connection = raw.connection
        transport = raw._transport
        if raw.id is None or not connection.write_ready.is_set() or transport.is_closing():
            return False
        h2_connection = raw._h2_connection
        if size > h2_connection.max_outbound_frame_size:
            return False
        if h2_connection.local_flow_control_window(raw.id) < size:
            return False
    except Exception:
        return False
    try:
        h2_connection.send_data(raw.id, data)
    except h2.exceptions.H2Error:
        return False
    transport.write(h2_connection.data_to_send())
    raw.data_sent += size
    connection.data_sent += size
    connection.data_send_process()
    return True


Call = Callable[[Any], Awaitable[Any]]


def unary(
    call: Call,
    request_type: type,
    response_type: type,
    *,
    limit: int | Callable[[], int] = DEFAULT_REQUEST_LIMIT,
) -> grpclib.const.Handler:
    """A unary handler that maps `DanubeError` to its status and any other failure to INTERNAL
    with a log line, so no request ever sees a bare traceback."""

    async def handle(stream: grpclib.server.Stream) -> None:
        request = await recv_single(stream, limit() if callable(limit) else limit)
        metadata = stream.metadata
        FORWARDED.set(metadata is not None and FORWARDED_HEADER in metadata)
        try:
            response = await call(request)
        except DanubeError as error:
            raise grpc_error(error) from None
        except GRPCError:
            raise
        except Exception as error:
            raise internal_error(call.__name__, error) from None
        await stream.send_message(response)

    return grpclib.const.Handler(
        handle, grpclib.const.Cardinality.UNARY_UNARY, request_type, response_type
    )


RpcDone = Callable[[str, str, str], None]
"""Told (service, method, grpc status name) as each call ends."""


def _counted(path: str, handler: grpclib.const.Handler, done: RpcDone) -> grpclib.const.Handler:
    """The handler, reporting how each call ended: the status it raised, OK,
    DEADLINE_EXCEEDED or CANCELLED when it was cut short (`_abandoned`), UNKNOWN for
    anything else (what grpclib answers then)."""
    service, _, method = path.lstrip("/").partition("/")
    func = handler.func

    async def call(stream: grpclib.server.Stream) -> None:
        try:
            await func(stream)
        except GRPCError as error:
            done(service, method, error.status.name)
            raise
        except (asyncio.CancelledError, StreamTerminatedError):
            done(service, method, _abandoned(stream).name)
            raise
        except Exception:
            done(service, method, Status.UNKNOWN.name)
            raise
        done(service, method, Status.OK.name)

    return handler._replace(func=call)


_PASSED_THROUGH = (
    asyncio.CancelledError,
    TimeoutError,  # grpclib's deadline
    StreamTerminatedError,
    h2.exceptions.StreamClosedError,
    ConnectionError,
)
"""Ways a call ends that grpclib handles itself (the client left, the deadline passed)."""


def _proving(handler: grpclib.const.Handler) -> grpclib.const.Handler:
    """The handler, telling its connection a call was admitted before it runs: innermost,
    so past authentication when the port authenticates (the connection gate's first call,
    `GuardedConnection.on_call`)."""
    func = handler.func

    async def call(stream: grpclib.server.Stream) -> None:
        connection = getattr(getattr(stream, "_stream", None), "connection", None)
        on_call = getattr(connection, "on_call", None)
        if on_call is not None:
            on_call()
        await func(stream)

    return handler._replace(func=call)


def _guarded(path: str, handler: grpclib.const.Handler) -> grpclib.const.Handler:
    """The handler, with every status message it ends with cut to `STATUS_MESSAGE_LIMIT`
    (grpclib's own errors raised inside the call included) and any unforeseen exception
    answered INTERNAL and logged by `internal_error`, instead of grpclib's UNKNOWN with a
    traceback per call."""
    func = handler.func

    async def call(stream: grpclib.server.Stream) -> None:
        try:
            await func(stream)
        except GRPCError as error:
            if error.message is None or len(error.message) <= STATUS_MESSAGE_LIMIT // 4:
                raise
            raise GRPCError(error.status, capped(error.message), error.details) from None
        except (asyncio.CancelledError, StreamTerminatedError):
            # The client left, reset the stream or its deadline passed: the broker's own
            # event, where grpclib logged an INFO line without the RPC's name ("Request was
            # cancelled: Connection lost"); `setup_logging` keeps grpclib at WARNING. A
            # connection that closed logged one line for all its calls (`h2_guard`).
            if not _cut_with_connection(stream):
                log.info(
                    "event=stream_closed rpc=%s status=%s peer=%s",
                    path, _abandoned(stream).name, _peer(stream),
                )  # fmt: skip
            raise
        except _PASSED_THROUGH:
            raise
        except Exception as error:
            raise internal_error(path, error) from None

    return handler._replace(func=call)


def _peer(stream: grpclib.server.Stream) -> str:
    """host:port of the call's client, or `-` when grpclib cannot say."""
    try:
        address = stream.peer.addr()
    except Exception:  # the transport may already be gone
        return "-"
    return f"{address[0]}:{address[1]}" if address else "-"


def _cut_with_connection(stream: grpclib.server.Stream) -> bool:
    """Whether the call ended because its connection closed (logged there, once)."""
    connection = getattr(getattr(stream, "_stream", None), "connection", None)
    return bool(getattr(connection, "streams_cut", 0))


def _abandoned(stream: grpclib.server.Stream) -> Status:
    """Why a call was cut short: DEADLINE_EXCEEDED once the client's deadline (grpc-timeout)
    has passed, as grpclib then cancels the handler itself; CANCELLED when the client left
    or reset the stream before it."""
    deadline = stream.deadline
    if deadline is not None and deadline.time_remaining() <= 0:
        return Status.DEADLINE_EXCEEDED
    return Status.CANCELLED


class Server(grpclib.server.Server):
    """grpclib's server, plus every call `_guarded` (short status messages, no traceback per
    call), plus closing the accepted connections at shutdown (grpclib 0.4.9
    cancels their requests but leaves the sockets open: a ResourceWarning at exit), plus
    `rpc_done` told the outcome of every call (`danube_broker_rpc_total`), plus the HTTP/2
    connection guard's `limits` on every connection (`danube.runtime.h2_guard`), plus `auth`
    around every handler when the port authenticates (`danube.runtime.auth`)."""

    def __init__(
        self,
        handlers: list[Any],
        rpc_done: RpcDone | None = None,
        limits: GrpcConfig | None = None,
        auth: Wrapper | None = None,
        gate: GatedConnections | None = None,
    ) -> None:
        super().__init__(handlers, config=grpclib_config())
        self.limits = limits or GrpcConfig()
        self.gate = gate
        """The broker's connection gate, shared by its ports (None: no cap)."""
        self._mapping = {path: _proving(handler) for path, handler in self._mapping.items()}
        if auth is not None:  # innermost: authenticated before the handler reads the body
            self._mapping = {path: auth(path, handler) for path, handler in self._mapping.items()}
        self._mapping = {path: _guarded(path, handler) for path, handler in self._mapping.items()}
        if rpc_done is not None:
            self._mapping = {
                path: _counted(path, handler, rpc_done) for path, handler in self._mapping.items()
            }
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()
        self.count = TransportCount()
        """Open streams and connections, kept as they open and close (`transport_counts`)."""

    def _protocol_factory(self) -> H2Protocol:
        self.__gc_step__()
        handler = GuardedHandler(
            self._mapping, self._codec, self._status_details_codec, self.__dispatch__
        )
        handler.count = self.count
        handler.on_finished = self._let_go
        self._handlers.add(handler)
        protocol = GuardedProtocol(handler, self._config, self._h2_config, self.limits)
        protocol.count = self.count
        protocol.gated = self.gate
        self._protocols.add(protocol)
        return protocol

    def _let_go(self, handler: GuardedHandler) -> None:
        """A connection closed and its last task ended: its handler is dropped now, not when a
        tenth later connection opens (grpclib's sweep; `GuardedHandler`). The set is replaced,
        not changed: grpclib's `close` iterates it while each handler's `close` may end here
        (and its sweep replaces it too, so a bound `discard` would go to a stale set)."""
        if handler in self._handlers:
            self._handlers = self._handlers - {handler}

    async def start(  # type: ignore[override]
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        sock: socket.socket | None = None,
        backlog: int = 100,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        """grpclib's TCP `start`, plus a deadline on the TLS handshake. The HTTP/2 guard's
        handshake timeout starts once the connection reaches it, which with TLS is after the
        TLS handshake, and asyncio waits 60 s for that: 40 connections that never finished
        their ClientHello held their sockets that long (the hostile suite, secured). With TLS
        the handshake gets `handshake_timeout_ms` too (0: asyncio's default)."""
        if self._server is not None:
            raise RuntimeError("Server is already started")
        timeout_ms = self.limits.handshake_timeout_ms
        tls_deadline = timeout_ms / 1000 if ssl is not None and timeout_ms > 0 else None
        self._server = await self._loop.create_server(
            self._protocol_factory, host, port, sock=sock, backlog=backlog, ssl=ssl,
            ssl_handshake_timeout=tls_deadline,
        )  # fmt: skip
        self._server_closed_fut = self._loop.create_future()

    def transport_counts(self) -> tuple[int, int]:
        """Open gRPC streams (request tasks not finished) and open client connections: what the
        state pool charges for them (`BrokerCore.transport_open`, spec/memory.md). O(1): kept
        as they open and close (`TransportCount`), read at every tick."""
        return self.count.streams, self.count.connections

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()


class Unimplemented:
    """Answers UNIMPLEMENTED, with a reason, for every method of `bases` that no other
    service of the server implements. grpclib's own answer for an unknown method lacks the
    content-type header, so grpclib clients see UNKNOWN instead."""

    def __init__(self, bases: list[type], implemented: list[Any], reason: str) -> None:
        taken: set[str] = set()
        for service in implemented:
            taken.update(service.__mapping__())
        self._routes: dict[str, grpclib.const.Handler] = {}
        for base in bases:
            for path, handler in base().__mapping__().items():
                if path not in taken:
                    self._routes[path] = grpclib.const.Handler(
                        self._refuse(path, reason),
                        handler.cardinality,
                        handler.request_type,
                        handler.reply_type,
                    )

    @staticmethod
    def _refuse(path: str, reason: str) -> Callable[[grpclib.server.Stream], Awaitable[None]]:
        async def refuse(_: grpclib.server.Stream) -> None:
            raise GRPCError(Status.UNIMPLEMENTED, f"{path} is not implemented: {reason}")

        return refuse

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return self._routes
