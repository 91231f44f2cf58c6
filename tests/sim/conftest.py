"""Shared fixtures of the simulator tests."""

from __future__ import annotations

import pytest

from sim import cluster_data

FOUND_OBJECT_BATCH_MS = 20
"""`sim.cluster_data.OBJECT_BATCH_MS` until issue 22's round 13 (the product's 100 since)."""


@pytest.fixture
def as_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `object` level's batch of the cluster runs before issue 22's round 13: a replay of
    a run found then, or a search for a scenario that needs objects of about one message,
    runs with it (with `batched=0`, plain producers, nothing drawn: main's runs exactly)."""
    monkeypatch.setattr(cluster_data, "OBJECT_BATCH_MS", FOUND_OBJECT_BATCH_MS)
