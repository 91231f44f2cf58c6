"""A raw HTTP/2 client (the `h2` library over asyncio streams) that behaves as a hostile or
frozen gRPC client would: the tests of `danube.runtime.h2_guard` drive brokers with it."""

from __future__ import annotations

import asyncio
import struct
import time

import h2.config
import h2.connection
import h2.events
from h2.errors import ErrorCodes

from danube.proto import danube as pb

HEALTH_PATH = "/danube.HealthCheck/HealthCheck"


def grpc_headers(path: str, authority: str = "localhost", extra: int = 0) -> list[tuple[str, str]]:
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if extra:
        headers.append(("x-pad", "p" * extra))
    return headers


def grpc_frame(message: bytes) -> bytes:
    return struct.pack(">?I", False, len(message)) + message


HEALTH_REQUEST = grpc_frame(
    bytes(pb.HealthCheckRequest(client=pb.HealthCheckRequestClientType.Producer, id=1))
)


class RawH2:
    """One HTTP/2 connection whose frames the test writes and reads by hand. Nothing is read
    (so no PING is answered) unless the test calls `pump`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.events: list[h2.events.Event] = []
        self.closed = False
        """The broker closed the socket (EOF or reset)."""
        self.mute = False
        """Write nothing at all (a client that never completes its handshake)."""

    @classmethod
    async def open(cls, port: int, *, handshake: bool = True) -> RawH2:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        client.mute = not handshake
        if handshake:
            client.h2.initiate_connection()
            await client.flush()
        return client

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.mute:
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (ConnectionError, OSError):
                self.closed = True

    def request(
        self, path: str = HEALTH_PATH, body: bytes | None = HEALTH_REQUEST, extra: int = 0
    ) -> int:
        """Queues one request (HEADERS, and DATA ending the stream unless `body` is None)."""
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, grpc_headers(path, extra=extra), end_stream=False)
        if body is not None:
            self.h2.send_data(stream_id, body, end_stream=True)
        return stream_id

    async def pump(self, seconds: float) -> list[h2.events.Event]:
        """Reads (and answers PINGs, as h2 does) for up to `seconds` or until the socket
        closes; returns the events seen."""
        seen: list[h2.events.Event] = []
        deadline = time.monotonic() + seconds
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                data = await asyncio.wait_for(self.reader.read(65536), left)
            except TimeoutError:
                break
            except (ConnectionError, OSError):
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError:
                events = []
            seen.extend(events)
            await self.flush()
        self.events.extend(seen)
        return seen

    def goaway(self) -> h2.events.ConnectionTerminated | None:
        for event in self.events:
            if isinstance(event, h2.events.ConnectionTerminated):
                return event
        return None

    def trailers(self, stream_id: int) -> dict[str, str]:
        """The stream's response headers and trailers, merged."""
        merged: dict[str, str] = {}
        for event in self.events:
            if (
                isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived)
                and event.stream_id == stream_id
            ):
                merged.update(dict(event.headers))  # type: ignore[arg-type]
        return merged

    def close(self) -> None:
        self.writer.close()


async def rapid_reset(client: RawH2, pairs: int, path: str, batch: int = 100) -> int:
    """Sends up to `pairs` x (HEADERS + RST_STREAM CANCEL); returns how many went out before
    the broker closed the connection."""
    sent = 0
    while sent < pairs and not client.closed:
        for _ in range(min(batch, pairs - sent)):
            stream_id = client.request(path, body=None)
            client.h2.reset_stream(stream_id, ErrorCodes.CANCEL)
            sent += 1
        await client.flush()
        await client.pump(0.001)  # notice a GOAWAY or EOF without waiting
        if client.goaway() is not None:
            break
    return sent
