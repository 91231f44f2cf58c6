"""Opens stores for tests on the shared etcd (`danube.localcluster.etcd_process`)."""

from __future__ import annotations

import uuid
from typing import Any

from danube.localcluster.etcd_process import EtcdProcess
from danube.metadata.etcd import EtcdStore


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
