"""The broker-wide connection gate (spec/memory.md, "Connections"; spec/hardening.md).

Every client connection costs the broker `CONNECTION_BYTES` (40 KiB) of state whether or not
it ever makes a call, and the state pool charges it (`StatePool.transport`) but never refuses
it. A review found that about 1,640 idle connections that never authenticated filled a
256 MiB budget's state share, after which every topic, subscription and consumer creation was
refused: anyone able to open sockets could deny service without a single call. So:

- **A cap on the client port** (`broker.grpc.max_connections`, `--max-connections`): connections
  beyond it are refused as they arrive. Its default is derived from the budget: connections
  may take at most `CONNECTION_SHARE` of the state share at `CONNECTION_BYTES` each (1,228
  under a 256 MiB budget), never fewer than `MIN_CONNECTIONS`.
- **A cap on connections not yet proven** (`broker.grpc.max_pending_connections`): a
  connection is *pending* from its accept until its first call is admitted (past
  authentication when the port authenticates); at most this many may be pending at once
  (default an eighth of the cap, at least `MIN_PENDING`). A newcomer that finds the pending
  connections at their cap, or the cap reached while some are pending, is admitted and the
  oldest pending connection is closed for it (`Refusal.EVICTED`): a real client makes its
  first call within a round trip of its accept, so idle or unauthenticated sockets cannot
  keep new clients out by holding the pending places (refusing the newcomer instead would
  let a few hundred idle sockets, renewed every timeout, lock every new client out).
- **A deadline for the first call** (`broker.grpc.first_call_timeout_ms`): a connection still
  pending after it is closed.
- **The admin port has a gate of its own** (`admin_connection_limits`,
  `broker.grpc.max_admin_connections`): with one gate for both ports, a flood of client
  connections at the cap refused the operator's `danube-admin` and the other brokers'
  replication links too, just when they were needed.
- **Refusals are logged at most once per `LOG_INTERVAL_S`**, with how many were refused since
  the previous line (a flood must not flood the log), and counted for the metric.

Pure: the runtime (`danube.runtime.h2_guard`) tells it when connections open, are proven and
close, asks it what to do, and carries the answer out (a GOAWAY and a close, never a
traceback). Time is handed in (seconds, monotonic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from danube.machines.memory.budget import split
from danube.machines.memory.state import CONNECTION_BYTES, STATE_SHARE

CONNECTION_SHARE = 0.5
"""Of the state share, what open connections may take by default: the other half stays for
topics, subscriptions, consumers and their streams."""
MIN_CONNECTIONS = 64
"""The default cap is never below this, however small the budget."""
PENDING_FRACTION = 8
"""By default an eighth of the cap may be pending (not yet proven) at once."""
MIN_PENDING = 16
ADMIN_FRACTION = 4
"""By default the admin port may keep a quarter of the client port's cap open: operators' tools
and the other brokers (a replication link per owner of a replicated topic, an epoch question
per replica after a failover, forwarded admin calls), never the thousands clients open."""
LOG_INTERVAL_S = 10.0
"""At most one refusal line per this many seconds (`ConnectionGate.log_due`)."""


class Refusal(Enum):
    """Why a connection is refused or closed (the GOAWAY's debug data and the log's reason)."""

    FULL = "too_many_connections"
    """Refused as it arrived: the cap is reached and every open connection is proven."""
    EVICTED = "too_many_pending_connections"
    """Closed while pending, the oldest, to admit a newcomer."""
    FIRST_CALL_TIMEOUT = "first_call_timeout"
    """Closed while pending, its first-call deadline passed."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The gate's bounds, resolved from the configuration and the budget."""

    max_connections: int
    max_pending: int
    first_call_timeout_s: float
    """0: no deadline for the first call."""


def default_max_connections(budget: int, connection_bytes: int = CONNECTION_BYTES) -> int:
    """`CONNECTION_SHARE` of the state share of `budget`, at `connection_bytes` each."""
    state_share = int(split(budget).cache * STATE_SHARE)
    return max(MIN_CONNECTIONS, int(state_share * CONNECTION_SHARE) // connection_bytes)


def connection_limits(
    budget: int, max_connections: int, max_pending: int, first_call_timeout_ms: int
) -> ConnectionLimits:
    """The configured bounds (`broker.grpc`), each 0 meaning its default: the cap derived
    from `budget`, the pending cap an eighth of the cap. The pending cap never exceeds the
    cap."""
    cap = max_connections or default_max_connections(budget)
    pending = max_pending or max(MIN_PENDING, cap // PENDING_FRACTION)
    return ConnectionLimits(cap, min(pending, cap), first_call_timeout_ms / 1000)


def admin_connection_limits(
    client: ConnectionLimits, max_connections: int, first_call_timeout_ms: int
) -> ConnectionLimits:
    """The admin port's gate (`broker.grpc.max_admin_connections`; 0: a quarter of the client
    port's cap, at least `MIN_CONNECTIONS`), half of them may be pending: after a failover a
    follower asks the new owner about every replica at once, each ask on a connection of its
    own, and a small pending cap closed most of them (review finding: 16 of a burst of 100
    survived). The same first-call deadline as the client port's."""
    cap = max_connections or max(MIN_CONNECTIONS, client.max_connections // ADMIN_FRACTION)
    return ConnectionLimits(cap, max(MIN_PENDING, cap // 2), first_call_timeout_ms / 1000)


@dataclass(frozen=True, slots=True)
class Admission:
    """The gate's answer to a new connection."""

    connection: int | None
    """The id it is known by from now on, or None: refused (`refusal` says why)."""
    refusal: Refusal | None = None
    evicted: int | None = None
    """A pending connection to close now to make room for this one (already forgotten)."""


@dataclass(slots=True)
class ConnectionGate:
    """Knows the connections it admitted (pending, in the order they came, and proven) and
    decides on each new one. Ids are its own; the runtime maps them to its connections.

    A broker has one per gRPC port: the client port's cap comes from the budget, the admin
    port's is small and fixed, so neither port's connections can lock the other's out."""

    limits: ConnectionLimits
    refused: dict[Refusal, int] = field(default_factory=lambda: dict.fromkeys(Refusal, 0))
    """Connections refused or closed by the gate, by reason, since the start (the metric)."""
    _pending: dict[int, float] = field(default_factory=dict)
    """Pending connection -> when it was admitted, oldest first."""
    _proven: set[int] = field(default_factory=set)
    _next: int = 1
    _unlogged: int = 0
    _logged_at: float | None = None

    @property
    def open(self) -> int:
        """Admitted connections not yet closed."""
        return len(self._pending) + len(self._proven)

    @property
    def pending(self) -> int:
        """Of those, the ones whose first call was not admitted yet."""
        return len(self._pending)

    def admit(self, now: float) -> Admission:
        """A connection was accepted: admitted (pending), possibly closing the oldest pending
        one for it, or refused (counted; the runtime closes it, never counted as open)."""
        limits = self.limits
        evicted = None
        if self.open >= limits.max_connections or self.pending >= limits.max_pending:
            if not self._pending:
                return Admission(None, self._refuse(Refusal.FULL))
            evicted = next(iter(self._pending))
            del self._pending[evicted]
            self._refuse(Refusal.EVICTED)
        connection = self._next
        self._next += 1
        self._pending[connection] = now
        return Admission(connection, evicted=evicted)

    def proven(self, connection: int) -> None:
        """A pending connection had its first call admitted (else: nothing to do)."""
        if self._pending.pop(connection, None) is not None:
            self._proven.add(connection)

    def is_pending(self, connection: int) -> bool:
        return connection in self._pending

    def closed(self, connection: int) -> None:
        """A connection closed; one the gate already closed (evicted, expired) is ignored."""
        if self._pending.pop(connection, None) is None:
            self._proven.discard(connection)

    def first_call_deadline(self, connection: int) -> float | None:
        """When a pending connection must have made its first call, or None (no deadline,
        or not pending)."""
        timeout = self.limits.first_call_timeout_s
        opened_at = self._pending.get(connection)
        return opened_at + timeout if timeout > 0 and opened_at is not None else None

    def expired(self, connection: int, now: float) -> bool:
        """Whether a connection is to be closed now for want of a first call: then it is
        forgotten and counted."""
        deadline = self.first_call_deadline(connection)
        if deadline is None or now < deadline:
            return False
        del self._pending[connection]
        self._refuse(Refusal.FIRST_CALL_TIMEOUT)
        return True

    def log_due(self, now: float) -> int:
        """How many refusals to report in one line now (0: none, stay quiet): every refusal
        since the previous line, at most once per `LOG_INTERVAL_S`."""
        if self._unlogged == 0:
            return 0
        if self._logged_at is not None and now - self._logged_at < LOG_INTERVAL_S:
            return 0
        count, self._unlogged, self._logged_at = self._unlogged, 0, now
        return count

    def _refuse(self, reason: Refusal) -> Refusal:
        self.refused[reason] += 1
        self._unlogged += 1
        return reason
