"""One connection's flood must not hold every other client off (spec/hardening.md, HTTP/2):
what a read brings is fed to h2 a few new streams per turn of the loop (`FrameCutter`), and a
closed connection logs the calls it cut short once, not once per call. The hostile suite
found both: 550 HEADERS in one read, then the connection dropped, held a HealthCheck
100-150 ms."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import h2.config
import h2.connection
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.runtime.grpc_util import Server
from danube.runtime.h2_guard import GuardedProtocol
from danube.runtime.h2_policy import (
    HEADERS_FRAME,
    PREFACE_BYTES,
    STREAMS_PER_TURN,
    FrameCutter,
)
from danube.values.config import GrpcConfig
from tests.broker.h2_raw import HEALTH_REQUEST, grpc_headers
from tests.broker.test_h2_abuse import SLOW_PATH, Probe
from tests.support.aio import run

# -- the cutter: pure -------------------------------------------------------------------------

frame_specs = st.lists(
    st.tuples(st.sampled_from([0x0, 0x1, 0x3, 0x4, 0x6, 0x8, 0x9]), st.integers(0, 40)),
    max_size=60,
)


def _wire(frames: list[tuple[int, int]]) -> tuple[bytes, list[tuple[int, int]]]:
    """The preface and `frames` (type, payload length) as bytes, and each frame's (end
    offset, type)."""
    data = bytearray(b"P" * PREFACE_BYTES)
    ends = []
    for kind, length in frames:
        data += length.to_bytes(3, "big") + bytes([kind, 0]) + (1).to_bytes(4, "big")
        data += b"x" * length
        ends.append((len(data), kind))
    return bytes(data), ends


@given(
    frame_specs,
    st.lists(st.integers(1, 50), min_size=1, max_size=30),
    st.integers(1, 10),
    st.integers(1, 5),
)
def test_cuts_fall_on_frame_ends_and_each_share_is_as_large_as_the_limits_allow(
    frames: list[tuple[int, int]], reads: list[int], frame_limit: int, stream_limit: int
) -> None:
    """Whatever the reads' sizes, each turn's share (one `cut` of what is pending) holds no
    more frames or HEADERS than the limits, and one cut short of what is pending ends on a
    frame boundary: after the frame that reached the frame limit, or before the HEADERS
    frame that would pass the stream limit (a call's other frames stay with its HEADERS)."""
    data, ends = _wire(frames)
    starts = {PREFACE_BYTES} | {end for end, _ in ends}
    kind_at = {start: kind for start, (_, kind) in zip(sorted(starts), ends, strict=False)}
    cutter = FrameCutter()
    offset, read, begin, at = 0, b"", 0, 0
    turn = 0
    while at < len(data) or begin < len(read):
        if begin == len(read):  # a turn with nothing left over: the socket is read again
            size = reads[turn % len(reads)]
            read, begin, at = data[at : at + size], 0, at + size
        turn += 1
        cut = cutter.cut(read, frame_limit, stream_limit, begin=begin)
        assert begin < cut <= len(read)
        share = cut - begin
        inside = [kind for end, kind in ends if offset < end <= offset + share]
        headers = sum(kind == HEADERS_FRAME for kind in inside)
        assert len(inside) <= frame_limit and headers <= stream_limit
        offset, begin = offset + share, cut
        if begin < len(read):  # cut short: on a frame boundary, a limit reached
            assert offset in starts
            assert len(inside) == frame_limit or (
                headers == stream_limit and kind_at.get(offset) == HEADERS_FRAME
            )
    assert offset == len(data)


def test_a_frame_header_split_across_reads_is_followed() -> None:
    data, ends = _wire([(HEADERS_FRAME, 5), (0x0, 3), (HEADERS_FRAME, 0), (0x0, 2)])
    cutter = FrameCutter()
    first = PREFACE_BYTES + 4  # the preface and part of the first frame's header
    assert cutter.cut(data[:first], 10, 1) == first
    rest = data[first:]
    cut = cutter.cut(rest, 10, 1)
    assert first + cut == ends[1][0]  # the first call's HEADERS and DATA, not the next HEADERS
    rest = rest[cut:]
    assert cutter.cut(rest, 10, 1) == len(rest)  # the second call, whole


# -- the guard: a real grpclib server protocol, a recording transport --------------------------


class RecordingTransport(asyncio.Transport):
    """What the protocol does with its socket: writes, pauses and resumes of reading."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.pauses = 0
        self.resumes = 0
        self.closing = False
        self.eof = False

    def write(self, data: Any) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False
        self.resumes += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _connected(probe: Probe) -> tuple[GuardedProtocol, RecordingTransport]:
    server = Server([probe], limits=GrpcConfig(handshake_timeout_ms=0))
    protocol = server._protocol_factory()
    assert isinstance(protocol, GuardedProtocol)
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


def _client() -> h2.connection.H2Connection:
    client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    client.initiate_connection()
    return client


def _requests(count: int, client: h2.connection.H2Connection | None = None) -> bytes:
    """`count` slow calls as one read (a new client's: its preface and SETTINGS first)."""
    client = client or _client()
    for _ in range(count):
        stream_id = client.get_next_available_stream_id()
        client.send_headers(stream_id, grpc_headers(SLOW_PATH), end_stream=False)
        client.send_data(stream_id, HEALTH_REQUEST, end_stream=True)
    return client.data_to_send()


def test_one_read_of_many_calls_starts_a_few_handlers_per_turn() -> None:
    """grpclib alone started a handler for every call of the read before anything else ran."""

    async def scenario() -> None:
        probe = Probe(delay=30.0)
        protocol, transport = _connected(probe)
        protocol.data_received(_requests(100))
        assert len(protocol.processor.streams) <= STREAMS_PER_TURN
        assert transport.paused
        started = [probe.started]
        for _ in range(60):
            await asyncio.sleep(0)
            started.append(probe.started)
        steps = [after - before for before, after in itertools.pairwise(started)]
        assert max(steps) <= STREAMS_PER_TURN, steps
        assert probe.started == 100
        assert not transport.paused and transport.pauses == transport.resumes == 1
        protocol.connection_lost(None)
        for _ in range(40):
            await asyncio.sleep(0)

    run(scenario)


class TallyBytes(bytes):
    """A read that counts the bytes sliced out of it: what feeding it in turns copies."""

    sliced = 0

    def __getitem__(self, key: Any) -> Any:
        part = super().__getitem__(key)
        if isinstance(key, slice):
            TallyBytes.sliced += len(part)
            return TallyBytes(part)  # a copy of a copy is counted too
        return part


def test_a_large_read_of_small_frames_is_fed_in_turns_without_copying_its_rest() -> None:
    """Each turn kept what was left of the read as a new copy (`data[cut:]`): a 256 KiB read
    of empty frames is about 450 turns, 58 MB copied and 39 ms of the loop (review of the
    cutter). Now the read stays whole and each turn takes its share by offset."""

    async def scenario() -> None:
        protocol, transport = _connected(Probe(delay=30.0))
        client = _client()
        client.ping(b"12345678")
        handshake = client.data_to_send()
        empty_frames = b"".join(  # PING ACKs: 17 bytes each, no stream, nothing answered
            len(b"12345678").to_bytes(3, "big")
            + bytes([0x6, 0x1])
            + (0).to_bytes(4, "big")
            + b"12345678"
            for _ in range(16_000)
        )
        read = TallyBytes(handshake + empty_frames)
        TallyBytes.sliced = 0
        protocol.data_received(read)
        for _ in range(400):
            if not transport.paused:
                break
            await asyncio.sleep(0)
        assert not transport.paused and transport.pauses == 1
        assert protocol.closed_reason is None
        assert TallyBytes.sliced <= 2 * len(read), (TallyBytes.sliced, len(read))
        protocol.connection_lost(None)

    run(scenario)


def test_a_dropped_connection_logs_its_cut_calls_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every handler of a lost connection is cancelled at once (grpclib's), and each used to
    log a line as it ended: 500 lines, two thirds of the 75 ms their unwinding held every
    other client off. The connection says it once, with the count."""

    async def scenario() -> None:
        probe = Probe(delay=30.0)
        protocol, _ = _connected(probe)
        protocol.data_received(_requests(100))
        for _ in range(60):
            await asyncio.sleep(0)
        assert probe.started == 100
        tasks = list(protocol.handler._tasks.values())
        protocol.connection_lost(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert all(t.done() for t in tasks)
        assert probe.finished == 100

    with caplog.at_level(logging.INFO, logger="danube.runtime"):
        run(scenario)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "event=stream_closed" in m]
    cut = [m for m in messages if "event=grpc_streams_cut" in m]
    assert len(cut) == 1 and "count=100 rpcs=/danube.HealthCheck/Slow:100 " in cut[0], cut


def test_a_call_cancelled_on_an_open_connection_is_still_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that resets one call (its connection stays open): that call's line stays."""

    async def scenario() -> None:
        probe = Probe(delay=30.0)
        protocol, _ = _connected(probe)
        client = _client()
        protocol.data_received(_requests(1, client))
        for _ in range(10):
            await asyncio.sleep(0)
        assert probe.started == 1
        client.reset_stream(1)
        protocol.data_received(client.data_to_send())
        for _ in range(10):
            await asyncio.sleep(0)
        assert probe.finished == 1
        assert not protocol.handler.paths  # nothing kept of a call that ended
        protocol.connection_lost(None)

    with caplog.at_level(logging.INFO, logger="danube.runtime"):
        run(scenario)
    assert len([r for r in caplog.records if "event=stream_closed" in r.getMessage()]) == 1


def test_a_connection_shut_with_a_read_unfed_reads_again_for_its_lingering_close() -> None:
    """A connection error further on in a read (here a DATA frame on stream 0) closes the
    connection lingering: GOAWAY, write side shut, and what the peer still sends is read and
    dropped until its FIN. Reading paused for the unfed rest of the read stayed paused, so
    the FIN was never seen (review finding)."""

    async def scenario() -> None:
        probe = Probe(delay=30.0)
        protocol, transport = _connected(probe)
        data = _requests(5 * STREAMS_PER_TURN)
        data += (1).to_bytes(3, "big") + bytes([0x0, 0]) + (0).to_bytes(4, "big") + b"x"
        protocol.data_received(data)
        assert transport.paused
        for _ in range(20):
            await asyncio.sleep(0)
        assert protocol.closed_reason == "protocol_error"
        assert transport.eof
        assert not transport.paused
        protocol.data_received(b"anything the peer still sends")  # dropped, no error
        protocol.connection_lost(None)

    run(scenario)
