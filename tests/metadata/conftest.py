"""Fixtures for the metadata tests: a hand-driven clock and each store backend (the shared etcd
is a session fixture of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from danube.metadata import EmbeddedStore, MemoryStore, MetadataStore
from tests.metadata.fakes import FakeClock
from tests.support.etcd import EtcdStores


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "embedded", "etcd"])
async def store(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[MetadataStore]:
    """Every backend, so the behavioural tests pin down one semantics for all of them."""
    if request.param == "memory":
        async with MemoryStore(clock, watch_buffer=16) as memory:
            yield memory
    elif request.param == "embedded":
        async with await EmbeddedStore.open(tmp_path / "meta", clock=clock, watch_buffer=16) as s:
            yield s
    else:
        # Looked up only here, so a run that selects no etcd variant starts no etcd.
        stores = EtcdStores(request.getfixturevalue("etcd_server"))
        try:
            yield await stores.open(watch_buffer=16)
        finally:
            await stores.close()
