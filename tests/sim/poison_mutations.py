"""Planted bugs in the poison-message policies (issue 24) that the simulator's poison
workload must catch. Each patches the real code for the duration of a `with` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

from danube.machines.dispatch import poison
from danube.machines.dispatch.failure import EntryState, FailurePolicy


@contextlib.contextmanager
def limit_off_by_one() -> Iterator[None]:
    """A message is exhausted at `max_redelivery_count` failures, one delivery short of
    Danube's `max_redelivery_count + 1`."""

    def exhausted(self: FailurePolicy, failures: int) -> bool:
        return failures >= self.max_redelivery_count

    with mock.patch.object(FailurePolicy, "exhausted", exhausted):
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


POISON_MUTATIONS = {"limit_off_by_one": limit_off_by_one}
KEY_SHARED_MUTATIONS = {"blocked_key_overtaken": blocked_key_overtaken}
