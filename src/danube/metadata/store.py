"""The interface every metadata backend implements (memory, embedded, and later etcd).

Broker code depends on this protocol only, so standalone mode and a cluster differ in which
backend is constructed, not in the code that reads and writes metadata.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from danube.metadata.model import Compare, JSONValue, KeyValue, Op, TxnResult, WatchEvent


@runtime_checkable
class MetadataStore(Protocol):
    """An etcd-shaped key/value store of JSON values under slash-separated keys.

    Every change takes a revision from one store-wide counter; a call that returns has made
    its change durable as far as the backend promises durability. Methods raise StoreClosed
    after `aclose`.
    """

    async def get(self, key: str) -> KeyValue | None: ...

    async def put(self, key: str, value: JSONValue, lease: int | None = None) -> int:
        """Returns the revision of the change; LeaseNotFound if `lease` is not alive."""

    async def delete(self, key: str) -> bool:
        """Returns whether the key existed."""

    async def delete_prefix(self, prefix: str) -> int:
        """Returns how many keys were removed."""

    async def scan(self, prefix: str) -> list[KeyValue]:
        """Keys starting with `prefix` (a plain string prefix), sorted by key."""

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Runs `success` if every compare holds, else `failure`, atomically in one revision."""

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Changes of keys under `prefix`, in revision order.

        With `start_revision`, the iterator first replays every change after that revision
        (CompactedError if the history no longer reaches back that far), then continues live;
        note that etcd's own start revision is inclusive, this one is exclusive so that a
        caller can pass the revision it last saw. Without it, only changes made after the
        watch started are delivered. A watcher that falls too far behind gets CompactedError
        once it has consumed what was buffered; when the store closes, iteration ends.
        """

    async def grant_lease(self, ttl_s: float) -> int:
        """Returns a new lease id; keys put with it vanish if it is not kept alive."""

    async def keepalive(self, lease_id: int) -> None:
        """Restarts the lease's TTL; LeaseNotFound if it already ended."""

    async def revoke(self, lease_id: int) -> None:
        """Ends the lease now and deletes its keys; LeaseNotFound if it already ended."""

    async def aclose(self) -> None:
        """Releases the backend; idempotent."""
