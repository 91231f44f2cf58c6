"""The decisions that bound what one HTTP/2 connection may cost the broker, as pure state
machines: each takes `now` (seconds, monotonic) and an input and says what to do. The glue that
feeds them real frames and timers is `danube.runtime.h2_guard` (spec/hardening.md, HTTP/2)."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable

STREAM_WINDOW_BYTES = 1 << 20
"""The receive window the broker grants each stream (SETTINGS_INITIAL_WINDOW_SIZE): what a
client may send on one stream before the broker's handler reads it. A producer's
`PublishBatches` is not read while its batch waits for room in the publish pool or for its
topic's rate (spec/memory.md, "Back-pressure"): this is what such a stream holds unread."""

CONNECTION_WINDOW_BYTES = 16 << 20
"""The receive window of a whole connection, sixteen streams' worth. The stream window must
be well below it: with both at grpclib's 4 MiB one paused stream took the whole connection
window and every other call on the connection (other producers, `AckBatch`, a health check)
stalled until the stream was read again, up to 30 s (review finding, issue 28). Now fifteen
streams may be paused at once and other calls still flow. The bound it sets: whatever a
client does with its `max_concurrent_streams` streams, the broker buffers at most this much
unread request data per connection (spec/hardening.md)."""

HEADER_ENTRY_OVERHEAD = 32
"""RFC 7541 §4.1: each header field counts its name, its value and 32 bytes."""


def header_list_size(headers: Iterable[tuple[str | bytes, str | bytes]]) -> int:
    """The size SETTINGS_MAX_HEADER_LIST_SIZE limits (RFC 9113 §6.5.2)."""
    return sum(len(name) + len(value) + HEADER_ENTRY_OVERHEAD for name, value in headers)


class ResetBudget:
    """Client RST_STREAMs allowed per sliding window (the CVE-2023-44487 "rapid reset" fix of
    grpc-go, nginx, Netty: a client that opens and resets streams at once never meets the
    concurrent-stream limit, so the resets themselves are what is counted). `limit` 0: off."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._times: deque[float] = deque()

    def reset(self, now: float) -> bool:
        """Counts one reset; True when the connection has now spent more than its budget."""
        if self.limit <= 0:
            return False
        times = self._times
        times.append(now)
        while times and times[0] <= now - self.window:
            times.popleft()
        return len(times) > self.limit


PING_JITTER = 0.9
"""A client ping counts as early only below this share of the minimum interval: a client
that pings exactly every `min_interval` (a Rust client's `keep_alive_interval` of 10 s, say)
must not collect strikes from timer jitter."""


class PingStrikes:
    """grpc's server-side ping policing ("too_many_pings"): a client PING that comes sooner than
    `min_interval` after the previous one is a strike, unless the broker sent data or headers
    in between (a client may ping when traffic flows, e.g. for BDP estimation); more than
    `max_strikes` strikes and the connection is closed."""

    def __init__(self, min_interval: float, max_strikes: int = 2) -> None:
        self.min_interval = min_interval
        self.max_strikes = max_strikes
        self.strikes = 0
        self._last: float | None = None
        self._sent_since = False

    def sent(self) -> None:
        """The broker sent data or headers: the count starts afresh at the next ping."""
        self._sent_since = True

    def ping(self, now: float) -> bool:
        """Counts a client PING; True when it is one strike too many."""
        if self._sent_since:
            self._sent_since = False
            self.strikes = 0
            self._last = None
        if self._last is not None and now - self._last < self.min_interval * PING_JITTER:
            self.strikes += 1
        self._last = now
        return self.strikes > self.max_strikes


class KeepaliveAction(enum.Enum):
    NOTHING = "nothing"
    PING = "ping"
    CLOSE = "close"


class Keepalive:
    """Detects a peer that is connected but frozen (SIGSTOP, a hung VM): the kernel keeps its
    TCP connection alive, only the application can tell. A connection with open streams that
    has been silent for `interval` gets a PING; anything received (the ack or any other frame)
    proves the peer alive; nothing within `timeout` closes the connection. Idle connections
    (no streams) are not pinged, as in grpc (`permit_without_calls` off)."""

    def __init__(self, interval: float, timeout: float, now: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self._last_read = now
        self._ping_sent: float | None = None

    def received(self, now: float) -> None:
        """The peer sent something (an ack of our ping included)."""
        self._last_read = now
        self._ping_sent = None

    def tick(self, now: float, busy: bool) -> KeepaliveAction:
        """What to do at `now`; `busy`: the connection has open streams."""
        if self._ping_sent is not None:
            if now - self._ping_sent >= self.timeout:
                return KeepaliveAction.CLOSE
            return KeepaliveAction.NOTHING
        if busy and now - self._last_read >= self.interval:
            self._ping_sent = now
            return KeepaliveAction.PING
        return KeepaliveAction.NOTHING

    def next_tick(self, now: float) -> float:
        """Seconds until `tick` may decide something new (never less than a millisecond)."""
        if self._ping_sent is not None:
            due = self._ping_sent + self.timeout
        else:
            due = self._last_read + self.interval
            if due <= now:  # silent but idle: look again an interval later
                due = now + self.interval
        return max(due - now, 0.001)


PREFACE_BYTES = 24
"""The client's connection preface (RFC 9113 §3.4): `PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n`."""

FRAME_HEADER_BYTES = 9
"""Length (24 bits), type, flags, stream id (RFC 9113 §4.1)."""

FRAMES_PER_TURN = 64
"""Whole frames one connection may hand h2 and grpclib in one turn of the loop; the rest of
the read is fed after the loop's other work, the socket's reading paused meanwhile."""

STREAMS_PER_TURN = 8
"""Of those, HEADERS frames (a new call each: parsing, a handler task and its first steps).
grpclib fed a whole read at once: 550 HEADERS in one read queued 500 handler tasks ahead of
every other client's next step, and a HealthCheck, which takes several steps, waited behind
them all, 100-150 ms (the hostile suite's limit is 100 ms; 1 run in 4 failed). A call costs
up to about 0.4 ms (h2's count of open streams, a token to check), so a turn adds about 3 ms
per flooding connection (spec/hardening.md, HTTP/2)."""

HEADERS_FRAME = 0x1


class FrameCutter:
    """Where to cut one connection's incoming bytes so that a turn of the loop feeds at most
    so many whole frames and new streams: it follows the frame boundaries (preface, then
    9-byte headers and their payloads) across reads, reading only each frame's length and
    type. What it is handed past the cut is its caller's to hand back later, in order."""

    __slots__ = ("_header", "_headers_frame", "_in_frame", "_skip")

    def __init__(self, preface: int = PREFACE_BYTES) -> None:
        self._skip = preface
        """Bytes still to come of the preface or of the current frame's payload."""
        self._in_frame = False
        """Whether `_skip` counts a frame's payload (its end ends a frame)."""
        self._headers_frame = False
        """Whether the frame whose payload `_skip` counts is a HEADERS frame: one that ends
        in this share counts against it, wherever its header was read."""
        self._header = b""
        """The part of a frame header read so far."""

    def cut(
        self,
        data: bytes,
        frames: int = FRAMES_PER_TURN,
        streams: int = STREAMS_PER_TURN,
        *,
        begin: int = 0,
    ) -> int:
        """The offset in `data` where this turn's share, starting at `begin`, ends: just
        after the frame that completes `frames` frames, or just before the HEADERS frame past
        `streams` of them (so a call's DATA or RST_STREAM stays in the share of its HEADERS);
        `len(data)` when neither comes in it. The state moves to that offset. `begin` lets
        the caller keep one read and hand back the rest of it by offset, turn after turn,
        instead of copying what is left of it each turn."""
        end = len(data)
        pos = begin
        if self._in_frame and self._headers_frame:
            streams -= 1
        while pos < end:
            if self._skip:
                taken = min(self._skip, end - pos)
                self._skip -= taken
                pos += taken
                if self._skip or not self._in_frame:
                    continue
            else:
                start = -1 if self._header else pos
                needed = FRAME_HEADER_BYTES - len(self._header)
                self._header += data[pos : pos + needed]
                pos = min(pos + needed, end)
                if len(self._header) < FRAME_HEADER_BYTES:
                    continue
                header, self._header = self._header, b""
                self._headers_frame = header[3] == HEADERS_FRAME
                if self._headers_frame:
                    if streams <= 0 and start > begin:
                        return start  # unread: the next share starts with this header
                    streams -= 1
                self._skip = int.from_bytes(header[:3], "big")
                self._in_frame = True
                if self._skip:
                    continue
            self._in_frame = False
            frames -= 1
            if frames <= 0:
                return pos
        return end
