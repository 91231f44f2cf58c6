"""A reliable subscription's failure policy (Danube's `SubscriptionFailurePolicy`, defaults
included): how long a consumer has to acknowledge, when a failed message goes out again, how
many deliveries a message gets, and what becomes of one that used them all.

A message is charged only for its own failures (a nack, an ack timeout): resends caused by a
disconnect, a takeover or an Exclusive rewind are free, so a message is never exhausted by
another's failure. Past `max_redelivery_count` failures (after `max_redelivery_count + 1`
deliveries, as in Danube) the message is *exhausted* and the poison policy decides:

- `DROP`: the message is skipped and counted; the cursor moves over it.
- `BLOCK`: the message stays in the window. Exclusive, Failover and Shared send no message that
  was never sent while a blocked one is in the window (messages already out are still
  retried); Key-Shared holds only the message's key. An operator's `release` sends it again
  with its attempts reset, `skip` drops it (Danube has neither).
- `DEAD_LETTER`: the machine asks the driver to republish the message (`DeadLetter`) and keeps
  it until the driver reports it stored; only then does the cursor pass it.

`max_redelivery_count` has Danube's meaning on the wire: 0 is "no redelivery" (one delivery,
then the poison policy). `NO_LIMIT` (u32's maximum, the largest value the wire carries, which
Danube never reaches either) is "redeliver for ever": the default of a subscription nobody set
a policy for, where Danube's is 5 with Block (spec/failure-policies.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

NO_LIMIT = (1 << 32) - 1
"""`max_redelivery_count` that never exhausts a message: u32's maximum, which a Danube broker
reads the same way (`attempt > u32::MAX` is never true)."""


class Backoff(enum.Enum):
    FIXED = "fixed"
    EXPONENTIAL = "exponential"


class Poison(enum.Enum):
    """What happens to a message past its redelivery limit."""

    DROP = "drop"
    BLOCK = "block"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """When a failed message goes out again, and how often (Danube's per-subscription
    policy)."""

    ack_timeout_ms: int = 30_000
    base_redelivery_delay_ms: int = 1_000
    max_redelivery_delay_ms: int = 60_000
    backoff: Backoff = Backoff.EXPONENTIAL
    max_redelivery_count: int = NO_LIMIT
    """Failures a message may have and still be redelivered: 0, none (Danube's meaning);
    `NO_LIMIT`, for ever."""
    poison: Poison = Poison.BLOCK
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if self.ack_timeout_ms < 1:
            raise ValueError(f"ack_timeout_ms must be at least 1, not {self.ack_timeout_ms}")
        if self.base_redelivery_delay_ms < 0 or self.max_redelivery_delay_ms < 0:
            raise ValueError("redelivery delays cannot be negative")
        if self.max_redelivery_count < 0:
            raise ValueError("max_redelivery_count cannot be negative")
        if self.poison is Poison.DEAD_LETTER and not self.dead_letter_topic:
            raise ValueError("the dead-letter poison policy needs a dead_letter_topic")

    def exhausted(self, failures: int) -> bool:
        """A message with `failures` failures gets no further delivery: with a limit of N it
        was delivered N + 1 times."""
        return failures > self.max_redelivery_count

    def redelivery_delay_ms(self, failures: int, requested_ms: int | None) -> int:
        """Delay after the message's `failures`-th failure (1 for the first): the policy's
        (`base`, or `base * 2**(failures - 1)`) or the nack's own if longer, capped at
        `max_redelivery_delay_ms`. A nack cannot make a poison message spin."""
        delay = self.base_redelivery_delay_ms
        if self.backoff is Backoff.EXPONENTIAL:
            # past 2**62 the cap has long won; the bound keeps the integer small
            delay <<= min(failures - 1, 62)
        return min(self.max_redelivery_delay_ms, max(delay, requested_ms or 0))


DEFAULT_POLICY = FailurePolicy()


# -- effects the policies add -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dropped:
    """The message is skipped by policy (Drop, or an operator's `skip`): it counts as
    acknowledged for the cursor; the driver lets its record go and counts it."""

    offset: int
    attempts: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Republish the message to the policy's dead-letter topic, then report `dead_lettered`
    (stored) or `dead_letter_failed`. Until it is stored the message stays in the window."""

    offset: int
    attempts: int
    reason: str
    topic: str


class EntryState(enum.Enum):
    """Danube's per-message states, plus the ones exhaustion leads to."""

    READY_TO_SEND = "ready_to_send"
    AWAITING_ACK = "awaiting_ack"
    WAITING_TO_RETRY = "waiting_to_retry"
    BLOCKED = "blocked"
    """Exhausted under Block: waits for an operator (or a policy change)."""
    DEAD_LETTERING = "dead_lettering"
    """Exhausted under DeadLetter: its republish is asked for and not yet stored."""
