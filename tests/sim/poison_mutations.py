"""Planted bugs in the poison-message policies (issue 24) that the simulator's poison
workload must catch. Each patches the real code for the duration of a `with` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from danube.machines.dispatch.failure import FailurePolicy


@contextlib.contextmanager
def limit_off_by_one() -> Iterator[None]:
    """A message is exhausted at `max_redelivery_count` failures, one delivery short of
    Danube's `max_redelivery_count + 1`."""

    def exhausted(self: FailurePolicy, failures: int) -> bool:
        return bool(self.max_redelivery_count) and failures >= self.max_redelivery_count

    with mock.patch.object(FailurePolicy, "exhausted", exhausted):
        yield


POISON_MUTATIONS = {"limit_off_by_one": limit_off_by_one}
