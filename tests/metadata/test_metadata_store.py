"""Behaviour every MetadataStore backend must share, run against each of them."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from danube.metadata import (
    CompactedError,
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseNotFound,
    MemoryStore,
    MetadataStore,
    Put,
    StoreClosed,
    WatchEvent,
)
from tests.metadata.fakes import FakeClock

pytestmark = pytest.mark.trio


async def test_is_a_metadata_store(store: MemoryStore) -> None:
    assert isinstance(store, MetadataStore)


async def test_get_put_delete_scan(store: MemoryStore) -> None:
    assert await store.get("/ns/a") is None
    assert await store.put("/ns/a", {"policies": {"max_producers": 0}}) == 1
    assert await store.put("/ns/b", None) == 2
    assert await store.put("/ns/a", {"policies": {}}) == 3
    assert await store.put("/other", 1) == 4
    assert await store.get("/ns/a") == KeyValue("/ns/a", {"policies": {}}, 1, 3, 2, None)
    assert [kv.key for kv in await store.scan("/ns/")] == ["/ns/a", "/ns/b"]
    assert await store.delete("/ns/b") is True
    assert await store.delete("/ns/b") is False
    assert await store.delete_prefix("/") == 2
    assert await store.scan("") == []
    assert await store.put("/x", 1) == 7


async def test_txn_cas_and_single_revision(store: MemoryStore) -> None:
    create = [Compare("/topic", "version", "==", 0)]
    first = await store.txn(create, [Put("/topic", "t"), Put("/topic/sub", "s")], [Get("/topic")])
    assert first.succeeded and first.revision == 1
    second = await store.txn(create, [Put("/topic", "again")], [Get("/topic")])
    assert not second.succeeded
    assert second.revision == 1
    assert second.responses == (KeyValue("/topic", "t", 1, 1, 1, None),)
    swap = await store.txn(
        [Compare("/topic", "mod_revision", "==", 1)], [Put("/topic", "u"), Delete("/topic/sub")]
    )
    assert swap.succeeded and swap.revision == 2
    assert await store.scan("/") == [KeyValue("/topic", "u", 1, 2, 2, None)]


async def test_watch_delivers_live_events_for_its_prefix_only(store: MemoryStore) -> None:
    await store.put("/a/before", 0)
    async with store.watch("/a/") as events:
        await store.put("/b/x", 1)
        await store.put("/a/x", 1)
        await store.delete("/a/x")
        await store.put("/ab", 1)
        await store.put("/a/y", 2)
        assert [await anext(events) for _ in range(3)] == [
            WatchEvent("put", "/a/x", 1, 3, None),
            WatchEvent("delete", "/a/x", None, 4, 1),
            WatchEvent("put", "/a/y", 2, 6, None),
        ]


async def test_watch_from_a_revision_replays_then_continues(store: MemoryStore) -> None:
    await store.put("/k/1", 1)
    await store.put("/k/2", 2)
    await store.put("/z", 0)
    async with store.watch("/k/", start_revision=1) as events:
        await store.put("/k/3", 3)
        got = [await anext(events) for _ in range(2)]
    assert [(e.key, e.mod_revision) for e in got] == [("/k/2", 2), ("/k/3", 4)]
    async with store.watch("/k/", start_revision=0) as events:
        assert (await anext(events)).key == "/k/1"


async def test_watch_from_a_future_revision_skips_until_then(store: MemoryStore) -> None:
    async with store.watch("/", start_revision=2) as events:
        await store.put("/a", 1)
        await store.put("/a", 2)
        await store.put("/a", 3)
        assert (await anext(events)).mod_revision == 3


async def test_slow_watcher_is_ended_with_compacted_error(store: MemoryStore) -> None:
    async with store.watch("/") as events:
        for i in range(20):  # the fixture buffers 16 events per watcher
            await store.put("/k", i)
        assert [(await anext(events)).value for _ in range(16)] == list(range(16))
        with pytest.raises(CompactedError, match="revision 17"):
            await anext(events)
        await store.put("/k", "after")  # the store is fine; only that watcher ended


async def test_watch_ends_when_the_store_closes(store: MemoryStore) -> None:
    async with store.watch("/") as events:
        await store.put("/k", 1)
        await store.aclose()
        assert [e.key async for e in events] == ["/k"]


async def test_leases_expire_with_delete_events(store: MemoryStore, clock: FakeClock) -> None:
    lease = await store.grant_lease(10)
    await store.put("/brokers/1", {"addr": "a"}, lease=lease)
    await store.put("/config", 1)
    async with store.watch("/brokers/") as events:
        clock.advance(9)
        await store.keepalive(lease)
        clock.advance(9)
        assert await store.get("/brokers/1") is not None
        clock.advance(1)
        assert await store.get("/brokers/1") is None
        assert await anext(events) == WatchEvent("delete", "/brokers/1", None, 3, {"addr": "a"})
    with pytest.raises(LeaseNotFound):
        await store.keepalive(lease)
    with pytest.raises(LeaseNotFound):
        await store.put("/brokers/1", {}, lease=lease)
    assert [kv.key for kv in await store.scan("/")] == ["/config"]


async def test_revoke_deletes_the_lease_keys(store: MemoryStore) -> None:
    lease = await store.grant_lease(30)
    assert await store.put("/e/1", 1, lease=lease) == 1
    assert (await store.get("/e/1")) == KeyValue("/e/1", 1, 1, 1, 1, lease)
    await store.revoke(lease)
    assert await store.scan("/") == []
    with pytest.raises(LeaseNotFound):
        await store.revoke(lease)


async def test_concurrent_writers_get_consecutive_revisions(store: MemoryStore) -> None:
    revisions: list[int] = []

    async def writer(n: int) -> None:
        for i in range(4):
            revisions.append(await store.put(f"/w/{n}", i))

    async with store.watch("/w/", start_revision=0) as events:
        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(writer, n)
        seen = [(await anext(events)).mod_revision for _ in range(16)]
    assert sorted(revisions) == list(range(1, 17))
    assert seen == list(range(1, 17))


async def test_closed_store_refuses_calls(store: MemoryStore) -> None:
    await store.aclose()
    await store.aclose()
    with pytest.raises(StoreClosed):
        await store.get("/k")
    with pytest.raises(StoreClosed):
        await store.put("/k", 1)
    with pytest.raises(StoreClosed):
        async with store.watch("/"):
            pass


async def test_watch_from_a_compacted_revision_fails() -> None:
    store = MemoryStore(FakeClock(), history_limit=2)
    for i in range(3):
        await store.put("/k", i)
    with pytest.raises(CompactedError):
        async with store.watch("/", start_revision=0):
            pass
    async with store.watch("/", start_revision=1) as events:
        assert (await anext(events)).mod_revision == 2


async def test_run_lease_expiry_collects_without_other_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with MemoryStore() as store:
        lease = await store.grant_lease(2)
        await store.put("/eph", 1, lease=lease)
        async with store.watch("/") as events, trio.open_nursery() as nursery:
            await nursery.start(store.run_lease_expiry)
            event = await anext(events)
            assert event.kind == "delete"
            assert 2 <= trio.current_time() <= 2 + MemoryStore.LEASE_CHECK_INTERVAL_S
            await store.aclose()  # ends run_lease_expiry, so the nursery can exit
