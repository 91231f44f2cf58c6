"""Group commit in the embedded store: transactions waiting behind an fsync share the next one,
none is answered or read before the fsync covering it, and a crash between a group's write and
its fsync leaves a prefix. Plus the pure grouping rule (`commit_groups`) under properties."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from danube.metadata import EmbeddedStore, StoreClosed
from danube.metadata import embedded as embedded_module
from danube.metadata.commit_groups import GroupLimits, joins_group, split_groups
from danube.metadata.embedded import LOG_FILE

# -- the rule ----------------------------------------------------------------------------------

LIMITS = st.builds(GroupLimits, st.integers(1, 8), st.integers(1, 400))
SIZES = st.lists(st.integers(0, 200), max_size=40)


@given(LIMITS, SIZES)
def test_groups_cover_the_line_in_order_and_none_is_empty(
    limits: GroupLimits, sizes: list[int]
) -> None:
    groups = split_groups(limits, sizes)
    assert sum(groups) == len(sizes)
    assert all(count >= 1 for count in groups)


@given(LIMITS, SIZES)
def test_groups_keep_their_bounds_unless_one_record_alone_exceeds_them(
    limits: GroupLimits, sizes: list[int]
) -> None:
    start = 0
    for count in split_groups(limits, sizes):
        members = sizes[start : start + count]
        assert count <= limits.max_transactions
        assert count == 1 or sum(members) <= limits.max_bytes
        start += count


@given(LIMITS, SIZES)
def test_a_group_stops_only_where_the_next_would_exceed_a_bound(
    limits: GroupLimits, sizes: list[int]
) -> None:
    start = 0
    for count in split_groups(limits, sizes):
        end = start + count
        if end < len(sizes):
            assert not joins_group(limits, count, sum(sizes[start:end]), sizes[end])
        start = end


def test_limits_must_allow_something() -> None:
    with pytest.raises(ValueError):
        GroupLimits(0, 10)


# -- the store ---------------------------------------------------------------------------------


class SlowAppend:
    """Wraps the log append: counts appends, holds each until released, and records which
    revisions were durable when, so a caller's answer can be checked against it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = embedded_module._append
        self.appends = 0
        self.records: list[list[bytes]] = []
        self.release = threading.Event()
        self.release.set()
        self.durable_bytes = 0
        monkeypatch.setattr(embedded_module, "_append", self)

    def __call__(self, files: embedded_module._Files, records: list[bytes]) -> None:
        self.release.wait()
        self.records.append(list(records))
        self.real(files, records)
        self.appends += 1
        self.durable_bytes = files.log_bytes


@pytest.mark.trio
async def test_waiting_transactions_share_one_fsync_and_are_answered_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowAppend(monkeypatch)
    async with await EmbeddedStore.open(tmp_path) as store:
        answers: list[tuple[int, int]] = []

        async def put(i: int) -> None:
            revision = await store.put(f"/k/{i}", i)
            answers.append((revision, slow.appends))

        slow.release.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(put, 0)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(1, 20):
                nursery.start_soon(put, i)
            await trio.testing.wait_all_tasks_blocked()
            slow.release.set()
        # The first put's append was under way when the other 19 arrived: they share the next.
        assert [len(group) for group in slow.records] == [1, 19]
        # Each answer came after the fsync of the group holding it (the counter is bumped
        # once an append has returned).
        assert sorted(answers) == [(1, 1)] + [(revision, 2) for revision in range(2, 21)]
    async with await EmbeddedStore.open(tmp_path) as reopened:
        assert len(await reopened.scan("/k/")) == 20


@pytest.mark.trio
async def test_reads_and_watchers_do_not_see_a_group_before_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowAppend(monkeypatch)
    async with await EmbeddedStore.open(tmp_path) as store:
        await store.put("/a", 0)
        seen: list[object] = []
        async with store.watch("/a") as events, trio.open_nursery() as nursery:
            slow.release.clear()
            nursery.start_soon(store.put, "/a", 1)
            await trio.testing.wait_all_tasks_blocked()

            async def read() -> None:
                kv = await store.get("/a")
                seen.append(None if kv is None else kv.value)
                seen.append(slow.appends)

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert seen == [], "a read waits while the change is applied but not durable"
            with trio.move_on_after(0.05):
                await anext(events)
                pytest.fail("a watcher saw a change before its fsync")
            slow.release.set()
        assert seen == [1, 2]


@pytest.mark.trio
async def test_a_failed_group_write_fails_every_member_and_shuts_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowAppend(monkeypatch)
    async with await EmbeddedStore.open(tmp_path) as store:
        errors: list[BaseException] = []

        async def put(i: int) -> None:
            try:
                await store.put(f"/k/{i}", i)
            except StoreClosed as exc:
                errors.append(exc)

        slow.release.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(put, 0)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(1, 6):
                nursery.start_soon(put, i)
            await trio.testing.wait_all_tasks_blocked()

            def failing_fsync(fd: int) -> None:
                raise OSError(5, "Input/output error")

            monkeypatch.setattr(os, "fsync", failing_fsync)
            slow.release.set()
        monkeypatch.undo()
        assert len(errors) == 6
        with pytest.raises(StoreClosed):
            await store.get("/k/0")


@pytest.mark.trio
async def test_a_crash_between_a_groups_write_and_its_fsync_recovers_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowAppend(monkeypatch)
    live = tmp_path / "live"
    async with await EmbeddedStore.open(live) as store:
        await store.put("/before", 0)
        slow.release.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.put, "/k/00", 0)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(1, 8):
                nursery.start_soon(store.put, f"/k/{i:02}", i)
            await trio.testing.wait_all_tasks_blocked()
            slow.release.set()
    monkeypatch.undo()
    assert [len(group) for group in slow.records] == [1, 1, 7]
    base = b"".join(slow.records[0] + slow.records[1])
    group = b"".join(slow.records[2])
    # Every length of the group's write that may have reached the disk before a crash.
    revisions_by_end: dict[int, int] = {}
    end = 0
    for count, record in enumerate(slow.records[2], start=1):
        end += len(record)
        revisions_by_end[end] = count
    for cut in range(0, len(group) + 1, 7):
        crashed = tmp_path / f"crash-{cut}"
        crashed.mkdir()
        (crashed / LOG_FILE).write_bytes(base + group[:cut])
        async with await EmbeddedStore.open(crashed) as reopened:
            keys = [kv.key for kv in await reopened.scan("/k/")]
        whole = max((count for end, count in revisions_by_end.items() if end <= cut), default=0)
        # The survivors are exactly the group's first `whole` records, in revision order.
        expected = [
            key
            for record in slow.records[2][:whole]
            for key in embedded_module._decode_record(record[8:])[1]
        ]
        assert keys == sorted(["/k/00", *expected])
        assert (await _revision(crashed)) == 2 + whole


async def _revision(directory: Path) -> int:
    async with await EmbeddedStore.open(directory) as store:
        return await store.put("/probe", 1) - 1
