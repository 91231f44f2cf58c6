"""A TCP proxy on loopback that a test can cut and heal: the network partition of a
real-process test without root (no iptables, no network namespaces).

A broker advertises the proxy's address as its admin address (`--advertised-admin-addr`), so
the other brokers reach it through the proxy (an owner replicating to it, a forwarded admin
call) while clients do not. `cut()` resets every
connection through the proxy and refuses new ones until `heal()`: what a peer sees when a
link between two machines goes down and a firewall answers with resets. Threads, not an event
loop: the test process's own trio or asyncio code stays out of its way.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

CHUNK = 64 * 1024


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0): the peer learns at once, as from a refusing host."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class TcpProxy:
    def __init__(self, target: tuple[str, int] | None = None, host: str = "127.0.0.1") -> None:
        self.target = target
        """Where connections go; None until set (a connection before that is reset)."""
        self._listener = socket.create_server((host, 0), backlog=128)
        self._listener.settimeout(0.1)
        self.host, self.port = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._ended: dict[tuple[socket.socket, socket.socket], int] = {}
        """Directions of a pair that ended cleanly: at two its sockets are closed."""
        self._open = True
        self._closed = False
        self.accepted = 0
        """Connections forwarded to the target."""
        self.refused = 0
        """Connections reset on arrival (cut, or no target yet)."""
        self.dropped = 0
        """Forwarded connections reset by a cut."""
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return not self._open

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> None:
        """Reset every connection through the proxy and refuse new ones."""
        with self._lock:
            self._open = False
            pairs, self._pairs = list(self._pairs), set()
            self._ended.clear()
        for pair in pairs:
            self.dropped += 1
            for sock in pair:
                _reset(sock)

    def heal(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._thread.join(2)
        self._listener.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = self.target
            if not self._open or target is None:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(target, timeout=5)
                upstream.settimeout(None)
                # Small frames pass at once: Nagle against delayed ACKs would add ~40 ms.
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                self.refused += 1
                _reset(client)
                continue
            pair = (client, upstream)
            with self._lock:
                if not self._open:  # cut while connecting
                    self.refused += 1
                    _reset(client)
                    _reset(upstream)
                    continue
                self._pairs.add(pair)
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(pair, source, sink), daemon=True).start()

    def _pump(
        self, pair: tuple[socket.socket, socket.socket], source: socket.socket, sink: socket.socket
    ) -> None:
        """One direction. A clean end travels on as one (half-close); a failure on either
        side resets both, as a dead link would."""
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            with self._lock:
                live = pair in self._pairs
                self._pairs.discard(pair)
                self._ended.pop(pair, None)
            if live:  # not already reset by a cut
                for sock in pair:
                    _reset(sock)
            return
        with self._lock:
            ended = self._ended[pair] = self._ended.get(pair, 0) + 1
            done = ended == 2 and pair in self._pairs
            if ended == 2:
                self._pairs.discard(pair)
                del self._ended[pair]
        if done:
            for sock in pair:
                sock.close()
