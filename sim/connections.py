"""The broker's connection gate under the simulator's `connection_flood` fault (spec/memory.md,
"Connections"; invariant 18).

The review's attack: sockets opened and left idle, never making a call, charged to the state
share until it is full. The fault opens a burst of such connections against the broker
incarnation's gate (`danube.machines.memory.connections.ConnectionGate`, the very machine the
runtime's HTTP/2 guard asks), then one client's new connection that makes its call at once.
The idle connections the gate keeps are reported with the open streams' clients
(`SimBroker._transport_open`), so the state pool charges them as the runtime's counts do.
The simulated clients' own connections are not gated: they are modelled by their streams.

Checked after each burst and each tick: the gate's open and pending connections within its
caps, no pending connection kept past its first-call deadline (and a tick), and the client
that calls at once admitted whenever the cap is not full of proven connections (idle
sockets must not keep it out)."""

from __future__ import annotations

import random
from collections.abc import Callable

from danube.machines.memory.connections import ConnectionGate, ConnectionLimits

SIM_LIMITS = ConnectionLimits(max_connections=12, max_pending=4, first_call_timeout_s=2.0)
"""Scaled down: a burst of 5 to 12 idle connections fills the pending places."""
BURST = (5, 12)
US_PER_S = 1_000_000
SLACK_S = 0.1
"""A first-call timer fires at its deadline; the check runs at the next tick at the latest."""


class SimConnections:
    """One broker incarnation's gate and its idle connections."""

    def __init__(self, limits: ConnectionLimits = SIM_LIMITS) -> None:
        self.gate = ConnectionGate(limits)
        self.caller_refused = 0
        """Clients that call at once, refused while the cap was not full of proven ones."""

    def flood(
        self, rng: random.Random, now_us: int, at: Callable[[int, Callable[[], None]], None]
    ) -> int:
        """Opens a burst of idle connections (each timed out by `at`), then a client's
        connection that makes its first call and leaves; returns the burst's size."""
        gate = self.gate
        now = now_us / US_PER_S
        count = rng.randint(*BURST)
        for _ in range(count):
            connection = gate.admit(now).connection
            if connection is not None:
                self._watch(connection, now, at)
        proven_before = gate.open - gate.pending
        caller = gate.admit(now).connection
        if caller is None:
            if proven_before < gate.limits.max_connections:
                self.caller_refused += 1
        else:
            gate.proven(caller)
            gate.closed(caller)
        return count

    def _watch(
        self, connection: int, now: float, at: Callable[[int, Callable[[], None]], None]
    ) -> None:
        deadline = self.gate.first_call_deadline(connection)
        if deadline is not None:
            delay_us = max(0, round((deadline - now) * US_PER_S))
            at(delay_us, lambda: self.expire(connection, deadline))

    def expire(self, connection: int, now: float) -> None:
        """The runtime's first-call timer: the gate decides whether it closes."""
        self.gate.expired(connection, now)

    def problems(self, now_us: int) -> list[str]:
        """What invariant 18 finds wrong with the gate now (module docstring)."""
        gate, limits = self.gate, self.gate.limits
        found = []
        if gate.open > limits.max_connections or gate.pending > limits.max_pending:
            found.append(
                f"the connection gate holds {gate.open} connections ({gate.pending} pending) "
                f"over its caps {limits.max_connections} ({limits.max_pending})"
            )
        now = now_us / US_PER_S
        late = sum(
            1
            for connection in list(gate._pending)
            if (deadline := gate.first_call_deadline(connection)) is not None
            and now > deadline + SLACK_S
        )
        if late:
            found.append(f"{late} idle connections kept past their first-call deadline")
        if self.caller_refused:
            found.append(
                f"{self.caller_refused} clients that call at once refused while idle "
                "connections held places"
            )
            self.caller_refused = 0
        return found
