"""grpclib plumbing shared by every service: bounded reads, error mapping, unary handlers."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import struct
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import grpclib.const
import grpclib.server
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError
from grpclib.protocol import H2Protocol

from danube.broker.h2_guard import GuardedHandler, GuardedProtocol, grpclib_config
from danube.core.config import GrpcConfig
from danube.core.errors import DanubeError

log = logging.getLogger("danube.broker")

DEFAULT_REQUEST_LIMIT = 1024 * 1024
"""Largest request other than a published message; anything bigger is not a Danube request."""

_MESSAGE_HEADER = struct.Struct(">?I")

FORWARDED_HEADER = "x-danube-forwarded"
"""Marks an admin call one broker forwarded to another (`danube.broker.forwarding`)."""

FORWARDED: contextvars.ContextVar[bool] = contextvars.ContextVar("forwarded", default=False)
"""The call being handled reached this broker forwarded by another one: it must not be
forwarded again."""


def grpc_error(error: DanubeError) -> GRPCError:
    return GRPCError(Status[error.code.name], error.message)


async def recv_bounded(stream: grpclib.server.Stream, limit: int, *, end_ok: bool = False) -> Any:
    """Reads one request, refusing it before buffering when its length prefix exceeds `limit`.
    With `end_ok` (client streams), the end of the client's stream returns None.

    grpclib 0.4.9 has no receive limit of its own, so a client could make the broker buffer a
    4 GiB message; this reads the gRPC length prefix itself (grpclib's internals are pinned)."""
    header = await stream._stream.recv_data(5)
    if not header and end_ok:
        return None
    if not header:
        raise GRPCError(Status.INVALID_ARGUMENT, "the request carried no message")
    if len(header) < 5:
        raise GRPCError(Status.INVALID_ARGUMENT, "truncated gRPC message header")
    compressed, length = _MESSAGE_HEADER.unpack(header)
    if compressed:
        raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not supported")
    if length > limit:
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"message of {length} bytes exceeds the broker's limit of {limit} bytes",
        )
    body = await stream._stream.recv_data(length)
    if len(body) != length:
        raise GRPCError(Status.INVALID_ARGUMENT, "truncated gRPC message")
    try:
        return stream._codec.decode(body, stream._recv_type)
    except Exception as error:
        raise GRPCError(Status.INVALID_ARGUMENT, f"undecodable request: {error}") from None


async def send_encoded(stream: grpclib.server.Stream, messages: list[bytes]) -> None:
    """Sends encoded messages on a server stream whose initial metadata went out: each is its
    own gRPC message (its own length prefix), but all go in one HTTP/2 send, where grpclib's
    `send_message` costs a send (flow-control check, frame, socket write) per message."""
    pack = _MESSAGE_HEADER.pack
    await stream._stream.send_data(b"".join([pack(False, len(m)) + m for m in messages]))
    stream._messages_sent += len(messages)  # grpclib's counters (channelz), kept true
    connection = stream._stream.connection
    connection.messages_sent += len(messages)
    connection.last_message_sent = time.monotonic()


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
        request = await recv_bounded(stream, limit() if callable(limit) else limit)
        metadata = stream.metadata
        FORWARDED.set(metadata is not None and FORWARDED_HEADER in metadata)
        try:
            response = await call(request)
        except DanubeError as error:
            raise grpc_error(error) from None
        except GRPCError:
            raise
        except Exception:
            log.exception("event=internal_error rpc=%s", call.__name__)
            raise GRPCError(Status.INTERNAL, "internal broker error (see broker log)") from None
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


def _abandoned(stream: grpclib.server.Stream) -> Status:
    """Why a call was cut short: DEADLINE_EXCEEDED once the client's deadline (grpc-timeout)
    has passed, as grpclib then cancels the handler itself; CANCELLED when the client left
    or reset the stream before it."""
    deadline = stream.deadline
    if deadline is not None and deadline.time_remaining() <= 0:
        return Status.DEADLINE_EXCEEDED
    return Status.CANCELLED


class Server(grpclib.server.Server):
    """grpclib's server, plus closing the accepted connections at shutdown (grpclib 0.4.9
    cancels their requests but leaves the sockets open: a ResourceWarning at exit), plus
    `rpc_done` told the outcome of every call (`danube_broker_rpc_total`), plus the HTTP/2
    connection guard's `limits` on every connection (`danube.broker.h2_guard`)."""

    def __init__(
        self,
        handlers: list[Any],
        rpc_done: RpcDone | None = None,
        limits: GrpcConfig | None = None,
    ) -> None:
        super().__init__(handlers, config=grpclib_config())
        self.limits = limits or GrpcConfig()
        if rpc_done is not None:
            self._mapping = {
                path: _counted(path, handler, rpc_done) for path, handler in self._mapping.items()
            }
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        self.__gc_step__()
        handler = GuardedHandler(
            self._mapping, self._codec, self._status_details_codec, self.__dispatch__
        )
        self._handlers.add(handler)
        protocol = GuardedProtocol(handler, self._config, self._h2_config, self.limits)
        self._protocols.add(protocol)
        return protocol

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
