"""Every gRPC method the generated code declares, and a way to send any bytes to it.

The methods come from the `__mapping__` of each generated `...Base` class (so a method added
to proto/ is fuzzed without touching the suite); the bytes go out through grpclib with a codec
that passes them through untouched, each as one length-prefixed gRPC message."""

from __future__ import annotations

import asyncio
import inspect
import ssl
from dataclasses import dataclass
from typing import Any

import h2.exceptions
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from danube.proto import danube, danube_admin, danube_ext, danube_schema

CLIENT_PACKAGES = ("danube.", "danube_schema.", "danube_ext.ProducerExt", "danube_ext.ConsumerExt")
ADMIN_PACKAGES = ("danube_admin.", "danube_schema.", "danube_ext.PolicyAdmin")
"""Which services each port serves (README: the client port and the admin port); a method
sent to the other port must be refused cleanly too (UNIMPLEMENTED)."""

MAX_RESPONSES = 64
"""A streaming answer is read this far; the rest does not matter to the suite."""


@dataclass(frozen=True, slots=True)
class Method:
    path: str
    request_type: type
    server_streaming: bool

    @property
    def short(self) -> str:
        return self.path.rsplit("/", 2)[-2].split(".")[-1] + "/" + self.path.rsplit("/", 1)[-1]

    def served_on(self, port: str) -> bool:
        packages = CLIENT_PACKAGES if port == "client" else ADMIN_PACKAGES
        return self.path.lstrip("/").startswith(packages)


def all_methods() -> list[Method]:
    methods: dict[str, Method] = {}
    for module in (danube, danube_admin, danube_ext, danube_schema):
        for name, cls in sorted(vars(module).items()):
            if not (name.endswith("Base") and inspect.isclass(cls) and "__mapping__" in vars(cls)):
                continue
            mapping = cls.__mapping__(object.__new__(cls))
            for path, handler in mapping.items():
                methods[path] = Method(
                    path,
                    handler.request_type,
                    handler.cardinality in (Cardinality.UNARY_STREAM, Cardinality.STREAM_STREAM),
                )
    return [methods[path] for path in sorted(methods)]


class RawCodec(CodecBase):
    """Sends bytes as they are and hands back what the broker answers undecoded."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


def _wire_status(stream: Stream[bytes, bytes]) -> str | None:
    """The grpc-status the broker sent, as sent. grpclib's client reports a trailers-only
    answer without content-type (grpclib's server sends those for an unknown method) as
    UNKNOWN "Missing content-type header"; the suite judges what went over the wire."""
    h2_stream = getattr(stream, "_stream", None)
    for block in (getattr(h2_stream, "trailers", None), getattr(h2_stream, "headers", None)):
        value = dict(block or ()).get("grpc-status")
        if value is not None:
            try:
                return Status(int(value)).name
            except ValueError:
                return f"grpc-status {value}"
    return None


class RawCaller:
    """One connection to one port; reopened when the broker drops it (which is recorded)."""

    def __init__(
        self,
        address: str,
        context: ssl.SSLContext | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self.context = context
        """TLS (a secured broker) and the headers of every call (its token)."""
        self.metadata = metadata
        self.channel = self._open()

    def _open(self) -> Channel:
        return Channel(self.host, self.port, codec=RawCodec(), ssl=self.context)

    def close(self) -> None:
        self.channel.close()

    async def call(self, method: Method, messages: list[bytes], timeout: float = 5.0) -> str:
        """Sends `messages` as one call (several to a unary method: the abuse is the point);
        returns the gRPC status name, OK, DROPPED (no status: the connection or stream broke),
        TIMEOUT (a unary call unanswered) or OPEN (a stream still running at the deadline)."""
        stream = self.channel.request(
            method.path, Cardinality.STREAM_STREAM, bytes, bytes, timeout=timeout,
            metadata=self.metadata,
        )  # fmt: skip
        try:
            async with asyncio.timeout(timeout + 3):
                async with stream:
                    if not messages:
                        await stream.send_request(end=True)
                    for index, message in enumerate(messages):
                        await stream.send_message(message, end=index == len(messages) - 1)
                    responses = 0
                    async for _ in stream:
                        responses += 1
                        if responses >= MAX_RESPONSES:
                            await stream.cancel()
                            return "OK"
            return "OK"
        except GRPCError as error:
            return _wire_status(stream) or error.status.name
        except TimeoutError:
            return "OPEN" if method.server_streaming else "TIMEOUT"
        except (
            StreamTerminatedError,
            ProtocolError,
            ConnectionError,
            OSError,
            h2.exceptions.ProtocolError,
        ):
            self.channel.close()
            self.channel = self._open()
            return "DROPPED"
