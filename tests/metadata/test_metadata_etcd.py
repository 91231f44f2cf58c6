"""What only the etcd backend has: connecting, key prefixes, etcd's compaction and lease clock,
several clients racing on one etcd, and etcd going away."""

from __future__ import annotations

import asyncio
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_asyncio

from danube.localcluster.etcd_process import EtcdProcess, free_port
from danube.metadata import (
    CompactedError,
    Compare,
    Get,
    LeaseNotFound,
    MetadataError,
    Put,
    TxnResult,
    WatchEvent,
)
from danube.metadata.etcd import EtcdStore, EtcdUnavailable, wire
from danube.metadata.etcd import store as store_module
from danube.metadata.etcd.store import CALLS_IN_FLIGHT
from tests.support.etcd import EtcdStores

pytestmark = pytest.mark.trio


async def test_unreachable_endpoint_is_named_in_the_error(etcd_stores: EtcdStores) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(EtcdUnavailable, match=f"etcd at {dead} did not answer within 0.3 s") as e:
        await EtcdStore.connect([dead], timeout_s=0.3)
    assert isinstance(e.value, MetadataError)
    assert "grpc" not in "".join(traceback.format_exception(e.value)), "no gRPC traceback"

    # The first endpoint that answers is the one used.
    store = await etcd_stores.open(timeout_s=0.3)
    await store.put("/k", "v")
    fallback = await EtcdStore.connect(
        [dead, f"http://{etcd_stores.server.endpoint}"], prefix=etcd_stores.prefix, timeout_s=0.3
    )
    async with fallback:
        assert (await fallback.get("/k")) == await store.get("/k")


async def test_endpoints_must_be_host_and_port_with_a_scheme_that_matches_the_transport() -> None:
    with pytest.raises(ValueError, match="https:// needs a TLS context"):
        await EtcdStore.connect(["https://127.0.0.1:2379"])
    with pytest.raises(ValueError, match="expected http:// or https://"):
        await EtcdStore.connect(["grpc://127.0.0.1:2379"])
    with pytest.raises(ValueError, match="not host:port"):
        await EtcdStore.connect(["127.0.0.1"])
    with pytest.raises(ValueError, match="at least one endpoint"):
        await EtcdStore.connect([])


async def test_prefixes_isolate_stores_sharing_one_etcd(etcd_stores: EtcdStores) -> None:
    a = await etcd_stores.open(prefix=f"{etcd_stores.prefix}/a")
    b = await etcd_stores.open(prefix=f"{etcd_stores.prefix}/b")
    parent = await etcd_stores.open()
    async with b.watch("") as b_events:
        await a.put("/k", "a")
        revision = await b.put("/k", "b")
        assert await anext(b_events) == WatchEvent("put", "/k", "b", revision, None)
    a_key = await a.get("/k")
    assert a_key is not None and (a_key.key, a_key.value) == ("/k", "a")
    assert [(kv.key, kv.value) for kv in await parent.scan("")] == [("/a/k", "a"), ("/b/k", "b")]
    assert await a.delete_prefix("") == 1
    assert [kv.key for kv in await b.scan("")] == ["/k"]
    created = await a.txn([Compare("/k", "version", "==", 0)], [Put("/k", "again")])
    assert created.succeeded, "a's /k is gone even though b's is not"


async def test_value_compares_on_a_missing_key_fail_as_in_etcd(etcd_stores: EtcdStores) -> None:
    # etcd cannot represent a missing value, so every value compare on a missing key is false;
    # the in-memory reference treats the missing value as JSON null instead.
    store = await etcd_stores.open()
    for op in ("==", "!="):
        result = await store.txn([Compare("/missing", "value", op, None)], [Put("/x", 1)])
        assert not result.succeeded, op
    assert await store.get("/x") is None


async def test_watch_from_a_compacted_revision_fails(etcd_stores: EtcdStores) -> None:
    store = await etcd_stores.open()
    first = await store.put("/k", 0)
    second = await store.put("/k", 1)
    last = await store.put("/k", 2)
    await trio.to_thread.run_sync(etcd_stores.server.compact, last)
    async with store.watch("/", start_revision=first) as events:
        with pytest.raises(CompactedError, match=f"up to revision {last}"):
            await anext(events)
    async with store.watch("/", start_revision=second) as events:  # needs only `last` on
        replayed = await anext(events)
        assert (replayed.kind, replayed.key, replayed.value) == ("put", "/k", 2)
        assert replayed.mod_revision == last
        revision = await store.put("/k", 3)
        assert await anext(events) == WatchEvent("put", "/k", 3, revision, 2)


async def test_a_watch_hands_over_the_events_of_one_response_without_a_turn_between_them(
    etcd_stores: EtcdStores,
) -> None:
    """The events of one etcd response (one transaction's 40 puts) reach the consumer in
    bursts (`watch.BURST`), not one trio scheduling round each: on a busy leader a round per event
    spread a failover's markers over most of a second. A task that counts scheduling rounds
    sees a few while the 40 events are read, not 40."""
    store = await etcd_stores.open()
    rounds = 0

    async def count_rounds() -> None:
        nonlocal rounds
        while True:
            await trio.lowlevel.checkpoint()
            rounds += 1

    async with store.watch("/burst/") as events, trio.open_nursery() as nursery:
        await store.txn([], [Put(f"/burst/{n:02}", n) for n in range(40)])
        first = await anext(events)  # waits for the response: its other events are here too
        nursery.start_soon(count_rounds)
        await trio.lowlevel.checkpoint()
        before = rounds
        rest = [await anext(events) for _ in range(39)]
        during = rounds - before
        nursery.cancel_scope.cancel()
    assert [e.value for e in (first, *rest)] == list(range(40))
    assert during <= 4, f"{during} scheduling rounds while reading 39 events"


async def test_txn_many_keeps_each_transactions_compares_and_outcome(
    etcd_stores: EtcdStores,
) -> None:
    """One request, several transactions (the load manager's batched failovers): a failed
    compare fails only its own transaction, and a later one still runs."""
    store = await etcd_stores.open()
    await store.put("/a", 1)
    await store.put("/b", 1)
    results = await store.txn_many(
        [
            ([Compare("/a", "value", "==", 1)], [Put("/a", 2)]),
            ([Compare("/b", "value", "==", 9)], [Put("/b", 2)]),
            ([Compare("/c", "version", "==", 0)], [Put("/c", 3), Get("/a")]),
        ]
    )
    assert [r.succeeded for r in results] == [True, False, True]
    assert results[0].responses[0].value == 1  # the Put's previous value
    assert results[1].responses == ()
    assert results[2].responses[1].value == 2  # sees the first transaction's write
    assert [(await store.get(k)).value for k in ("/a", "/b", "/c")] == [2, 1, 3]  # type: ignore[union-attr]
    assert len({r.revision for r in results}) == 1


async def test_read_many_reads_keys_and_prefixes_in_one_request_as_get_and_scan_do(
    etcd_stores: EtcdStores,
) -> None:
    """A batch of loads reads every topic's keys and prefixes in one request (issue 23):
    the same answers as one `get` or `scan` each."""
    store = await etcd_stores.open()
    for key, value in [("/t/a/x", 1), ("/t/a/y", 2), ("/t/ab/z", 3), ("/p", 4)]:
        await store.put(key, value)
    found, scanned = await store.read_many(["/p", "/missing"], ["/t/a/", "/t/ab/", "/none/"])
    assert found == {"/p": await store.get("/p"), "/missing": None}
    assert scanned == {p: await store.scan(p) for p in ("/t/a/", "/t/ab/", "/none/")}
    assert [kv.value for kv in scanned["/t/a/"]] == [1, 2]


async def test_concurrent_cas_from_two_stores_has_one_winner(etcd_stores: EtcdStores) -> None:
    stores = {"first": await etcd_stores.open(), "second": await etcd_stores.open()}

    async def campaign(name: str, key: str, outcomes: dict[str, TxnResult]) -> None:
        guard = Compare(key, "version", "==", 0)
        outcomes[name] = await stores[name].txn([guard], [Put(key, name)], [Get(key)])

    for round_ in range(10):
        key = f"/leader/{round_}"
        outcomes: dict[str, TxnResult] = {}
        async with trio.open_nursery() as nursery:
            for name in stores:
                nursery.start_soon(campaign, name, key, outcomes)
        winners = [name for name, outcome in outcomes.items() if outcome.succeeded]
        assert len(winners) == 1, outcomes
        (loser,) = set(stores) - set(winners)
        assert outcomes[loser].responses[0].value == winners[0]


async def test_read_modify_cas_loops_from_two_stores_lose_no_update(
    etcd_stores: EtcdStores,
) -> None:
    first, second = await etcd_stores.open(), await etcd_stores.open()
    await first.put("/counter", 0)

    async def increment(store: EtcdStore, times: int) -> None:
        for _ in range(times):
            while True:
                current = await store.get("/counter")
                assert current is not None
                guard = Compare("/counter", "mod_revision", "==", current.mod_revision)
                if (await store.txn([guard], [Put("/counter", current.value + 1)])).succeeded:
                    break

    async with trio.open_nursery() as nursery:
        nursery.start_soon(increment, first, 25)
        nursery.start_soon(increment, second, 25)
    counter = await second.get("/counter")
    assert counter is not None and (counter.value, counter.version) == (50, 51)


async def test_a_put_event_carries_its_lease(etcd_stores: EtcdStores) -> None:
    """The lease tells a broker's own leader key from its past incarnation's (issue 23)."""
    store = await etcd_stores.open()
    lease = await store.grant_lease(5.0)
    async with store.watch("/leader/") as events:
        await store.put("/leader/x", "b1", lease=lease)
        await store.put("/leader/y", "b1")
        with trio.fail_after(5):
            leased, plain = await anext(events), await anext(events)
    assert (leased.lease, plain.lease) == (lease, None)
    await store.revoke(lease)


@pytest.mark.slow
async def test_lease_expiry_deletes_keys_with_events(etcd_stores: EtcdStores) -> None:
    store = await etcd_stores.open()
    # A 2 s lease renewed every 0.6 s: 1.4 s to spare for each keepalive on a loaded
    # machine (a 1 s lease expired between two keepalives on a busy CI run).
    lease = await store.grant_lease(2.0)
    revision = await store.put("/brokers/1", {"addr": "a"}, lease=lease)
    async with store.watch("/brokers/") as events:
        for _ in range(5):  # 3 s in all: only the keepalives keep a 2 s lease alive
            await trio.sleep(0.6)
            await store.keepalive(lease)
        assert await store.get("/brokers/1") is not None
        with trio.fail_after(5):
            expired = await anext(events)
    assert expired == WatchEvent("delete", "/brokers/1", None, expired.mod_revision, {"addr": "a"})
    assert expired.mod_revision > revision
    assert await store.get("/brokers/1") is None
    with pytest.raises(LeaseNotFound, match=str(lease)):
        await store.keepalive(lease)
    with pytest.raises(LeaseNotFound):
        await store.put("/brokers/1", {}, lease=lease)
    with pytest.raises(LeaseNotFound, match=str(lease)):
        await store.revoke(lease)


async def test_etcd_going_away_is_reported_as_unavailable(tmp_path: Path) -> None:
    server = await trio.to_thread.run_sync(EtcdProcess(tmp_path).start)
    try:
        async with await EtcdStore.connect([server.endpoint], timeout_s=2) as store:
            await store.put("/k", 1)
            async with store.watch("/") as events:
                await trio.to_thread.run_sync(server.stop)
                with pytest.raises(EtcdUnavailable, match=server.endpoint):
                    await anext(events)
            with pytest.raises(EtcdUnavailable, match=server.endpoint):
                await store.get("/k")
    finally:
        server.stop()


async def test_a_missing_etcd_binary_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("danube.localcluster.etcd_process.ETCD_BIN", tmp_path / "no-etcd-here")
    with pytest.raises(RuntimeError, match="install the Debian package etcd-server"):
        EtcdProcess(tmp_path).start()


async def test_a_cancelled_call_is_finished_not_abandoned(etcd_stores: EtcdStores) -> None:
    # An abandoned write could land after the same caller's next one; the store finishes it
    # (within its timeout) and the caller's cancellation takes effect afterwards.
    store = await etcd_stores.open()
    with trio.CancelScope() as scope:
        scope.cancel()
        revision = await store.put("/k", "landed")
    assert scope.cancelled_caught is False, "the put returned; the next checkpoint cancels"
    stored = await store.get("/k")
    assert stored is not None and (stored.value, stored.mod_revision) == ("landed", revision)


async def test_kv_calls_wait_for_a_slot_and_lease_calls_do_not(etcd_stores: EtcdStores) -> None:
    """At most CALLS_IN_FLIGHT KV calls on the connection (h2 walks every open stream to open
    one); a lease renewal never waits behind them, or a busy broker would fence itself."""
    store = await etcd_stores.open()
    lease = await store.grant_lease(10)
    for _ in range(CALLS_IN_FLIGHT):
        store._calls.acquire_nowait()  # every slot busy
    with trio.move_on_after(1) as waited:
        await store.get("/k")
    assert waited.cancelled_caught, "a KV call went out with every slot taken"
    with trio.fail_after(5):
        await store.keepalive(lease)
    store._calls.release()
    with trio.fail_after(5):
        assert await store.get("/k") is None


async def test_a_renewal_goes_out_while_the_kv_connection_is_stuck(
    etcd_stores: EtcdStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease calls have a connection of their own (issue 23 point 4): under a failover's
    hundreds of reads and transactions a renewal queued on the KV connection failed, and the
    broker fenced itself. Here every call on the KV connection stalls until its deadline;
    the renewal still goes out and is answered by the real etcd."""
    store = await etcd_stores.open(timeout_s=2)
    lease = await store.grant_lease(10)
    original = store_module._request_reply

    async def stalled(channel: Any, *args: Any) -> Any:
        if channel is store._channel:  # the bulk lane: nothing gets through
            await asyncio.sleep(args[-1])
            raise TimeoutError("stalled")
        return await original(channel, *args)

    monkeypatch.setattr(store_module, "_request_reply", stalled)
    failed: list[BaseException] = []

    async def read() -> None:
        try:
            await store.get("/k")
        except MetadataError as error:
            failed.append(error)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(read)
        await trio.sleep(0.2)  # the reads are on the stuck connection
        with trio.fail_after(1):
            await store.keepalive(lease)
            await store.keepalive(lease)
        assert not failed, "the reads were not stuck when the renewals went out"
    assert len(failed) == 8
    monkeypatch.setattr(store_module, "_request_reply", original)
    await store.revoke(lease)


async def test_the_store_runs_on_the_callers_thread_beside_another_asyncio_loop(
    etcd_stores: EtcdStores,
) -> None:
    # The broker opens its own trio-asyncio loop after its store and closes it before; the
    # store's loop is its own, and neither it nor a watch starts a thread.
    threads = threading.active_count()
    async with trio_asyncio.open_loop():
        store = await etcd_stores.open()
        async with store.watch("/") as events:
            revision = await store.put("/k", 1)
            assert await trio_asyncio.aio_as_trio(asyncio.sleep)(0, "broker loop") == "broker loop"
            assert await anext(events) == WatchEvent("put", "/k", 1, revision, None)
            assert threading.active_count() == threads
    assert (await store.get("/k")) is not None, "the store outlives the other loop"


async def test_a_scan_larger_than_grpcs_default_message_limit(etcd_stores: EtcdStores) -> None:
    # As etcd's Go client: a scan of a large prefix must not fail on gRPC's 4 MiB default.
    store = await etcd_stores.open()
    value = "x" * (1 << 20)  # etcd takes requests of up to 1.5 MiB
    for i in range(5):
        await store.put(f"/big/{i}", value)
    scanned = await store.scan("/big/")
    assert [kv.key for kv in scanned] == [f"/big/{i}" for i in range(5)]
    assert all(kv.value == value for kv in scanned)


async def test_a_malformed_reply_is_a_metadata_error_not_an_outage(
    etcd_stores: EtcdStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await etcd_stores.open()
    await store.put("/k", 1)

    def garbled(data: bytes) -> wire.RangeReply:
        raise wire.WireError("truncated field")

    monkeypatch.setattr(wire.RangeReply, "FromString", staticmethod(garbled))
    with pytest.raises(MetadataError, match="malformed reply: truncated field") as error:
        await store.get("/k")
    assert not isinstance(error.value, EtcdUnavailable)
    monkeypatch.undo()
    assert (await store.get("/k")) is not None, "the connection is still usable"
