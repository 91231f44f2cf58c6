"""Fixtures for the metadata tests: a hand-driven clock and each store backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from danube.metadata import EmbeddedStore, MemoryStore
from tests.metadata.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "embedded"])
async def store(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[MemoryStore]:
    """Every backend, so the behavioural tests pin down one semantics for all of them."""
    if request.param == "memory":
        opened = MemoryStore(clock, watch_buffer=16)
    else:
        opened = await EmbeddedStore.open(tmp_path / "meta", clock=clock, watch_buffer=16)
    try:
        yield opened
    finally:
        await opened.aclose()
