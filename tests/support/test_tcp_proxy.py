"""The loopback proxy the partition tests cut: bytes pass both ways, a cut resets live
connections and refuses new ones, a heal lets new ones through again."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.support.tcp_proxy import TcpProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(4096):
                self.request.sendall(data)
        except OSError:  # the proxy's cut resets this side too
            pass


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[:2]
    server.shutdown()
    server.server_close()


def _round_trip(address: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(4096):
            got += chunk
        return got


def test_bytes_pass_both_ways(echo: tuple[str, int]) -> None:
    with TcpProxy(echo) as proxy:
        data = bytes(range(256)) * 1000  # larger than one chunk
        assert _round_trip((proxy.host, proxy.port), data) == data
        assert proxy.accepted == 1 and proxy.refused == 0


def test_a_cut_resets_open_connections_and_refuses_new_ones_until_healed(
    echo: tuple[str, int],
) -> None:
    with TcpProxy(echo) as proxy:
        open_one = socket.create_connection((proxy.host, proxy.port), timeout=5)
        open_one.sendall(b"hello")
        assert open_one.recv(5) == b"hello"

        proxy.cut()
        with pytest.raises(OSError):  # reset, or nothing more to read
            open_one.sendall(b"again")
            if not open_one.recv(5):
                raise ConnectionResetError("closed")
        open_one.close()
        assert proxy.dropped == 1
        with pytest.raises(OSError):
            _round_trip((proxy.host, proxy.port), b"refused") or _raise()
        assert proxy.refused >= 1

        proxy.heal()
        assert _round_trip((proxy.host, proxy.port), b"healed") == b"healed"


def test_no_target_yet_is_a_refusal(echo: tuple[str, int]) -> None:
    with TcpProxy() as proxy:
        with pytest.raises(OSError):
            _round_trip((proxy.host, proxy.port), b"x") or _raise()
        proxy.target = echo
        assert _round_trip((proxy.host, proxy.port), b"now") == b"now"


def _raise() -> bytes:
    """A refused connection may read as an empty answer rather than a reset."""
    raise ConnectionResetError("empty answer")
