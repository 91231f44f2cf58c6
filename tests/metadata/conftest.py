"""Fixtures for the metadata tests: a hand-driven clock, one shared etcd, and each store backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from danube.metadata import EmbeddedStore, MemoryStore, MetadataStore
from danube.metadata.etcd import EtcdStore
from tests.metadata.fakes import FakeClock
from tests.support.etcd import EtcdProcess


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd for the whole run, started when a test first needs it; tests keep out of each
    other's way through key prefixes (`EtcdStores`)."""
    with EtcdProcess(tmp_path_factory.mktemp("etcd")) as server:
        yield server


class EtcdStores:
    """Opens EtcdStores on the shared etcd, by default under a prefix of this test's own.

    `close` closes them and deletes the test's keys: a lease of this test that expires later
    then has no keys left to delete, so it cannot add a revision in the middle of another
    test's relative revision assertions.
    """

    def __init__(self, server: EtcdProcess) -> None:
        self.server = server
        self.prefix = f"/test-{uuid.uuid4().hex[:12]}"
        self._opened: list[EtcdStore] = []

    async def open(self, prefix: str | None = None, **options: Any) -> EtcdStore:
        store = await EtcdStore.connect(
            [self.server.endpoint], prefix=self.prefix if prefix is None else prefix, **options
        )
        self._opened.append(store)
        return store

    async def close(self) -> None:
        for store in self._opened:
            await store.aclose()
        async with await EtcdStore.connect([self.server.endpoint], prefix=self.prefix) as cleaner:
            await cleaner.delete_prefix("")


@pytest.fixture
async def etcd_stores(etcd_server: EtcdProcess) -> AsyncIterator[EtcdStores]:
    stores = EtcdStores(etcd_server)
    try:
        yield stores
    finally:
        await stores.close()


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
