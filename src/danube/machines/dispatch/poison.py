"""The poison-message part of `ReliableSubscription` (see `failure` for the rules): the
per-message state a limit needs, what exhaustion does under each policy, and the inputs that
resolve an exhausted message (an operator's `release` and `skip`, the driver's report of a
dead letter stored or failed). A mixin, not a machine of its own: it works on the
subscription's window, and lives apart only to keep each module one job and readable."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from danube.machines.dispatch.failure import DeadLetter, Dropped, EntryState, FailurePolicy, Poison
from danube.machines.dispatch.types import SubscriptionType

REPUBLISH_RETRY_FLOOR_MS = 100
"""A failed dead-letter republish is asked again no sooner than this, whatever the policy's
redelivery delay: under a zero delay, a republish that fails at once (its dead-letter topic
still loading, or refused) was asked again in the same call, failed again, for ever: the
broker's loop spun (found by the simulator, seed 257, once restarts loaded WALs lazily)."""

if TYPE_CHECKING:
    from collections import deque


@dataclass(slots=True)
class PoisonEntry:
    """A read, unacknowledged offset of a reliable subscription."""

    key: bytes
    failures: int = 0
    consumer: int | None = None
    """The consumer it is in flight to; None while it waits to be (re)sent."""
    token: int = 0
    """Names its latest send or failure, so stale deadline and retry timers are ignored."""
    held: EntryState | None = None
    """BLOCKED or DEAD_LETTERING once exhausted: it is sent to nobody until resolved."""
    reason: str = ""
    """Its latest failure: "nack" or "ack timeout"."""
    republish_failures: int = 0


class PoisonHandling:
    """Methods of `ReliableSubscription` about exhausted messages; the attributes below are
    the subscription's."""

    sub_type: SubscriptionType
    policy: FailurePolicy
    dropped: int
    dead_letters_stored: int
    _entries: dict[int, PoisonEntry]
    _blocked: dict[int, None]
    _notices: list[Dropped | DeadLetter]
    _republish_at: list[tuple[int, int, int]]
    _sendable: dict[bytes, None]
    _ready: deque[int]
    _tokens: int
    _now: int
    _keys: dict[bytes, deque[int]]
    _restored: dict[int, int]
    _attempts_dirty: bool
    _attempts_stored: bool
    cursor: int

    # supplied by ReliableSubscription
    def _begin(self, now_ms: int) -> None: ...
    def _finish(self, *, force_persist: bool = False) -> list[Any]: ...
    def _remove(self, offset: int, entry: PoisonEntry) -> None: ...
    def _break_run(self, restart_at: int) -> None: ...

    def entry_state(self, offset: int) -> EntryState | None:
        """Where a read, unacknowledged offset is in Danube's per-message states; None for
        one not in the window (unread, or acknowledged, dropped or dead-lettered)."""
        entry = self._entries.get(offset)
        if entry is None:
            return None
        if entry.held is not None:
            return entry.held
        if entry.consumer is not None:
            return EntryState.AWAITING_ACK
        return EntryState.WAITING_TO_RETRY if entry.failures else EntryState.READY_TO_SEND

    def attempts(self, offset: int) -> int:
        """Failures charged to a read, unacknowledged offset (0 for one not in the window)."""
        entry = self._entries.get(offset)
        return entry.failures if entry is not None else 0

    @property
    def blocked(self) -> tuple[int, ...]:
        """Offsets exhausted under Block, waiting for an operator or a policy change."""
        return tuple(self._blocked)

    @property
    def held(self) -> tuple[int, ...]:
        """Offsets exhausted and not resolved yet: blocked, or waiting for their dead letter
        to be stored. Sent to nobody meanwhile, so a single-active run may pass them."""
        return tuple(offset for offset, entry in self._entries.items() if entry.held is not None)

    def attempt_counts(self) -> dict[int, int]:
        """Failures of every offset past the cursor that failed at least once, those read
        back and not admitted yet included: what `PersistCursor.attempts` stores and a
        rebuilt machine starts from (spec/failure-policies.md, "What is persisted")."""
        counts = {o: f for o, f in self._restored.items() if o > self.cursor}
        counts.update((o, e.failures) for o, e in self._entries.items() if e.failures)
        return counts

    def _attempts_to_persist(self) -> tuple[tuple[int, int], ...] | None:
        """The counts to store with the cursor: None when unchanged since the last store
        (most cursor writes of a healthy subscription carry none)."""
        if not self._attempts_dirty:
            return None
        self._attempts_dirty = False
        counts = tuple(sorted(self.attempt_counts().items()))
        if not counts and not self._attempts_stored:
            return None  # failures that were settled before they were ever stored
        self._attempts_stored = bool(counts)
        return counts

    def _spent(self, offset: int, entry: PoisonEntry) -> bool:
        """A message about to go out that is exhausted already (failures read back after a
        restart or a move, or a policy change that lowered the limit): the poison policy
        decides now rather than after one more delivery. True when it did."""
        if (
            not entry.failures
            or entry.held is not None
            or entry.consumer is not None
            or not self.policy.exhausted(entry.failures)
        ):
            return False
        self._exhaust(offset, entry)
        return True

    def _head(self, key: bytes) -> PoisonEntry:
        """Key-Shared: the key's first unacknowledged message."""
        return self._entries[self._keys[key][0]]

    def release(self, offset: int, now_ms: int) -> list[Any]:
        """Operator: a blocked message goes out again with its attempts reset (Exclusive and
        Failover: the run restarts at `cursor + 1`, in order). Ignored for any other offset."""
        self._begin(now_ms)
        entry = self._entries.get(offset)
        if entry is not None and entry.held is EntryState.BLOCKED:
            entry.failures = 0
            self._attempts_dirty = True
            self._unblock(offset, entry)
        return self._finish()

    def skip(self, offset: int, now_ms: int) -> list[Any]:
        """Operator: a blocked message is dropped (`Dropped`), as the Drop policy would.
        Ignored for any other offset."""
        self._begin(now_ms)
        entry = self._entries.get(offset)
        if entry is not None and entry.held is EntryState.BLOCKED:
            self._drop(offset, entry)
        return self._finish()

    def dead_lettered(self, offset: int, now_ms: int) -> list[Any]:
        """The dead-letter topic stored the message's copy: the cursor may pass it now.
        Ignored unless the offset waits for its republish."""
        self._begin(now_ms)
        entry = self._entries.get(offset)
        if entry is not None and entry.held is EntryState.DEAD_LETTERING:
            self.dead_letters_stored += 1
            self._remove(offset, entry)
        return self._finish()

    def dead_letter_failed(self, offset: int, now_ms: int) -> list[Any]:
        """The republish failed: it is asked for again after the policy's redelivery delay
        (counting failed republishes), the message staying in the window meanwhile."""
        self._begin(now_ms)
        entry = self._entries.get(offset)
        if entry is not None and entry.held is EntryState.DEAD_LETTERING:
            entry.republish_failures += 1
            self._tokens += 1
            entry.token = self._tokens
            delay = self.policy.redelivery_delay_ms(entry.republish_failures, None)
            due = self._now + max(REPUBLISH_RETRY_FLOOR_MS, delay)
            heapq.heappush(self._republish_at, (due, offset, entry.token))
        return self._finish()

    def _exhaust(self, offset: int, entry: PoisonEntry) -> None:
        """The message used its deliveries: the poison policy decides. Its timers are
        forgotten (a new token); the Exclusive run is not broken, nothing needs resending."""
        self._tokens += 1
        entry.token = self._tokens
        poison = self.policy.poison
        if poison is Poison.DROP:
            self._drop(offset, entry)
        elif poison is Poison.BLOCK:
            entry.held = EntryState.BLOCKED
            self._blocked[offset] = None
        else:
            entry.held = EntryState.DEAD_LETTERING
            self._notices.append(self._dead_letter(offset, entry))

    def _republish_due(self, offset: int, entry: PoisonEntry) -> None:
        """A failed republish's time to ask again. If the operator has since changed the
        policy away from DeadLetter, the new policy decides, as for a blocked message: no
        dead-letter topic it no longer names is asked for (and none, when it names none)."""
        if self.policy.poison is Poison.DEAD_LETTER:
            self._notices.append(self._dead_letter(offset, entry))
            return
        entry.held = EntryState.BLOCKED
        self._blocked[offset] = None
        self._reresolve_blocked()

    def _dead_letter(self, offset: int, entry: PoisonEntry) -> DeadLetter:
        topic = self.policy.dead_letter_topic or ""
        return DeadLetter(offset, entry.failures, entry.reason, topic)

    def _drop(self, offset: int, entry: PoisonEntry) -> None:
        self.dropped += 1
        self._notices.append(Dropped(offset, entry.failures))
        self._remove(offset, entry)

    def _unblock(self, offset: int, entry: PoisonEntry) -> None:
        """A blocked message may go out again (its attempts as the caller left them)."""
        entry.held = None
        del self._blocked[offset]
        if self.sub_type is SubscriptionType.KEY_SHARED:
            self._sendable[entry.key] = None
        elif self.sub_type is SubscriptionType.SHARED:
            self._ready.appendleft(offset)
        else:
            self._break_run(self._now)

    def _reresolve_blocked(self) -> None:
        """A new policy applies to blocked messages at once: one it no longer counts as
        exhausted goes out again (attempts kept), one it exhausts under Drop or DeadLetter is
        resolved so. A republish already asked for keeps going."""
        for offset in list(self._blocked):
            entry = self._entries[offset]
            if not self.policy.exhausted(entry.failures):
                self._unblock(offset, entry)
            elif self.policy.poison is not Poison.BLOCK:
                entry.held = None
                del self._blocked[offset]
                self._exhaust(offset, entry)
