"""The connection gate's rules (`danube.machines.memory.connections`, spec/memory.md
"Connections"): the cap derived from the budget, pending connections evicted oldest first
for newcomers, the first-call deadline, refusals logged once per interval."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.memory.connections import (
    LOG_INTERVAL_S,
    MIN_CONNECTIONS,
    ConnectionGate,
    ConnectionLimits,
    Refusal,
    admin_connection_limits,
    connection_limits,
    default_max_connections,
)
from danube.machines.memory.state import CONNECTION_BYTES
from danube.values.sizes import MIB


def test_the_default_cap_keeps_connections_to_half_the_state_share() -> None:
    # 256 MiB: cache pool 128, state share 96, connections half of it at 40 KiB each
    assert default_max_connections(256 * MIB) == 1_228
    assert default_max_connections(256 * MIB) * CONNECTION_BYTES <= 48 * MIB
    # the review's 1,640 idle connections, which filled the state share, are refused
    assert default_max_connections(256 * MIB) < 1_640
    assert default_max_connections(16 * MIB) == 76
    assert default_max_connections(16 * MIB, connection_bytes=MIB) == MIN_CONNECTIONS
    limits = connection_limits(256 * MIB, 0, 0, 30_000)
    assert limits == ConnectionLimits(1_228, 153, 30.0)
    assert connection_limits(256 * MIB, 10, 50, 0) == ConnectionLimits(10, 10, 0.0)


def test_the_admin_port_has_a_cap_of_its_own_with_room_for_bursts_of_asks() -> None:
    client = connection_limits(256 * MIB, 0, 0, 30_000)
    # a quarter of the client port's cap, half of it may be pending: a follower's burst of
    # epoch questions after a failover is not evicted 16 at a time (review finding)
    assert admin_connection_limits(client, 0, 30_000) == ConnectionLimits(307, 153, 30.0)
    small = connection_limits(16 * MIB, 0, 0, 30_000)
    assert admin_connection_limits(small, 0, 0) == ConnectionLimits(MIN_CONNECTIONS, 32, 0.0)
    assert admin_connection_limits(client, 1_000, 0).max_connections == 1_000
    gate = ConnectionGate(admin_connection_limits(client, 0, 30_000))
    burst = [gate.admit(0.0) for _ in range(100)]
    assert all(a.connection is not None and a.evicted is None for a in burst)


def test_a_full_gate_of_proven_connections_refuses_newcomers() -> None:
    gate = ConnectionGate(ConnectionLimits(2, 2, 0))
    first, second = gate.admit(0.0), gate.admit(0.0)
    assert first.connection is not None and second.connection is not None
    gate.proven(first.connection)
    gate.proven(second.connection)
    refused = gate.admit(1.0)
    assert refused.connection is None and refused.refusal is Refusal.FULL
    assert gate.open == 2 and gate.refused[Refusal.FULL] == 1
    gate.closed(first.connection)
    assert gate.admit(2.0).connection is not None


def test_a_newcomer_evicts_the_oldest_pending_connection() -> None:
    gate = ConnectionGate(ConnectionLimits(10, 2, 0))
    idle = [gate.admit(float(t)).connection for t in range(2)]
    newcomer = gate.admit(5.0)
    assert newcomer.connection is not None and newcomer.evicted == idle[0]
    assert gate.pending == 2 and gate.open == 2
    assert not gate.is_pending(idle[0])  # type: ignore[arg-type]
    gate.closed(idle[0])  # type: ignore[arg-type]  # the runtime's close of it: ignored
    assert gate.open == 2
    gate.proven(newcomer.connection)
    assert gate.pending == 1 and gate.open == 2
    assert gate.refused[Refusal.EVICTED] == 1


def test_the_cap_reached_with_pending_connections_evicts_rather_than_refuses() -> None:
    gate = ConnectionGate(ConnectionLimits(2, 2, 0))
    proven = gate.admit(0.0).connection
    assert proven is not None
    gate.proven(proven)
    pending = gate.admit(0.0).connection
    newcomer = gate.admit(1.0)
    assert newcomer.evicted == pending and newcomer.connection is not None
    assert gate.open == 2


def test_a_connection_without_a_first_call_expires_and_a_proven_one_does_not() -> None:
    gate = ConnectionGate(ConnectionLimits(10, 5, 30.0))
    idle = gate.admit(0.0).connection
    busy = gate.admit(0.0).connection
    assert idle is not None and busy is not None
    assert gate.first_call_deadline(idle) == 30.0
    gate.proven(busy)
    assert gate.first_call_deadline(busy) is None
    assert not gate.expired(idle, 29.9)
    assert gate.expired(idle, 30.0)
    assert not gate.expired(busy, 100.0)
    assert gate.open == 1 and gate.pending == 0
    assert gate.refused[Refusal.FIRST_CALL_TIMEOUT] == 1
    no_deadline = ConnectionGate(ConnectionLimits(10, 5, 0.0))
    kept = no_deadline.admit(0.0).connection
    assert kept is not None and not no_deadline.expired(kept, 1e9)


def test_refusals_are_logged_once_per_interval_with_their_count() -> None:
    gate = ConnectionGate(ConnectionLimits(1, 1, 0))
    only = gate.admit(0.0).connection
    assert only is not None
    gate.proven(only)
    assert gate.log_due(0.0) == 0
    gate.admit(0.0)
    assert gate.log_due(0.0) == 1
    for _ in range(100):
        gate.admit(1.0)
        assert gate.log_due(1.0) == 0
    assert gate.log_due(LOG_INTERVAL_S + 0.5) == 100
    assert gate.log_due(LOG_INTERVAL_S * 3) == 0


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.lists(st.tuples(st.sampled_from("aptc"), st.integers(0, 20)), max_size=60),
)
def test_the_gate_never_counts_past_its_caps(cap: int, pending_cap: int, ops: list) -> None:
    """Under any order of accepts, first calls, deadlines and closes (some of connections the
    gate already closed), open and pending connections stay within their caps and the
    counts are those of the connections the gate admitted and did not close."""
    gate = ConnectionGate(connection_limits(16 * MIB, cap, pending_cap, 2_000))
    alive: dict[int, bool] = {}  # id -> pending, as the runtime would see it
    now = 0.0
    for op, pick in ops:
        now += 0.5
        known = sorted(alive)
        chosen = known[pick % len(known)] if known else None
        if op == "a":
            admission = gate.admit(now)
            if admission.evicted is not None:
                assert alive.pop(admission.evicted)  # only a pending one is evicted
            if admission.connection is not None:
                alive[admission.connection] = True
        elif op == "p" and chosen is not None:
            gate.proven(chosen)
            alive[chosen] = False
        elif op == "t" and chosen is not None:
            if gate.expired(chosen, now):
                assert alive.pop(chosen)
        elif op == "c" and chosen is not None:
            gate.closed(chosen)
            del alive[chosen]
        assert gate.open <= gate.limits.max_connections
        assert gate.pending <= gate.limits.max_pending
        assert gate.open == len(alive)
        assert gate.pending == sum(alive.values())
