"""Planted bugs for invariant 4 (acknowledged is stored: safety) and 4b (backlog drains:
liveness). Each patches the real dispatcher for the duration of a `with` block; each is caught
by one of the two alone (tests/sim/test_safety_liveness.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from danube.machines.dispatch import reliable
from danube.machines.dispatch.types import SubscriptionType


@contextlib.contextmanager
def nack_acknowledges() -> Iterator[None]:
    """A Shared subscription's nack settles its message as an ack would: the message was
    received, so the subscription still 'got' it, but it is never delivered again and the
    cursor passes it. Nothing is undelivered at the end and nothing stalls, and Shared has no
    order or per-key rule to trip (in Key-Shared, invariant 5 would see the next message of
    the key go out; in Exclusive, invariant 3 a later rewind): only the safety rule that a
    cursor passes an offset only once a consumer acknowledged it sees the skip."""
    original = reliable.ReliableSubscription.nack

    def nack(
        self: Any, offset: int, delay_ms: int | None, now_ms: int, *, reason: str | None = None
    ) -> list[Any]:
        if self.sub_type is not SubscriptionType.SHARED:
            return original(self, offset, delay_ms, now_ms, reason=reason)
        self._begin(now_ms)
        entry = self._entries.get(offset)
        if entry is not None and entry.consumer is not None:
            self._settle(offset, entry, entry.consumer)
        return self._finish()

    with mock.patch.object(reliable.ReliableSubscription, "nack", nack):
        yield


@contextlib.contextmanager
def failed_message_never_retried() -> Iterator[None]:
    """Shared and Key-Shared forget to schedule a failed message's redelivery: it keeps its
    window slot and (Key-Shared) blocks its key for ever, so once faults stop the backlog
    stops draining. Nothing is skipped (the cursor stays below the failed offset), so safety
    is quiet; only the drain's progress rule sees it."""
    original = reliable.ReliableSubscription._fail

    def fail(
        self: Any,
        offset: int,
        entry: Any,
        consumer_id: int,
        requested_ms: Any,
        reason: str,
        detail: str | None = None,
    ) -> None:
        if self.sub_type not in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED):
            original(self, offset, entry, consumer_id, requested_ms, reason, detail)
            return
        self._consumers[consumer_id].in_flight.discard(offset)
        entry.consumer = None
        entry.failures += 1

    with mock.patch.object(reliable.ReliableSubscription, "_fail", fail):
        yield


SAFETY_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "nack_acknowledges": nack_acknowledges,
}
LIVENESS_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "failed_message_never_retried": failed_message_never_retried,
}
