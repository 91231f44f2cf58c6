"""Producers of clients that left (spec/memory.md, "Departed clients").

A client that creates a producer and goes away (a crash, a scale-down, a script run in a loop)
sends nothing to say so: there is no close RPC, and Danube's clients only stop their health
checks. Its producer would stay registered until its topic leaves the broker: its record, its
metadata and its name (creation is idempotent by name) kept for ever. Danube's clients send a
HealthCheck every 5 s per producer, so a producer that neither published nor was
health-checked for `producer_idle_ms` (`broker.producer_idle_timeout_ms`, default 10
minutes, far beyond a client paused by a long GC or a slow network) is gone, and is removed.
Not shorter by default: the official Python client's health loop ends for good after one
failed check (a broker restart, a network blip) or a CLOSE, so its producers are then seen
only when they publish, and a producer removed under a client that comes back costs the
client its retries, a lookup and a new producer (about 1.5-3 s by its retry settings)
before the publish goes through.

Cost on the publish path: one attribute write (`ProducerRecord.active = True`), no clock read.
The sweep, at most every `SWEEP_MS`, turns that flag into a time (`seen_ms`: the sweep's own
time, never earlier than the activity it saw) and removes those whose `seen_ms` is
`producer_idle_ms` old. So a producer is never removed less than `producer_idle_ms` after its
last publish or health check, and at most `SWEEP_MS` more than that after it.

Pure: `now_ms` in, the producers to remove out.
"""

from __future__ import annotations

from collections.abc import Iterable

from danube.machines.node.records import ProducerRecord

SHORT_IDLE_MS = 15_000
"""Shorter timeouts are warned of at start: Danube's clients health-check every 5 s."""
SWEEP_MS = 1_000
"""How often (at most) the producers are swept: a 10,000-producer sweep costs a few
milliseconds, so once a second is cheap, and it is small against any sensible timeout."""


class IdleSweep:
    """When the producers were last swept, and the sweep's decision."""

    __slots__ = ("idle_ms", "next_ms")

    def __init__(self, idle_ms: int) -> None:
        if idle_ms < 0:
            raise ValueError(f"producer_idle_ms must be 0 (never) or more, got {idle_ms}")
        self.idle_ms = idle_ms
        self.next_ms = 0

    def due(self, now_ms: int) -> bool:
        """Whether a sweep runs at this tick (never with `idle_ms` 0)."""
        period = min(SWEEP_MS, max(1, self.idle_ms // 4))
        if not self.idle_ms or self.next_ms - period <= now_ms < self.next_ms:
            return False  # (a clock set back before the last sweep sweeps at once)
        self.next_ms = now_ms + period
        return True

    def idle(self, producers: Iterable[ProducerRecord], now_ms: int) -> list[ProducerRecord]:
        """Stamps the producers active since the last sweep with `now_ms` and returns those
        idle for `idle_ms` or more. A producer not swept yet (just created or restored)
        counts as seen now. A clock set back does not expire anyone: `seen_ms` in the future
        is taken as now."""
        expired: list[ProducerRecord] = []
        limit = now_ms - self.idle_ms
        for producer in producers:
            if producer.active or producer.seen_ms < 0 or producer.seen_ms > now_ms:
                producer.active = False
                producer.seen_ms = now_ms
            elif producer.seen_ms <= limit:
                expired.append(producer)
        return expired


def expired_message(topic: str, producer_id: int, idle_ms: int) -> str:
    """What a publish of a removed producer is told (UNAVAILABLE: Danube's clients retry it,
    then look the topic up and create the producer again)."""
    return (
        f"producer {producer_id} of {topic} expired: it neither published nor was "
        f"health-checked for {idle_ms} ms (broker.producer_idle_timeout_ms); create the "
        "producer again"
    )


def unknown_message(topic: str, producer_id: int) -> str:
    """What a publish with an id this broker does not know, to a topic it serves, is told.
    UNAVAILABLE, not Danube's NOT_FOUND: here a producer may have expired for idleness and
    the broker restarted since (the record of why is not kept across a restart), and
    Danube's clients give NOT_FOUND to the application where they recover from UNAVAILABLE
    by creating the producer again (review finding; spec/memory.md, "Departed clients")."""
    return (
        f"producer {producer_id} of {topic} is not registered on this broker (it may have "
        "expired for idleness before a restart); create the producer again"
    )


def short_timeout_warning(idle_ms: int) -> str | None:
    """Why `broker.producer_idle_timeout_ms` is unsafe, or None (logged at start as
    `event=producer_idle_timeout_short`): under `SHORT_IDLE_MS`, producers idle between two of
    their clients' 5 s health checks may be removed."""
    if not 0 < idle_ms < SHORT_IDLE_MS:
        return None
    return (
        f"timeout_ms={idle_ms}: Danube's clients health-check every 5 s, so producers idle "
        f"between two checks may be removed; at least {SHORT_IDLE_MS} ms is advised"
    )
