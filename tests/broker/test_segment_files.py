"""The WAL machine driven against real files: appends reach the disk, survive reopening,
and recovery truncates torn tails and refuses corruption (spec/wal-format.md)."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from danube.machines.wal import format
from danube.machines.wal.machine import (
    Acknowledge,
    CachedRecords,
    Effect,
    FileRead,
    Fsync,
    WalConfig,
    WalMachine,
    Write,
)
from danube.machines.wal.recovery import CorruptSegment, TruncateSegment
from danube.runtime.metrics import WalMetrics
from danube.runtime.segment_files import FILE_EFFECTS, SegmentFiles

TOPIC = "/default/wal"


def _now() -> int:
    return time.time_ns() // 1_000_000


class Log:
    """A WAL on real files, with the machine's completions wired back: its file effects run
    one at a time, in order (what the interpreter's per-topic lane does in the broker)."""

    def __init__(self, machine: WalMachine, files: SegmentFiles) -> None:
        self.machine = machine
        self.files = files
        self.acknowledged = -1
        self.performed: list[type] = []
        self.changed = trio.Event()
        self._queue: deque[Effect] = deque()
        self._wakeup = trio.Event()

    def submit(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, FILE_EFFECTS):
                self._queue.append(effect)
            else:
                self._emit(effect)
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._queue:
                effect = self._queue.popleft()
                try:
                    await self.files.perform(effect)
                    error = None
                except OSError as failure:
                    error = failure
                self.submit(self._complete(effect, error))

    def _complete(self, effect: Effect, error: OSError | None) -> list[Effect]:
        self.performed.append(type(effect))
        if isinstance(effect, Write):
            if error is not None:
                return self.machine.write_failed(effect.write_id, str(error))
            return self.machine.write_done(effect.write_id, _now())
        if isinstance(effect, Fsync):
            if error is not None:
                return self.machine.fsync_failed(effect.fsync_id, str(error))
            return self.machine.fsync_done(effect.fsync_id, _now())
        assert error is None, error
        return []

    def _emit(self, effect: Effect) -> None:
        if isinstance(effect, Acknowledge):
            self.acknowledged = max(self.acknowledged, effect.through_offset)
            self.changed.set()
            self.changed = trio.Event()

    def append(self, records: list[bytes]) -> int:
        first, effects = self.machine.append(records, _now())
        self.submit(effects)
        return first + len(records) - 1

    async def acknowledged_through(self, offset: int) -> None:
        with trio.fail_after(10):
            while self.acknowledged < offset:
                await self.changed.wait()

    async def read_all(self) -> list[bytes]:
        records: list[bytes] = []
        offset = self.machine.first_offset
        while offset < self.machine.readable_offset:
            result = self.machine.read(offset, 1000, 1 << 20)
            if isinstance(result, CachedRecords):
                got = list(result.records)
            else:
                assert isinstance(result, FileRead)
                got = list(await self.files.read(result))
            assert got, f"no progress reading at {offset}"
            records.extend(got)
            offset += len(got)
        return records


async def open_log(
    directory: Path,
    config: WalConfig,
    run: Callable[..., object],
    *,
    sync_writes: bool = False,
    metrics: WalMetrics | None = None,
) -> Log:
    files = SegmentFiles(directory, sync_writes=sync_writes, metrics=metrics)
    plan = await files.recover(TOPIC)
    log = Log(WalMachine(TOPIC, config, plan), files)
    run(log.run)
    return log


def _record(n: int) -> bytes:
    return f"record-{n}".encode() * (1 + n % 7)


@pytest.mark.trio
async def test_appends_are_acknowledged_durable_and_survive_reopening(tmp_path: Path) -> None:
    config = WalConfig(segment_bytes=4096, cache_bytes=0)
    async with trio.open_nursery() as nursery:
        log = await open_log(tmp_path, config, nursery.start_soon)
        last = -1
        for n in range(0, 300, 3):
            last = log.append([_record(n), _record(n + 1), _record(n + 2)])
        await log.acknowledged_through(last)
        assert last == 299
        # One write cycle at a time: appends that queued behind an fsync shared the next one.
        assert log.performed.count(Fsync) < 100
        assert len(list(tmp_path.glob("*.wal"))) > 1, "4 KiB segments must have rotated"
        assert await log.read_all() == [_record(n) for n in range(300)]
        nursery.cancel_scope.cancel()
    log.files.close()

    async with trio.open_nursery() as nursery:
        reopened = await open_log(tmp_path, config, nursery.start_soon)
        assert reopened.machine.next_offset == 300, "offsets continue after a restart"
        assert await reopened.read_all() == [_record(n) for n in range(300)]
        reopened.append([b"after-restart"])
        await reopened.acknowledged_through(300)
        nursery.cancel_scope.cancel()
    reopened.files.close()


async def _write_segments(directory: Path, frames: int) -> list[Path]:
    async with trio.open_nursery() as nursery:
        log = await open_log(directory, WalConfig(segment_bytes=2048), nursery.start_soon)
        for n in range(frames):
            log.append([_record(n)])
        await log.acknowledged_through(frames - 1)
        nursery.cancel_scope.cancel()
    log.files.close()
    return sorted(directory.glob("*.wal"))


@pytest.mark.trio
async def test_a_torn_tail_is_truncated_and_offsets_continue(tmp_path: Path) -> None:
    segments = await _write_segments(tmp_path, 40)
    newest = segments[-1]
    whole = newest.stat().st_size
    with open(newest, "r+b") as file:
        file.truncate(whole - 5)  # the last frame loses its end, as in a crash mid-write
    files = SegmentFiles(tmp_path)
    plan = await files.recover(TOPIC)
    assert any(isinstance(action, TruncateSegment) for action in plan.actions)
    assert plan.next_offset == 39, "only the torn last frame is dropped"
    assert newest.stat().st_size < whole - 5
    assert format.scan_segment(newest.read_bytes()).state is format.SegmentState.WHOLE


@pytest.mark.trio
async def test_corruption_in_the_middle_stops_the_topic_with_an_actionable_error(
    tmp_path: Path,
) -> None:
    segments = await _write_segments(tmp_path, 40)
    damaged = segments[0]
    data = bytearray(damaged.read_bytes())
    header = format.decode_segment_header(data).length
    data[header + 40] ^= 0x01  # inside the first frame's records: durable data changed
    damaged.write_bytes(bytes(data))
    before = {path.name: path.read_bytes() for path in segments}
    with pytest.raises(CorruptSegment) as raised:
        await SegmentFiles(tmp_path).recover(TOPIC)
    message = str(raised.value)
    assert damaged.name in message
    assert f"byte {header}" in message
    assert {path.name: path.read_bytes() for path in segments} == before, "nothing touched"


@pytest.mark.trio
async def test_a_segment_cut_short_while_being_created_is_replaced(tmp_path: Path) -> None:
    """The process died inside CreateSegment: the newest file has half a header. Recovery
    keeps the offsets, and the next append's segment replaces the stub."""
    await _write_segments(tmp_path, 40)
    stub = tmp_path / format.segment_name(40)
    stub.write_bytes(format.encode_segment_header(TOPIC, 40, 0)[:10])
    async with trio.open_nursery() as nursery:
        log = await open_log(tmp_path, WalConfig(segment_bytes=2048), nursery.start_soon)
        assert log.machine.next_offset == 40
        assert log.append([b"after"]) == 40
        await log.acknowledged_through(40)
        nursery.cancel_scope.cancel()
    log.files.close()
    assert format.scan_segment(stub.read_bytes()).next_offset == 41


@pytest.mark.trio
@pytest.mark.parametrize("synced_writes", [False, True])
async def test_each_acknowledged_group_commit_was_synced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synced_writes: bool
) -> None:
    """With `synced_writes` a write and its fdatasync are one worker-thread call and the
    machine asks for no Fsync; without, an Fsync follows every write. Either way every
    acknowledged append was covered by exactly one fdatasync of its segment."""
    synced: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    config = WalConfig(synced_writes=synced_writes)
    async with trio.open_nursery() as nursery:
        log = await open_log(tmp_path, config, nursery.start_soon, sync_writes=synced_writes)
        first = len(synced)
        for n in range(5):
            await log.acknowledged_through(log.append([_record(n)]))
        assert len(synced) - first == 5
        assert log.performed.count(Write) == 5
        assert log.performed.count(Fsync) == (0 if synced_writes else 5)
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_rotations_count_segments_started_after_the_first_of_a_run(tmp_path: Path) -> None:
    """Reopening a log starts a segment at a nonzero offset: that is no rotation."""
    config = WalConfig(segment_bytes=4096, cache_bytes=0)
    first = WalMetrics()
    async with trio.open_nursery() as nursery:
        log = await open_log(tmp_path, config, nursery.start_soon, metrics=first)
        last = -1
        for n in range(0, 300, 3):
            last = log.append([_record(n), _record(n + 1), _record(n + 2)])
        await log.acknowledged_through(last)
        nursery.cancel_scope.cancel()
    log.files.close()
    segments = len(list(tmp_path.glob("*.wal")))
    assert segments > 1 and first.rotations == segments - 1
    again = WalMetrics()
    async with trio.open_nursery() as nursery:
        log = await open_log(tmp_path, config, nursery.start_soon, metrics=again)
        await log.acknowledged_through(log.append([_record(300)]))
        nursery.cancel_scope.cancel()
    log.files.close()
    assert len(list(tmp_path.glob("*.wal"))) == segments + 1, "the reopened log starts one"
    assert again.rotations == 0


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.trio
@pytest.mark.parametrize("sync_writes", [False, True])
async def test_an_idle_log_holds_no_file_descriptor(tmp_path: Path, sync_writes: bool) -> None:
    """Issue 23: a descriptor per idle topic (its segment's and its checkpoint's) ran a broker
    with 10,000 topics out of them. Once its appends are durable a log holds none."""
    async with trio.open_nursery() as nursery:
        before = _open_descriptors()
        logs = []
        for index in range(20):
            directory = tmp_path / f"t{index}"
            directory.mkdir()
            log = await open_log(
                directory, WalConfig(segment_bytes=4096), nursery.start_soon,
                sync_writes=sync_writes,
            )  # fmt: skip
            last = log.append([_record(n) for n in range(5)])
            await log.acknowledged_through(last)
            await trio.to_thread.run_sync(log.files.write_checkpoint, last + 1)
            logs.append(log)
        assert _open_descriptors() - before < 5  # trio's own, not twenty logs' worth
        for log in logs:
            assert await log.read_all() == [_record(n) for n in range(5)]
        nursery.cancel_scope.cancel()
