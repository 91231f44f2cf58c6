"""`broker.grpc`: the HTTP/2 connection guard's bounds and the connection gate's limits
(spec/hardening.md, section HTTP/2; spec/memory.md, "Connections"). Kept apart from
`danube.values.config`, which is at its size limit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    """`broker.grpc`: bounds on what one HTTP/2 connection may cost the broker (both gRPC
    ports; spec/hardening.md, section HTTP/2). 0 turns a limit off where that makes sense."""

    keepalive_time_ms: int = 30_000
    """A connection with open streams is PINGed when it has been this long without a ping."""
    keepalive_timeout_ms: int = 20_000
    """... and closed when the PING's ack has not come within this (a frozen peer)."""
    min_client_ping_interval_ms: int = 10_000
    """Client PINGs closer than this, with no data or headers sent in between, are strikes;
    the third strike closes the connection (GOAWAY ENHANCE_YOUR_CALM, `too_many_pings`)."""
    max_concurrent_streams: int = 500
    """Advertised SETTINGS_MAX_CONCURRENT_STREAMS, also the cap on running handlers. Each
    stream a client opens at once costs the loop about 0.1 ms: at 1,000 a flood of streams
    stalled other clients for 48-117 ms (the hostile suite), at 500 for 20-36 ms. Clients
    beyond it wait for a free stream (grpc and grpclib do), so a client holding more
    consumers than this on one connection needs it raised."""
    max_header_list_bytes: int = 16 * 1024
    """Larger request headers (HPACK-decoded size) are refused with RESOURCE_EXHAUSTED."""
    max_stream_resets: int = 200
    """Client RST_STREAMs allowed per `stream_reset_window_ms`; more close the connection."""
    stream_reset_window_ms: int = 10_000
    handshake_timeout_ms: int = 10_000
    """A connection that has not sent the HTTP/2 preface and SETTINGS by then is closed (on a
    TLS port the TLS handshake gets as long again, before it)."""
    frame_timeout_ms: int = 10_000
    """... and one that leaves a frame or a header block incomplete this long (slowloris)."""
    max_connections: int = 0
    """Connections the broker keeps open at once on its client port; more are refused as they
    arrive (GOAWAY `too_many_connections`). 0: derived from the memory budget, half the state
    share at 40 KiB a connection (1,228 under 256 MiB; spec/memory.md "Connections"). The
    admin port has a gate of its own (`max_admin_connections`), so a client flood cannot lock
    operators or other brokers out."""
    max_pending_connections: int = 0
    """Of the client port's, how many may be pending at once: accepted, no call admitted yet (past
    authentication when the port authenticates); past it, a new connection is let in and
    the oldest pending one is closed (GOAWAY `too_many_pending_connections`), so idle
    sockets cannot lock real clients out. 0: an eighth of `max_connections`, at least 16."""
    max_admin_connections: int = 0
    """Connections kept open at once on the admin port, which operators' tools and the other
    brokers (replication links, epoch questions, forwarded admin calls) use; half of them may
    be pending. 0: a quarter of the client port's cap, at least 64 (307 under 256 MiB)."""
    first_call_timeout_ms: int = 30_000
    """A connection that has had no call admitted this long after its accept is closed
    (GOAWAY `first_call_timeout`). 0: no deadline."""
