"""`max_publish_rate` pacing: how long a topic's publishes are held so it takes at most its
rate after a burst of one second's worth. A GCRA: the debt is a clock running ahead of now.
Holding the reply slows a producer down without an error, as Pulsar throttles (Danube only
warns); waiting longer than `MAX_PUBLISH_WAIT_MS` is refused instead."""

from __future__ import annotations

from dataclasses import dataclass

from danube.values.errors import DanubeError, ErrorCode

PUBLISH_BURST_US = 1_000_000
"""`max_publish_rate` lets a topic take one second's worth of messages at once."""
MAX_PUBLISH_WAIT_MS = 10_000
"""Past this much waiting at the publish rate, a publish is refused rather than held."""


@dataclass(slots=True)
class PaceClock:
    """One topic's pacing state."""

    clock_us: int = 0
    """When the messages admitted so far would all have been taken at the rate (a GCRA's
    theoretical arrival time), in microseconds."""
    rate: int = 0
    """The rate `clock_us` was reckoned at."""


def pace(clock: PaceClock, topic: str, rate: int, count: int, now_ms: int) -> int:
    """Admits `count` messages at `rate` a second and returns how long (ms) to hold them;
    raises RESOURCE_EXHAUSTED when the producer has sent faster than the rate for too long."""
    now_us = now_ms * 1000
    if clock.rate != rate:
        # the messages owed were counted at the old rate: owe them at the new one
        owed_us = max(0, clock.clock_us - now_us)
        old = clock.rate or rate
        clock.clock_us = now_us + owed_us * old // rate
        clock.rate = rate
    start = max(clock.clock_us, now_us)
    behind_us = start - PUBLISH_BURST_US - now_us
    if behind_us > MAX_PUBLISH_WAIT_MS * 1000:
        raise DanubeError(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"{topic} takes at most {rate} messages a second (max_publish_rate) and its "
            f"publishes are {behind_us // 1000} ms behind; slow down and retry",
        )
    clock.clock_us = start + -(-count * 1_000_000 // rate)
    # held until the last of them is within the rate: a batch waits for its own size,
    # for at most MAX_PUBLISH_WAIT_MS (a larger one leaves the rest owed by later ones)
    wait_us = clock.clock_us - PUBLISH_BURST_US - now_us
    return min(MAX_PUBLISH_WAIT_MS, max(0, -(-wait_us // 1000)))
