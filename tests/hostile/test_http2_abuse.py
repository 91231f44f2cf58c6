"""HTTP/2 abuse against a real broker (issue 20 (5), (10); deliver 2, 7, 8): rapid reset
bursts (CVE-2023-44487), more streams than the broker allows, an oversized header block,
connections that never finish the preface, and slow clients on the health endpoint. Each
must be bounded (refused, reset or closed) while HealthCheck on another connection stays
fast; at the end the broker is alive, its memory bounded and its acknowledged data intact.

Every scenario runs twice (issue 25, deliver 7): against a plaintext broker of its own and
against the suite's shared secured broker (TLS, a bearer token on every call: the abuse comes
from an authenticated client, past the guard). Secured, an unfinished preface is also an
unfinished TLS handshake, and the slow clients of the health endpoint hold TLS connections.

HOSTILE_RESETS (default 20000) sets the rapid-reset burst; HOSTILE_HANDSHAKE_S (default 20)
how long an unfinished preface may hold its connection open.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import h2.exceptions
import h2.settings
import hpack
import pytest
from grpclib.const import Status

from tests.hostile.h2client import HEALTH_BODY, HEALTH_PATH, RawH2
from tests.hostile.harness import WatchedBroker
from tests.hostile.ledger import LEDGER, env_float, env_int
from tests.hostile.secured import access_of, plain_or_secured

pytestmark = pytest.mark.slow

RESETS = env_int("HOSTILE_RESETS", 20_000)
HANDSHAKE_S = env_float("HOSTILE_HANDSHAKE_S", 20.0)
STREAM_CAP = env_int("HOSTILE_STREAM_CAP", 1000)
"""The most concurrent streams per connection the broker may allow (grpc-go's default
MaxConcurrentStreams is unlimited, but the CVE fixes bound it; 1000 is generous)."""
HEADER_BYTES = 1 << 20


@pytest.fixture(scope="module", params=["plain", "secured"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WatchedBroker]:
    yield from plain_or_secured(request, tmp_path_factory, "hostile-h2", "http2")


def _h2(broker: WatchedBroker) -> RawH2:
    """A raw HTTP/2 connection to the client port: over TLS with the token when secured."""
    access = access_of(broker)
    return RawH2(broker.addr, context=access.grpc_context(), headers=access.headers)


def test_rapid_reset_is_cut_off_with_goaway(broker: WatchedBroker) -> None:
    """HEADERS then RST_STREAM, over and over on one connection: the broker must close the
    connection (GOAWAY) before the burst ends, and stay responsive meanwhile."""
    started = broker.mark()
    sent = 0
    with _h2(broker) as client:
        client.handshake()
        headers = client.call_headers(HEALTH_PATH)
        while sent < RESETS and not client.seen.closed and not client.seen.goaway:
            for _ in range(200):
                try:
                    stream_id = client.conn.get_next_available_stream_id()
                    client.conn.send_headers(stream_id, headers)
                    client.conn.reset_stream(stream_id)
                except h2.exceptions.ProtocolError:
                    client.seen.closed = True
                    break
                sent += 1
            client.flush()
            client.drain()
        client.pump(2.0, until=lambda: client.seen.goaway)
        seen = client.seen
    outcome = "GOAWAY" if seen.goaway else ("CLOSED" if seen.closed else "ENDURED")
    LEDGER.record("http2", "rapid reset", outcome)
    LEDGER.notes.append(f"rapid reset: {sent} HEADERS+RST_STREAM pairs sent, then {outcome}")
    # The stall is issue 20 (5)'s main harm: judged first, so its window is recorded.
    broker.assert_healthy_since(started, f"rapid reset x{sent}")
    assert seen.goaway or seen.closed, f"{sent} HEADERS+RST_STREAM pairs all accepted"


def test_streams_beyond_the_cap_are_refused(broker: WatchedBroker) -> None:
    """The broker advertises MAX_CONCURRENT_STREAMS, and refuses streams opened beyond it
    (RST_STREAM or GOAWAY) instead of starting a handler for each."""
    started = broker.mark()
    with _h2(broker) as client:
        client.handshake()
        advertised = client.seen.settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
        cap = advertised if advertised is not None else STREAM_CAP
        opening = min(cap, STREAM_CAP) + 50
        # Our h2 would refuse to exceed the server's limit itself: the attacker's does not.
        client.conn.remote_settings.max_concurrent_streams = 2**31
        client.conn.remote_settings.acknowledge()
        headers = client.call_headers(HEALTH_PATH)
        for _ in range(opening):
            if client.seen.closed:
                break
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(stream_id, headers)
            if stream_id % 100 == 1:
                client.flush()
                client.drain()
        client.flush()
        client.pump(3.0)
        refused = len(client.seen.resets)
        closed = client.seen.goaway or client.seen.closed
    LEDGER.record("http2", "streams beyond the cap", "REFUSED" if refused or closed else "OPEN")
    broker.measure(started, f"{opening} open streams")
    assert advertised is not None and advertised <= STREAM_CAP, (
        f"MAX_CONCURRENT_STREAMS advertised: {advertised}"
    )
    assert closed or refused >= opening - advertised, (
        f"{opening} streams opened, {refused} refused, limit {advertised}"
    )
    broker.assert_healthy_since(started, f"{opening} open streams")


def test_an_oversized_header_block_is_refused(broker: WatchedBroker) -> None:
    """A 1 MiB header value (in CONTINUATION frames): the call must not be served; the
    stream is refused or the connection closed, and the loop does not stall decoding it."""
    started = broker.mark()
    with _h2(broker) as client:
        client.handshake()
        stream_id = client.conn.get_next_available_stream_id()
        junk = [("x-junk", "a" * HEADER_BYTES)]
        # hpack's pure-Python Huffman coder would take minutes on our side: send it raw.
        encoder = client.conn.encoder
        client.conn.encoder.encode = functools.partial(  # type: ignore[method-assign]
            hpack.Encoder.encode, encoder, huffman=False
        )
        client.conn.send_headers(stream_id, client.call_headers(HEALTH_PATH, junk))
        client.conn.send_data(stream_id, HEALTH_BODY, end_stream=True)
        client.flush()
        client.pump(
            15.0,
            until=lambda: stream_id in client.seen.statuses or stream_id in client.seen.resets,
        )
        status = client.seen.statuses.get(stream_id)
        refused = stream_id in client.seen.resets or client.seen.goaway or client.seen.closed
    outcome = "REFUSED" if refused else f"status {status}"
    LEDGER.record("http2", "1 MiB header", "RESOURCE_EXHAUSTED" if status == "8" else outcome)
    broker.measure(started, "1 MiB header block")
    assert refused or (status is not None and status != "0"), f"served anyway: {outcome}"
    broker.assert_healthy_since(started, "1 MiB header block")


@pytest.mark.parametrize(
    ("case", "data"),
    [
        ("length 2^32-1, 3 bytes sent", b"\x00\xff\xff\xff\xff\x08\x01\x00"),
        ("16 MiB message", b"\x00" + (16 << 20).to_bytes(4, "big") + b"\x08\x01" * (8 << 20)),
        ("cut inside the prefix", b"\x00\x00\x00"),
    ],
)
def test_a_lying_grpc_frame_gets_a_clean_status(
    broker: WatchedBroker, case: str, data: bytes
) -> None:
    """The 5-byte gRPC message prefix lies (or the message is far over any limit): the call
    ends with a clean status that is not OK (RESOURCE_EXHAUSTED naming the limit, or
    INVALID_ARGUMENT), never INTERNAL or UNKNOWN, and the connection survives for others."""
    started = broker.mark()
    with _h2(broker) as client:
        client.handshake()
        stream_id = client.conn.get_next_available_stream_id()
        client.conn.send_headers(stream_id, client.call_headers(HEALTH_PATH))
        client.conn.increment_flow_control_window(1 << 30)
        sent = 0
        while sent < len(data) and not client.seen.closed:
            window = client.conn.local_flow_control_window(stream_id)
            room = min(window, client.conn.max_outbound_frame_size, len(data) - sent)
            if room <= 0:
                client.pump(0.5)
                if stream_id in client.seen.statuses or stream_id in client.seen.resets:
                    break
                continue
            chunk = data[sent : sent + room]
            sent += room
            client.conn.send_data(stream_id, chunk, end_stream=sent == len(data))
            client.flush()
        client.pump(
            10.0,
            until=lambda: stream_id in client.seen.statuses or stream_id in client.seen.resets,
        )
        raw = client.seen.statuses.get(stream_id)
    names = {str(status.value): status.name for status in Status}
    outcome = names.get(raw or "", raw or ("RESET" if client.seen.resets else "DROPPED"))
    LEDGER.record("grpc-framing", case, outcome, data[:48])
    broker.measure(started, f"gRPC frame: {case}")
    assert outcome not in {"OK", "INTERNAL", "UNKNOWN", "DROPPED"}, f"{case}: {outcome}"
    broker.assert_healthy_since(started, f"gRPC frame: {case}")


def _slow_sockets(
    address: str, context: ssl.SSLContext | None, opening: bytes, count: int = 40
) -> list[socket.socket]:
    """`count` connections that each send `opening` and then nothing. Secured (`context`),
    half of them never finish the TLS handshake (a record header of a ClientHello that never
    comes), the other half finish it and then send `opening` inside TLS."""
    host, _, port = address.rpartition(":")
    sockets: list[socket.socket] = []
    for index in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        if context is None:
            sock.sendall(opening)
        elif index % 2 == 0:
            sock.sendall(b"\x16\x03\x01\x02\x00")  # a handshake record of 512 bytes: none follow
        else:
            sock = context.wrap_socket(sock, server_hostname=host)
            sock.sendall(opening)
        sockets.append(sock)
    return sockets


def _still_open(sockets: list[socket.socket], seconds: float) -> list[socket.socket]:
    """The sockets the server has not closed after `seconds` (fewer once all are closed)."""
    deadline = time.monotonic() + seconds
    open_ = list(sockets)
    while open_ and time.monotonic() < deadline:
        for sock in list(open_):
            sock.settimeout(0.05)
            try:
                if sock.recv(4096) == b"":
                    open_.remove(sock)
            except TimeoutError:
                pass
            except OSError:
                open_.remove(sock)
    return open_


def test_unfinished_prefaces_are_timed_out(broker: WatchedBroker) -> None:
    """Connections that never finish the HTTP/2 preface (secured: nor the TLS handshake)
    are closed by the broker."""
    started = broker.mark()
    context = access_of(broker).grpc_context()
    sockets = _slow_sockets(broker.addr, context, b"PRI * HTTP/2.0\r\n")
    open_ = _still_open(sockets, HANDSHAKE_S)
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()
    LEDGER.record("http2", "unfinished preface", "OPEN" if open_ else "CLOSED")
    broker.measure(started, "40 unfinished prefaces")
    assert not open_, f"{len(open_)} of 40 unfinished prefaces still open after {HANDSHAKE_S} s"
    broker.assert_healthy_since(started, "40 unfinished prefaces")


def test_health_endpoint_answers_under_slow_clients(broker: WatchedBroker) -> None:
    """40 unfinished HTTP request heads on the metrics port (secured: half of them unfinished
    TLS handshakes) must not make /healthz fail (a liveness probe would kill the broker)."""
    metrics = broker.process.metrics_addr
    access = access_of(broker)
    sockets = []
    try:
        sockets = _slow_sockets(
            metrics, access.http_context(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(
                f"{access.scheme}://{metrics}/healthz", timeout=10, context=access.http_context()
            ) as answer:
                code = answer.status
        except urllib.error.HTTPError as error:
            code = error.code
        took = time.monotonic() - started
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
    LEDGER.record("http2", "healthz under slow heads", f"HTTP {code}")
    assert code == 200 and took < 1.0, f"/healthz answered {code} after {took:.1f} s"


def test_the_broker_came_through(broker: WatchedBroker) -> None:
    problems = broker.checkpoint() if broker.security else broker.finish()
    assert not problems, "; ".join(problems)
