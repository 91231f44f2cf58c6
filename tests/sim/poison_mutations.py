"""Planted bugs in the poison-message policies (issue 24) that the simulator's poison
workload must catch. Each patches the real code for the duration of a `with` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

from danube.machines.dispatch import poison
from danube.machines.dispatch.failure import EntryState, FailurePolicy
from danube.machines.node import restore
from danube.machines.node.dead_letters import DeadLetters
from danube.machines.node.effects import DeadLetterPublish, ForwardDeadLetter
from danube.machines.node.reliable_log import ReliableLogs


@contextlib.contextmanager
def limit_off_by_one() -> Iterator[None]:
    """A message is exhausted at `max_redelivery_count` failures, one delivery short of
    Danube's `max_redelivery_count + 1`."""

    def exhausted(self: FailurePolicy, failures: int) -> bool:
        return failures >= self.max_redelivery_count

    with mock.patch.object(FailurePolicy, "exhausted", exhausted):
        yield


@contextlib.contextmanager
def backoff_past_cap() -> Iterator[None]:
    """The exponential delay without `min(max_redelivery_delay_ms, ...)`."""

    def uncapped(self: FailurePolicy, failures: int, requested_ms: int | None) -> int:
        return max(self.base_redelivery_delay_ms << (failures - 1), requested_ms or 0)

    with mock.patch.object(FailurePolicy, "redelivery_delay_ms", uncapped):
        yield


@contextlib.contextmanager
def blocked_key_overtaken() -> Iterator[None]:
    """Key-Shared: a blocked message steps aside in its key's queue, so the key's next
    message goes out while it is still blocked."""
    original = poison.PoisonHandling._exhaust

    def exhaust(self: Any, offset: int, entry: Any) -> None:
        original(self, offset, entry)
        waiting = self._keys.get(entry.key) if hasattr(self, "_keys") else None
        if entry.held is EntryState.BLOCKED and waiting and len(waiting) > 1:
            waiting.rotate(-1)
            self._sendable[entry.key] = None

    with mock.patch.object(poison.PoisonHandling, "_exhaust", exhaust):
        yield


@contextlib.contextmanager
def dead_letter_passed_before_stored() -> Iterator[None]:
    """The original is reported dead-lettered as soon as its copy is appended, before the
    dead-letter topic stored it: a crash or a failed write in between loses the message."""
    original = DeadLetters.republish

    def republish(self: Any, record: Any, sub: Any, ask: Any, now_ms: int) -> list[Any]:
        effects = original(self, record, sub, ask, now_ms)
        if any(isinstance(e, DeadLetterPublish) and e.failure is None for e in effects):
            found = sub.reliable.dead_lettered(ask.offset, now_ms)
            effects.extend(self._logs.dispatch(record, sub, found, now_ms))
        return effects

    with mock.patch.object(DeadLetters, "republish", republish):
        yield


@contextlib.contextmanager
def forward_passed_before_acknowledged() -> Iterator[None]:
    """Cluster mode: the original is reported dead-lettered as soon as its copy is handed to
    the internal producer, before the dead-letter topic's owner acknowledged it: a lost
    forward, a crash or a topic move in between loses the message."""
    original = DeadLetters.republish

    def republish(self: Any, record: Any, sub: Any, ask: Any, now_ms: int) -> list[Any]:
        effects = original(self, record, sub, ask, now_ms)
        if any(isinstance(e, ForwardDeadLetter) for e in effects):
            found = sub.reliable.dead_lettered(ask.offset, now_ms)
            effects.extend(self._logs.dispatch(record, sub, found, now_ms))
        return effects

    with mock.patch.object(DeadLetters, "republish", republish):
        yield


@contextlib.contextmanager
def attempts_forgotten_on_restart() -> Iterator[None]:
    """A restart reads the cursor back but not the failure counts stored with it: every
    message past the cursor starts again at 0 failures."""

    def forgotten(value: Any) -> dict[int, int]:
        return {}

    with mock.patch.object(restore, "_attempts", forgotten):
        yield


ATTEMPTS_MUTATIONS = {"attempts_forgotten_on_restart": attempts_forgotten_on_restart}
POISON_MUTATIONS = {"limit_off_by_one": limit_off_by_one, "backoff_past_cap": backoff_past_cap}
DEAD_LETTER_MUTATIONS = {"dead_letter_passed_before_stored": dead_letter_passed_before_stored}
FORWARD_MUTATIONS = {"forward_passed_before_acknowledged": forward_passed_before_acknowledged}
KEY_SHARED_MUTATIONS = {"blocked_key_overtaken": blocked_key_overtaken}


@contextlib.contextmanager
def object_readable_before_indexed() -> Iterator[None]:
    """At the `object` level a record is readable once fsynced on the owner, before its
    object is indexed: delivered and acknowledged by a consumer, it is lost with the owner in
    a failover and its offset given to another message, which the stored cursor passes."""

    def unindexed(self: ReliableLogs, record: Any) -> int:
        log = record.log.wal
        return log.readable_offset if log is not None else 0

    with mock.patch.object(ReliableLogs, "readable_end", unindexed):
        yield


OBJECT_MUTATIONS = {"object_readable_before_indexed": object_readable_before_indexed}
