"""What the broker core asks of a subscription's dispatcher, whichever delivery guarantee it
gives. Both `NonReliableSubscription` and `reliable.ReliableSubscription` implement it, so the
core routes consumers, streams and acknowledgements without asking which one it holds; the
differences (a non-reliable consumer is connected by Subscribe, a reliable one by its receive
stream; only reliable subscriptions take acks) live in the dispatchers' answers.

Every method that can change routing returns the dispatcher's effects: `ConsumerReady` from
the non-reliable one, `reliable.Read` / `Deliver` / `PersistCursor` from the reliable one. The
core carries out both through one path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from danube.machines.dispatch import reliable as rd
from danube.machines.dispatch.types import ConsumerReady, DropReason, SubscriptionType

DispatchEffect = (
    ConsumerReady | rd.Read | rd.Deliver | rd.PersistCursor | rd.Dropped | rd.DeadLetter
)


@runtime_checkable
class Subscription(Protocol):
    """One subscription's delivery decisions. Inputs take the driver's clock (`now_ms`);
    the non-reliable dispatcher, which has no timers, ignores it."""

    sub_type: SubscriptionType

    # -- membership ---------------------------------------------------------------------------

    def add_consumer(
        self, consumer_id: int, name: str, key_filters: tuple[str, ...], now_ms: int
    ) -> Sequence[DispatchEffect]:
        """Registers a consumer, disconnected: a new consumer has nothing to dispatch."""
        ...

    def set_filters(
        self, consumer_id: int, key_filters: tuple[str, ...], now_ms: int
    ) -> Sequence[DispatchEffect]: ...

    def remove_consumer(self, consumer_id: int, now_ms: int) -> Sequence[DispatchEffect]: ...

    def connect(self, consumer_id: int, now_ms: int) -> Sequence[DispatchEffect]: ...

    def disconnect(self, consumer_id: int, now_ms: int) -> Sequence[DispatchEffect]: ...

    def subscribed(self, consumer_id: int, now_ms: int) -> Sequence[DispatchEffect]:
        """Subscribe (or a takeover by name) succeeded: the point where a consumer starts to
        receive when its messages need no stream of their own (non-reliable)."""
        ...

    def stream_reset(self, consumer_id: int, now_ms: int) -> Sequence[DispatchEffect]:
        """The consumer's receive stream is replaced: what the old one had in flight goes out
        again (reliable); queued non-reliable messages were never sent and stay."""
        ...

    def is_connected(self, consumer_id: int) -> bool: ...

    @property
    def active_consumer(self) -> int | None: ...

    @property
    def consumer_ids(self) -> list[int]: ...

    # -- data path ----------------------------------------------------------------------------

    def take(self, consumer_id: int, limit: int) -> list[Any]:
        """Messages the dispatcher itself holds for the consumer's stream writer (reliable
        deliveries are records the core holds, so none here)."""
        ...

    def ack(self, offset: int, now_ms: int) -> Sequence[DispatchEffect]: ...

    def nack(
        self, offset: int, delay_ms: int | None, now_ms: int, *, reason: str | None = None
    ) -> Sequence[DispatchEffect]: ...

    def is_pending(self, offset: int) -> bool:
        """The core must keep the offset's record (read and not yet acknowledged)."""
        ...

    # -- statistics ---------------------------------------------------------------------------

    @property
    def redelivered(self) -> int: ...

    def drop_counts(self) -> dict[DropReason, int]:
        """Messages dropped so far, by reason (only non-reliable dispatch drops)."""
        ...

    def backlog(self, readable_end: int | None) -> int | None:
        """Messages stored and not yet acknowledged, given the end of what the WAL can serve;
        None when the subscription keeps no backlog or the WAL is down."""
        ...
