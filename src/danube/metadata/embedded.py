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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from danube.metadata.memory import MemoryStore
from danube.metadata.model import KeyValue, MetadataCorrupted, MetadataError, StoreClosed
from danube.metadata.state import MetadataState, PreparedTxn

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


class EmbeddedStore(MemoryStore):
    """MemoryStore whose every durable change is fsync'ed to the log before it is applied.

    Logging happens between prepare and commit, so no reader or watcher ever sees a change
    that a crash could take back. If a log write fails the store shuts itself (later calls
    raise StoreClosed): whether the record reached the disk is unknown, and only reopening,
    which rereads the log, can tell.
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
    ) -> None:
        """Use `EmbeddedStore.open`; this only adopts already opened and replayed files."""
        super().__init__(clock, watch_buffer=watch_buffer, state=state)
        self._files: _Files | None = files
        self._compact_bytes = compact_bytes
        self._compact_records = compact_records

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
        )

    async def aclose(self) -> None:
        # Shielded: a cancelled owner must not leave the directory locked until it exits.
        with trio.CancelScope(shield=True):
            await super().aclose()
            files, self._files = self._files, None
            if files is not None:
                # Closing the lock file releases the flock for the next process.
                await trio.to_thread.run_sync(_close_files, files)

    async def _persist(self, prepared: PreparedTxn) -> None:
        if not prepared.durable_changes:
            return
        files = self._files
        assert files is not None, "the store is open, so its files are"
        record = _encode_record(prepared.result.revision, prepared.durable_changes)
        try:
            if files.log_bytes > self._compact_bytes or files.log_records > self._compact_records:
                # The state does not include this transaction yet, so the snapshot and the
                # emptied log are consistent; the record then starts the new log.
                await trio.to_thread.run_sync(_compact, files, self._state.snapshot())
            await trio.to_thread.run_sync(_append, files, record)
        except OSError as exc:
            reason = f"writing metadata to {files.directory} failed: {exc}"
            self._shut(reason, StoreClosed(reason))
            raise StoreClosed(reason) from exc


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


def _append(files: _Files, record: bytes) -> None:
    _write_all(files.log_fd, record)
    os.fsync(files.log_fd)
    files.log_bytes += len(record)
    files.log_records += 1


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
