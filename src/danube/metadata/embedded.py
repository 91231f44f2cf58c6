"""The durable single-node metadata store of standalone mode: a MemoryStore plus a write-ahead
log and snapshots in one directory.

Layout of the directory:

* `LOCK` — held with flock while a process has the store open, so two brokers never
  interleave writes to one log.
* `metadata.snapshot` — the durable state (`MetadataState.snapshot`) as JSON, replaced
  atomically (temp file, fsync, rename, fsync of the directory).
* `metadata.log` — records appended after the snapshot, each
  `[u32 LE body length][u32 LE zlib.crc32(body)][body]`, the body being compact JSON
  `{"revision": r, "ops": [...]}` where an op is
  `{"op": "put", "key", "value", "create_revision", "version"}` or `{"op": "delete", "key"}`.
  Ops carry the key's resulting metadata rather than the request, so replay reproduces the
  versions and revisions callers saw, including for keys that were lease-bound for a while.

Transactions that arrive while the log is being written wait in line; the next append writes
all of them (as many as `commit_groups.joins_group` lets share it) with one write and one
fsync, and none is answered, watched or read before that fsync returns: while a group is
between its commit to the state and its fsync, reads wait for it (group commit; a crash in
between leaves a prefix of the group's records, which replay keeps).

Only durable keys are logged: lease-bound keys must not outlive the process holding their lease
(see `MetadataState.snapshot`). Transactions that only touched such keys are not logged at all,
so after a restart the revision counter resumes from the last durable revision and may reuse
numbers that only ephemeral changes had taken; every watcher that saw those numbers died with
the previous process.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from danube.metadata.commit_groups import GroupLimits, joins_group
from danube.metadata.memory import MemoryStore
from danube.metadata.model import (
    Compare,
    KeyValue,
    MetadataCorrupted,
    MetadataError,
    Op,
    StoreClosed,
    TxnResult,
    WatchEvent,
)
from danube.metadata.state import MetadataState

logger = logging.getLogger("danube.metadata")

LOCK_FILE = "LOCK"
LOG_FILE = "metadata.log"
SNAPSHOT_FILE = "metadata.snapshot"
_SNAPSHOT_TMP = SNAPSHOT_FILE + ".tmp"
_HEADER = struct.Struct("<II")


@dataclass(slots=True)
class _Files:
    directory: Path
    lock_fd: int
    log_fd: int
    log_bytes: int
    log_records: int


@dataclass(slots=True, eq=False)
class _Waiting:
    """A transaction in line for a group commit, and how its caller learns the outcome."""

    compares: Sequence[Compare]
    success: Sequence[Op]
    failure: Sequence[Op]
    wake: trio.Event = field(default_factory=trio.Event)
    # Set by the leader handing the next group to this transaction's caller.
    lead: bool = False
    finished: bool = False
    result: TxnResult | None = None
    error: BaseException | None = None

    def finish(self, result: TxnResult | None, error: BaseException | None) -> None:
        self.result, self.error, self.finished = result, error, True
        self.wake.set()


class EmbeddedStore(MemoryStore):
    """MemoryStore whose every durable change is fsync'ed to the log before anyone sees it.

    Transactions are applied to the state in revision order by one leader at a time, in groups
    that share one append and one fsync (see the module docstring); readers wait while a group
    is applied but not yet durable, so no reader or watcher ever sees a change that a crash
    could take back, and no caller is answered before the fsync covering its transaction. If a
    log write fails the store shuts itself (later calls raise StoreClosed): whether the records
    reached the disk is unknown, and only reopening, which rereads the log, can tell.
    """

    def __init__(
        self,
        files: _Files,
        state: MetadataState,
        *,
        clock: Callable[[], float],
        watch_buffer: int,
        compact_bytes: int,
        compact_records: int,
        group_limits: GroupLimits,
    ) -> None:
        """Use `EmbeddedStore.open`; this only adopts already opened and replayed files."""
        super().__init__(clock, watch_buffer=watch_buffer, state=state)
        self._files: _Files | None = files
        self._compact_bytes = compact_bytes
        self._compact_records = compact_records
        self._group_limits = group_limits
        self._line: deque[_Waiting] = deque()
        self._leading = False
        # Set while a group is applied to the state but not yet durable; reads wait for it.
        self._unsettled: trio.Event | None = None
        self._reads_waiting = 0

    @classmethod
    async def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = trio.current_time,
        watch_buffer: int = 1024,
        history_limit: int = 10_000,
        compact_bytes: int = 4 * 1024 * 1024,
        compact_records: int = 10_000,
        group_limits: GroupLimits | None = None,
    ) -> EmbeddedStore:
        """Locks the directory (creating it if needed), loads the snapshot and replays the log.

        Raises MetadataError if another process has the directory open and MetadataCorrupted
        if the files cannot be trusted.
        """
        files, state = await trio.to_thread.run_sync(_load, Path(directory), history_limit)
        return cls(
            files,
            state,
            clock=clock,
            watch_buffer=watch_buffer,
            compact_bytes=compact_bytes,
            compact_records=compact_records,
            group_limits=GroupLimits() if group_limits is None else group_limits,
        )

    async def aclose(self) -> None:
        # Shielded: a cancelled owner must not leave the directory locked until it exits.
        with trio.CancelScope(shield=True):
            await super().aclose()
            files, self._files = self._files, None
            if files is not None:
                # Closing the lock file releases the flock for the next process.
                await trio.to_thread.run_sync(_close_files, files)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._ensure_open()
        waiting = _Waiting(compares, success, failure)
        self._line.append(waiting)
        if not self._leading:
            self._leading = waiting.lead = True
        while not waiting.finished:
            if waiting.lead:
                # A leader finishes its group whatever happens to its own caller: the others
                # in it wait for the answer.
                with trio.CancelScope(shield=True):
                    await self._lead()
                continue
            try:
                await waiting.wake.wait()
            except trio.Cancelled:
                if waiting.lead:
                    with trio.CancelScope(shield=True):
                        await self._lead()
                elif not waiting.finished and waiting in self._line:
                    # Not taken into a group yet: it never happens.
                    self._line.remove(waiting)
                # Otherwise it is in a group being made durable; the caller, cancelled, does
                # not learn the outcome (as with a cancelled etcd call).
                raise
        if waiting.error is not None:
            raise waiting.error
        assert waiting.result is not None
        return waiting.result

    async def _lead(self) -> None:
        """Commits one group from the front of the line, then hands the lead to the next."""
        try:
            async with self._write_lock:
                # Reads that waited on the previous group read its state before this one moves
                # it on (they are runnable already, so this ends).
                while self._reads_waiting:
                    await trio.lowlevel.checkpoint()
                await self._commit_group()
        finally:
            if self._line:
                following = self._line[0]
                following.lead = True
                following.wake.set()
            else:
                self._leading = False

    async def _commit_group(self) -> None:
        if self._closed_reason is not None:
            error = StoreClosed(self._closed_reason)
            while self._line:
                self._line.popleft().finish(None, error)
            return
        files = self._files
        assert files is not None, "the store is open, so its files are"
        if files.log_bytes > self._compact_bytes or files.log_records > self._compact_records:
            # Every applied transaction is durable here, so the snapshot and the emptied log
            # are consistent; this group's records then start the new log.
            try:
                await trio.to_thread.run_sync(_compact, files, self._state.snapshot())
            except OSError as exc:
                self._fail_writes(files, exc, [])
                return
        settled = self._unsettled = trio.Event()
        group: list[tuple[_Waiting, TxnResult]] = []
        records: list[bytes] = []
        group_bytes = 0
        events: list[WatchEvent] = list(self._state.expire(self._clock()))
        try:
            while self._line:
                waiting = self._line[0]
                try:
                    prepared = self._state.prepare(
                        waiting.compares, waiting.success, waiting.failure
                    )
                except Exception as exc:  # the caller's mistake (ValueError, LeaseNotFound)
                    self._line.popleft().finish(None, exc)
                    continue
                record = (
                    _encode_record(prepared.result.revision, prepared.durable_changes)
                    if prepared.durable_changes
                    else b""
                )
                if not joins_group(self._group_limits, len(group), group_bytes, len(record)):
                    break
                self._line.popleft()
                events.extend(self._state.commit(prepared))
                group.append((waiting, prepared.result))
                if record:
                    records.append(record)
                    group_bytes += len(record)
            if records:
                try:
                    await trio.to_thread.run_sync(_append, files, records)
                except OSError as exc:
                    self._fail_writes(files, exc, [waiting for waiting, _ in group])
                    return
            self._publish(events)
            for waiting, result in group:
                waiting.finish(result, None)
        finally:
            self._unsettled = None
            settled.set()

    def _fail_writes(self, files: _Files, exc: OSError, group: list[_Waiting]) -> None:
        reason = f"writing metadata to {files.directory} failed: {exc}"
        error = StoreClosed(reason)
        self._shut(reason, error)
        for waiting in group:
            waiting.finish(None, error)
        while self._line:
            self._line.popleft().finish(None, error)

    async def _begin_read(self) -> None:
        await trio.lowlevel.checkpoint()
        while self._unsettled is not None:
            self._reads_waiting += 1
            try:
                await self._unsettled.wait()
            finally:
                self._reads_waiting -= 1
        self._ensure_open()
        if not self._write_lock.locked():
            self._expire_leases()


# -- file work (runs in worker threads) --------------------------------------------------------


def _load(directory: Path, history_limit: int) -> tuple[_Files, MetadataState]:
    directory.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(lock_fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise MetadataError(
                f"another broker (pid {holder}) is using the data directory {directory} "
                f"(it holds {directory / LOCK_FILE}); stop it or choose another data directory"
            ) from None
        # For the operator who finds the directory locked; the flock is what protects it.
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
        state = MetadataState(history_limit)
        (directory / _SNAPSHOT_TMP).unlink(missing_ok=True)
        snapshot_path = directory / SNAPSHOT_FILE
        if snapshot_path.exists():
            _restore_snapshot(state, snapshot_path)
        log_path = directory / LOG_FILE
        log_fd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            data = log_path.read_bytes()
            valid_end, records = _replay_log(state, data, log_path)
            if valid_end < len(data):
                logger.warning(
                    "metadata log %s ends with an incomplete record at byte offset %d "
                    "(%d bytes, an interrupted write); truncating it",
                    log_path,
                    valid_end,
                    len(data) - valid_end,
                )
                os.ftruncate(log_fd, valid_end)
                os.fsync(log_fd)
            # The log (and the LOCK) may have just been created; make their entries durable.
            _fsync_directory(directory)
        except BaseException:
            os.close(log_fd)
            raise
    except BaseException:
        os.close(lock_fd)
        raise
    return _Files(directory, lock_fd, log_fd, valid_end, records), state


def _restore_snapshot(state: MetadataState, path: Path) -> None:
    try:
        snapshot = json.loads(path.read_bytes())
        if not isinstance(snapshot, dict):
            raise ValueError("the top level is not an object")
        state.restore(snapshot)
    except ValueError as exc:
        # The snapshot is only ever replaced atomically, so a bad one is damage, not a crash.
        raise MetadataCorrupted(f"{path} is not a valid metadata snapshot: {exc}") from exc


def _replay_log(state: MetadataState, data: bytes, path: Path) -> tuple[int, int]:
    """Applies every whole record; returns where the valid log ends and how many records it has.

    Only the tail may be damaged by a crash (an append that did not finish, or zeros a file
    system left behind). Damage followed by more data means the log itself is broken.
    """
    view = memoryview(data)
    offset = 0
    records = 0
    previous_revision = 0
    while offset < len(data):
        if len(data) - offset < _HEADER.size:
            break
        length, crc = _HEADER.unpack_from(data, offset)
        body_start = offset + _HEADER.size
        end = body_start + length
        # Records are never empty, so a zero header can only be the start of a zeroed tail.
        if end > len(data) or (length == 0 and not any(view[offset:])):
            break
        body = data[body_start:end]
        if zlib.crc32(body) != crc:
            if not any(view[end:]):
                break
            raise MetadataCorrupted(
                f"{path}: record at byte offset {offset} fails its CRC check and is followed by "
                f"{len(data) - end} more bytes; the metadata log is corrupted"
            )
        try:
            revision, changes = _decode_record(body)
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataCorrupted(
                f"{path}: record at byte offset {offset} is malformed: {exc}"
            ) from exc
        if revision <= previous_revision:
            raise MetadataCorrupted(
                f"{path}: record at byte offset {offset} has revision {revision}, "
                f"not after the previous record's {previous_revision}"
            )
        previous_revision = revision
        # Records at or below the snapshot's revision are left over from a compaction that
        # crashed after writing the snapshot but before emptying the log.
        if revision > state.revision:
            state.replay(revision, changes)
        records += 1
        offset = end
    return offset, records


def _encode_record(revision: int, changes: Mapping[str, KeyValue | None]) -> bytes:
    ops: list[dict[str, Any]] = [
        {"op": "delete", "key": key}
        if kv is None
        else {
            "op": "put",
            "key": key,
            "value": kv.value,
            "create_revision": kv.create_revision,
            "version": kv.version,
        }
        for key, kv in changes.items()
    ]
    body = json.dumps({"revision": revision, "ops": ops}, separators=(",", ":")).encode()
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def _decode_record(body: bytes) -> tuple[int, dict[str, KeyValue | None]]:
    record = json.loads(body)
    revision = record["revision"]
    if not isinstance(revision, int) or revision < 1:
        raise ValueError(f"bad revision {revision!r}")
    changes: dict[str, KeyValue | None] = {}
    for op in record["ops"]:
        key = op["key"]
        if not isinstance(key, str):
            raise ValueError(f"bad key {key!r}")
        if op["op"] == "delete":
            changes[key] = None
        elif op["op"] == "put":
            create, version = op["create_revision"], op["version"]
            if not (isinstance(create, int) and isinstance(version, int)):
                raise ValueError(f"bad revisions for key {key!r}")
            changes[key] = KeyValue(key, op["value"], create, revision, version, None)
        else:
            raise ValueError(f"unknown op {op['op']!r}")
    return revision, changes


def _append(files: _Files, records: list[bytes]) -> None:
    """One write and one fsync for a group's records, whole records in revision order, so a
    crash in between leaves a prefix that replay keeps (and a torn last record it drops)."""
    data = b"".join(records)
    _write_all(files.log_fd, data)
    os.fsync(files.log_fd)
    files.log_bytes += len(data)
    files.log_records += len(records)


def _compact(files: _Files, snapshot: dict[str, Any]) -> None:
    tmp = files.directory / _SNAPSHOT_TMP
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, json.dumps(snapshot, separators=(",", ":")).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, files.directory / SNAPSHOT_FILE)
    _fsync_directory(files.directory)
    # From here a crash leaves the new snapshot with the old log, whose records the snapshot
    # already covers and replay skips.
    os.ftruncate(files.log_fd, 0)
    os.fsync(files.log_fd)
    files.log_bytes = 0
    files.log_records = 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _close_files(files: _Files) -> None:
    os.close(files.log_fd)
    os.close(files.lock_fd)
