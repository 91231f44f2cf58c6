"""What the embedded store adds to MemoryStore: the log, snapshots, recovery and the lock."""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path

import pytest
import trio

from danube.metadata import (
    Delete,
    EmbeddedStore,
    KeyValue,
    MetadataCorrupted,
    MetadataError,
    MetadataState,
    Put,
    StoreClosed,
)
from danube.metadata.embedded import LOG_FILE, SNAPSHOT_FILE
from tests.metadata.fakes import FakeClock

pytestmark = pytest.mark.trio


def record_offsets(log: Path) -> list[int]:
    """Start offset of every record in a log, read from the length prefixes."""
    data = log.read_bytes()
    offsets, offset = [], 0
    while offset < len(data):
        offsets.append(offset)
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 8 + length
    return offsets


async def write_keys(directory: Path, count: int) -> None:
    async with await EmbeddedStore.open(directory) as store:
        for i in range(count):
            await store.put(f"/k/{i}", {"n": i})


async def test_reopen_keeps_data_and_continues_revisions(tmp_path: Path) -> None:
    async with await EmbeddedStore.open(tmp_path) as store:
        await store.put("/a", 1)
        await store.put("/a", [2])
        await store.txn([], [Put("/b", "b"), Put("/c", "c")])
        await store.delete("/c")
        before = await store.scan("")
    async with await EmbeddedStore.open(tmp_path) as store:
        assert await store.scan("") == before
        assert before[0] == KeyValue("/a", [2], 1, 2, 2, None)
        assert await store.put("/d", 1) == 5
        async with store.watch("/", start_revision=0) as events:
            assert (await anext(events)).mod_revision == 1, "replayed records are watchable"
    assert len(record_offsets(tmp_path / LOG_FILE)) == 5, "one record per transaction"


async def test_lease_bound_keys_do_not_survive(tmp_path: Path) -> None:
    clock = FakeClock()
    async with await EmbeddedStore.open(tmp_path, clock=clock) as store:
        lease = await store.grant_lease(10)
        await store.put("/durable", 1)
        await store.put("/overwritten", "durable")
        size = (tmp_path / LOG_FILE).stat().st_size
        await store.put("/eph", 1, lease=lease)
        await store.delete("/eph")
        assert (tmp_path / LOG_FILE).stat().st_size == size, "ephemeral keys are not logged"
        await store.put("/overwritten", "ephemeral", lease=lease)
        await store.put("/eph", 2, lease=lease)
        assert await store.put("/durable", 2) == 7
    async with await EmbeddedStore.open(tmp_path, clock=clock) as store:
        assert await store.scan("") == [KeyValue("/durable", 2, 1, 7, 2, None)]
        assert await store.put("/next", 1) == 8


async def test_torn_tail_is_truncated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    await write_keys(tmp_path, 3)
    log = tmp_path / LOG_FILE
    last = record_offsets(log)[-1]
    os.truncate(log, log.stat().st_size - 3)
    with caplog.at_level(logging.WARNING, logger="danube.metadata"):
        store = await EmbeddedStore.open(tmp_path)
    async with store:
        assert [kv.key for kv in await store.scan("")] == ["/k/0", "/k/1"]
        assert log.stat().st_size == last
        assert await store.put("/k/2", "again") == 3
    assert f"byte offset {last}" in caplog.text
    async with await EmbeddedStore.open(tmp_path) as store:
        assert (await store.get("/k/2")) == KeyValue("/k/2", "again", 3, 3, 1, None)


@pytest.mark.parametrize("tail", [b"\x05\x00\x00", b"\x00" * 40])
async def test_short_header_or_zeroed_tail_is_truncated(tmp_path: Path, tail: bytes) -> None:
    await write_keys(tmp_path, 2)
    log = tmp_path / LOG_FILE
    size = log.stat().st_size
    with log.open("ab") as f:
        f.write(tail)
    async with await EmbeddedStore.open(tmp_path) as store:
        assert len(await store.scan("")) == 2
    assert log.stat().st_size == size


async def test_bad_crc_on_the_last_record_is_a_torn_write(tmp_path: Path) -> None:
    await write_keys(tmp_path, 3)
    log = tmp_path / LOG_FILE
    data = bytearray(log.read_bytes())
    data[-2] ^= 0xFF
    log.write_bytes(bytes(data))
    async with await EmbeddedStore.open(tmp_path) as store:
        assert len(await store.scan("")) == 2


async def test_bad_crc_in_the_middle_is_corruption(tmp_path: Path) -> None:
    await write_keys(tmp_path, 3)
    log = tmp_path / LOG_FILE
    second = record_offsets(log)[1]
    data = bytearray(log.read_bytes())
    data[second + 12] ^= 0xFF
    log.write_bytes(bytes(data))
    with pytest.raises(MetadataCorrupted, match=rf"metadata\.log: record at byte offset {second}"):
        await EmbeddedStore.open(tmp_path)
    assert log.read_bytes() == bytes(data), "nothing was truncated"
    # The failed open released the lock: the operator can inspect and retry.
    with pytest.raises(MetadataCorrupted):
        await EmbeddedStore.open(tmp_path)


async def test_corrupt_snapshot_is_reported(tmp_path: Path) -> None:
    (tmp_path / SNAPSHOT_FILE).write_text('{"format": 1, "revision": "x", "entries": []}')
    with pytest.raises(MetadataCorrupted, match=r"metadata\.snapshot"):
        await EmbeddedStore.open(tmp_path)


async def test_compaction_keeps_everything(tmp_path: Path) -> None:
    async with await EmbeddedStore.open(tmp_path, compact_records=3) as store:
        for i in range(10):
            await store.put(f"/k/{i % 4}", i)
        await store.delete("/k/0")
        assert len(record_offsets(tmp_path / LOG_FILE)) < 4
        before = await store.scan("")
    assert (tmp_path / SNAPSHOT_FILE).exists()
    async with await EmbeddedStore.open(tmp_path, compact_records=3) as store:
        assert await store.scan("") == before
        assert await store.put("/k/9", 0) == 12
    async with await EmbeddedStore.open(tmp_path, compact_bytes=0) as store:
        await store.put("/k/10", 0)
        assert len(record_offsets(tmp_path / LOG_FILE)) == 1
    async with await EmbeddedStore.open(tmp_path) as store:
        assert len(await store.scan("")) == 5


async def test_crash_between_snapshot_and_log_reset_is_harmless(tmp_path: Path) -> None:
    await write_keys(tmp_path, 4)
    # The snapshot a compaction after the third write would have taken, with the log untouched.
    reference = MetadataState()
    for i in range(3):
        reference.put(f"/k/{i}", {"n": i})
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps(reference.snapshot()))
    async with await EmbeddedStore.open(tmp_path) as store:
        assert [kv.value for kv in await store.scan("")] == [{"n": i} for i in range(4)]
        assert await store.put("/k/0", "x") == 5


async def test_second_open_fails_while_the_first_is_open(tmp_path: Path) -> None:
    first = await EmbeddedStore.open(tmp_path)
    with pytest.raises(
        MetadataError, match=rf"another broker \(pid {os.getpid()}\) is using the data directory"
    ):
        await EmbeddedStore.open(tmp_path)
    with trio.CancelScope() as scope:
        scope.cancel()
        await first.aclose()  # even when cancelled, closing releases the directory
    second = await EmbeddedStore.open(tmp_path)
    await second.aclose()


async def test_failed_log_write_shuts_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/a", 1)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    async with store.watch("/") as events:
        monkeypatch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(StoreClosed, match="Input/output error"):
            await store.txn([], [Put("/b", 1), Delete("/a")])
        monkeypatch.undo()
        with pytest.raises(StoreClosed):
            await anext(events)
    with pytest.raises(StoreClosed):
        await store.get("/a")
    await store.aclose()
    async with await EmbeddedStore.open(tmp_path) as reopened:
        keys = [kv.key for kv in await reopened.scan("")]
        assert keys in (["/a"], ["/b"]), "the record is either wholly there or wholly absent"
