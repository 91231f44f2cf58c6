"""Behaviour every MetadataStore backend must share, run against each of them.

Revisions are asserted relative to one the test itself got back: etcd's counter does not start
at 0 and is shared by every test on the one etcd of the run (each test has its own keys, and
tests run one at a time).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from danube.metadata import (
    CompactedError,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    KeyValue,
    LeaseNotFound,
    MemoryStore,
    MetadataStore,
    Put,
    StoreClosed,
    TxnResult,
    WatchEvent,
)
from danube.metadata.etcd import EtcdStore
from danube.metadata.model import CompareOp
from tests.metadata.fakes import FakeClock

pytestmark = pytest.mark.trio

# etcd's watch events travel through their own gRPC stream after the write has returned;
# this is ample time for those of writes already made to reach the watcher's buffer.
ETCD_WATCH_LATENCY_S = 0.5


async def until_delivered(store: MetadataStore) -> None:
    """Lets the watch events of writes already made arrive (the other backends deliver them
    before the write returns)."""
    if isinstance(store, EtcdStore):
        await trio.sleep(ETCD_WATCH_LATENCY_S)


async def test_is_a_metadata_store(store: MetadataStore) -> None:
    assert isinstance(store, MetadataStore)


async def test_get_put_delete_scan(store: MetadataStore) -> None:
    assert await store.get("/ns/a") is None
    r = await store.put("/ns/a", {"policies": {"max_producers": 0}})
    assert await store.put("/ns/b", None) == r + 1
    assert await store.put("/ns/a", {"policies": {}}) == r + 2
    assert await store.put("/other", 1) == r + 3
    assert await store.get("/ns/a") == KeyValue("/ns/a", {"policies": {}}, r, r + 2, 2, None)
    assert await store.get("/ns/b") == KeyValue("/ns/b", None, r + 1, r + 1, 1, None)
    assert [kv.key for kv in await store.scan("/ns/")] == ["/ns/a", "/ns/b"]
    assert await store.delete("/ns/b") is True
    assert await store.delete("/ns/b") is False  # and uses no revision
    assert await store.delete_prefix("/") == 2  # two keys, one revision
    assert await store.scan("") == []
    assert await store.put("/x", 1) == r + 6


async def test_txn_cas_and_single_revision(store: MetadataStore) -> None:
    create = [Compare("/topic", "version", "==", 0)]
    first = await store.txn(create, [Put("/topic", "t"), Put("/topic/sub", "s")], [Get("/topic")])
    assert first.succeeded
    r = first.revision
    second = await store.txn(create, [Put("/topic", "again")], [Get("/topic")])
    assert not second.succeeded
    assert second.revision == r
    assert second.responses == (KeyValue("/topic", "t", r, r, 1, None),)
    swap = await store.txn(
        [Compare("/topic", "mod_revision", "==", r)], [Put("/topic", "u"), Delete("/topic/sub")]
    )
    assert swap.succeeded and swap.revision == r + 1
    assert await store.scan("/") == [KeyValue("/topic", "u", r, r + 1, 2, None)]


async def test_txn_responses_have_the_documented_shapes(store: MetadataStore) -> None:
    r = await store.put("/a", 1)
    await store.put("/d", "doomed")
    await store.put("/p/1", 1)
    await store.put("/p/2", 2)
    result = await store.txn(
        [Compare("/a", "value", "==", 1)],
        [
            Put("/a", 2),
            Put("/new", [True, None]),
            Delete("/d"),
            Delete("/missing"),
            DeletePrefix("/p/"),
            Get("/a"),  # sees the Put before it
            Get("/nothing"),
        ],
    )
    t = r + 4
    assert result == TxnResult(
        True,
        t,
        (
            KeyValue("/a", 1, r, r, 1, None),
            None,
            True,
            False,
            2,
            KeyValue("/a", 2, r, t, 2, None),
            None,
        ),
    )
    failed = await store.txn([Compare("/a", "version", ">", 2)], [Delete("/a")], [Get("/new")])
    assert failed == TxnResult(False, t, (KeyValue("/new", [True, None], t, t, 1, None),))


async def test_value_compares_are_on_canonical_json(store: MetadataStore) -> None:
    await store.put("/k", {"b": 1, "a": [True, None]})
    await store.put("/n", 10)

    async def holds(key: str, op: CompareOp, operand: object) -> bool:
        return (await store.txn([Compare(key, "value", op, operand)], [])).succeeded

    assert await holds("/k", "==", {"a": [True, None], "b": 1}), "key order does not matter"
    assert not await holds("/k", "==", {"a": [1, None], "b": 1}), "true is not 1 in JSON"
    assert await holds("/k", "!=", {"a": [True]})
    assert await holds("/n", "<", 9), "text order: '10' < '9'"
    assert await holds("/n", ">", 1)


async def test_watch_delivers_live_events_for_its_prefix_only(store: MetadataStore) -> None:
    r = await store.put("/a/before", 0)
    async with store.watch("/a/") as events:
        await store.put("/b/x", 1)
        await store.put("/a/x", 1)
        await store.delete("/a/x")
        await store.put("/ab", 1)
        await store.put("/a/y", 2)
        assert [await anext(events) for _ in range(3)] == [
            WatchEvent("put", "/a/x", 1, r + 2, None),
            WatchEvent("delete", "/a/x", None, r + 3, 1),
            WatchEvent("put", "/a/y", 2, r + 5, None),
        ]


async def test_watch_from_a_revision_replays_then_continues(store: MetadataStore) -> None:
    r = await store.put("/k/1", 1)
    await store.put("/k/2", 2)
    await store.put("/z", 0)
    async with store.watch("/k/", start_revision=r) as events:
        await store.put("/k/3", 3)
        got = [await anext(events) for _ in range(2)]
    assert [(e.key, e.mod_revision) for e in got] == [("/k/2", r + 1), ("/k/3", r + 3)]
    async with store.watch("/k/", start_revision=r - 1) as events:
        assert (await anext(events)).key == "/k/1"


async def test_replay_is_not_limited_by_the_watch_buffer(store: MetadataStore) -> None:
    r = await store.put("/k", -1)
    for i in range(40):  # more than the fixture's 16-event buffer, replayed at once
        await store.put("/k", i)
    async with store.watch("/", start_revision=r) as events:
        assert [(await anext(events)).value for _ in range(40)] == list(range(40))


async def test_watch_from_a_future_revision_skips_until_then(store: MetadataStore) -> None:
    r = await store.put("/before", 0)
    async with store.watch("/", start_revision=r + 2) as events:
        await store.put("/a", 1)
        await store.put("/a", 2)
        await store.put("/a", 3)
        assert await anext(events) == WatchEvent("put", "/a", 3, r + 3, 2)


async def test_slow_watcher_is_ended_with_compacted_error(store: MetadataStore) -> None:
    r = await store.put("/before", 0)
    async with store.watch("/") as events:
        for i in range(20):  # the fixture buffers 16 events per watcher
            await store.put("/k", i)
        await until_delivered(store)
        assert [(await anext(events)).value for _ in range(16)] == list(range(16))
        with pytest.raises(CompactedError, match=f"revision {r + 17} on"):
            await anext(events)
        await store.put("/k", "after")  # the store is fine; only that watcher ended


async def test_watch_ends_when_the_store_closes(store: MetadataStore) -> None:
    async with store.watch("/") as events:
        await store.put("/k", 1)
        await until_delivered(store)
        await store.aclose()
        assert [e.key async for e in events] == ["/k"]


# Only the backends that expire leases on the FakeClock; etcd's own clock is tested in real
# time by test_metadata_etcd.py::test_lease_expiry_deletes_keys_with_events.
@pytest.mark.parametrize("store", ["memory", "embedded"], indirect=True)
async def test_leases_expire_with_delete_events(store: MetadataStore, clock: FakeClock) -> None:
    lease = await store.grant_lease(10)
    r = await store.put("/brokers/1", {"addr": "a"}, lease=lease)
    await store.put("/config", 1)
    async with store.watch("/brokers/") as events:
        clock.advance(9)
        await store.keepalive(lease)
        clock.advance(9)
        assert await store.get("/brokers/1") is not None
        clock.advance(1)
        assert await store.get("/brokers/1") is None
        assert await anext(events) == WatchEvent("delete", "/brokers/1", None, r + 2, {"addr": "a"})
    with pytest.raises(LeaseNotFound):
        await store.keepalive(lease)
    with pytest.raises(LeaseNotFound):
        await store.put("/brokers/1", {}, lease=lease)
    assert [kv.key for kv in await store.scan("/")] == ["/config"]


async def test_revoke_deletes_the_lease_keys(store: MetadataStore) -> None:
    lease = await store.grant_lease(30)
    r = await store.put("/e/1", 1, lease=lease)
    await store.put("/e/2", 2, lease=lease)
    assert (await store.get("/e/1")) == KeyValue("/e/1", 1, r, r, 1, lease)
    async with store.watch("/e/") as events:
        await store.revoke(lease)
        deleted = [await anext(events) for _ in range(2)]
    assert [(e.kind, e.key, e.mod_revision) for e in deleted] == [
        ("delete", "/e/1", r + 2),
        ("delete", "/e/2", r + 2),
    ], "one revision for all the lease's keys"
    assert await store.scan("/") == []
    with pytest.raises(LeaseNotFound):
        await store.revoke(lease)


async def test_concurrent_writers_get_consecutive_revisions(store: MetadataStore) -> None:
    revisions: list[int] = []

    async def writer(n: int) -> None:
        for i in range(4):
            revisions.append(await store.put(f"/w/{n}", i))

    r = await store.put("/start", 0)
    async with store.watch("/w/", start_revision=r) as events:
        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(writer, n)
        seen = [(await anext(events)).mod_revision for _ in range(16)]
    assert sorted(revisions) == list(range(r + 1, r + 17))
    assert seen == sorted(revisions)


async def test_closed_store_refuses_calls(store: MetadataStore) -> None:
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
