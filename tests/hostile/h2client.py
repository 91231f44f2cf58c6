"""A blocking HTTP/2 client built on the `h2` state machine, for abuse no well-behaved client
library would send: it writes whatever frames the test asks for and reads what comes back
without ever blocking on the server."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions


def grpc_headers(
    path: str, authority: str, extra: list[tuple[str, str]] | None = None, scheme: str = "http"
) -> list:
    return [
        (":method", "POST"),
        (":scheme", scheme),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc+proto"),
        ("te", "trailers"),
        *(extra or []),
    ]


def grpc_frame(body: bytes, compressed: bool = False) -> bytes:
    return bytes([1 if compressed else 0]) + len(body).to_bytes(4, "big") + body


HEALTH_PATH = "/danube.HealthCheck/HealthCheck"
HEALTH_BODY = grpc_frame(b"\x08\x01")  # request_id = 1


@dataclass
class Seen:
    """What the server sent back."""

    goaway: bool = False
    goaway_code: int | None = None
    closed: bool = False
    resets: dict[int, int] = field(default_factory=dict)
    """Streams the server reset, with the error code."""
    statuses: dict[int, str] = field(default_factory=dict)
    """grpc-status (or :status when not 200) of each answered stream."""
    settings: dict[int, int] = field(default_factory=dict)


class RawH2:
    def __init__(
        self,
        address: str,
        timeout: float = 10.0,
        *,
        context: ssl.SSLContext | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """`context`: TLS (negotiating h2) on a secured broker; `headers` go on every call
        `call_headers` builds (a bearer token)."""
        host, _, port = address.rpartition(":")
        self.authority = address
        self.secured = context is not None
        self.headers = headers
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.seen = Seen()

    def __enter__(self) -> RawH2:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def call_headers(self, path: str, extra: list[tuple[str, str]] | None = None) -> list:
        """A gRPC call's request headers on this connection (scheme, credentials)."""
        scheme = "https" if self.secured else "http"
        return grpc_headers(path, self.authority, [*self.headers, *(extra or [])], scheme)

    def handshake(self) -> None:
        self.conn.initiate_connection()
        self.flush()
        # A broker still busy with an earlier abuse may take a while to send its SETTINGS.
        self.pump(15.0, until=lambda: bool(self.seen.settings))

    def flush(self) -> bool:
        """Sends what h2 has queued; False once the server has closed the connection."""
        data = self.conn.data_to_send()
        if not data or self.seen.closed:
            return not self.seen.closed
        try:
            self.sock.settimeout(10.0)
            self.sock.sendall(data)
        except OSError:
            self.seen.closed = True
        return not self.seen.closed

    def pump(self, seconds: float, until: object = None) -> None:
        """Reads and handles what arrives for up to `seconds` (less once `until()` holds or
        the connection closes)."""
        deadline = time.monotonic() + seconds
        while not self.seen.closed:
            if until is not None and until():  # type: ignore[operator]
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(min(left, 0.2))
            self._read()

    def drain(self) -> None:
        """Handles whatever has already arrived, without waiting."""
        self.sock.settimeout(0.0)
        while not self.seen.closed and self._read():
            pass

    def _read(self) -> bool:
        """One receive, handled: True when data came, False when none was there in time or
        the connection closed (`seen.closed` says which)."""
        try:
            data = self.sock.recv(1 << 16)
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False
        except OSError:
            self.seen.closed = True
            return False
        if not data:
            self.seen.closed = True
            return False
        self._feed(data)
        return True

    def _feed(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.seen.closed = True
            return
        for event in events:
            if isinstance(event, h2.events.ConnectionTerminated):
                self.seen.goaway = True
                self.seen.goaway_code = int(event.error_code or 0)
            elif isinstance(event, h2.events.StreamReset):
                self.seen.resets[event.stream_id] = int(event.error_code)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                for code, change in event.changed_settings.items():
                    self.seen.settings[int(code)] = change.new_value
            elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                headers = dict(event.headers)
                if "grpc-status" in headers:
                    self.seen.statuses[event.stream_id] = headers["grpc-status"]
                elif headers.get(":status", "200") != "200":
                    self.seen.statuses[event.stream_id] = "http " + headers[":status"]
            elif isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        self.flush()
