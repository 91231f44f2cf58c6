"""A topic's WAL segment files on local disk: the real-I/O side of `danube.machines.wal`.

`SegmentFiles` performs the WAL machine's file effects (create, write, fsync, close, delete)
and its file reads; `scan` and `carry_out` turn whatever a crash left in the directory into
what a `RecoveryPlan` keeps. The production port (`danube.runtime.io_port`) calls it for the
interpreter, which orders each topic's effects and feeds completions back to the machine.
Every decision (offsets, group commit, rotation, what recovery keeps) stays in the pure
machines; blocking calls run in worker threads.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from danube.effects import EpochHistory, TopicScan
from danube.machines.wal import checkpoint as ck
from danube.machines.wal import format
from danube.machines.wal.machine import (
    CloseSegment,
    CreateSegment,
    DeleteSegment,
    Effect,
    FileRead,
    Fsync,
    Write,
    decode_file_read,
)
from danube.machines.wal.recovery import (
    LOSS_ACCEPTED_NAME,
    ForgetCheckpoint,
    PlaceSegment,
    RebaseSegment,
    RecoveryEvidence,
    RecoveryPlan,
    SyncSegment,
    TruncateSegment,
    UnreadableSegment,
    plan_recovery,
)
from danube.runtime.metrics import WalMetrics

FILE_EFFECTS = (CreateSegment, Write, Fsync, CloseSegment, DeleteSegment)

log = logging.getLogger("danube.wal")

EPOCHS_NAME = "epochs"
"""A replica's epochs file in the topic's WAL directory (`danube.effects.WriteEpochs`)."""


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _scan_file(path: Path) -> format.SegmentScan | UnreadableSegment:
    data = path.read_bytes()
    try:
        return format.scan_segment(data)
    except format.WalFormatError as error:
        return UnreadableSegment(len(data), str(error))


@dataclass(frozen=True, slots=True)
class FileOutcome:
    """What one file effect did that the metrics count."""

    synced: float | None
    """Seconds its fdatasync took, None without one."""
    appended: int
    """Bytes written."""
    rotated: bool = False
    """A segment was created after another (a rotation)."""


class SegmentFiles:
    """The segment files of one topic directory (`<wal_root>/<namespace>/<topic>/`)."""

    __slots__ = (
        "_created", "_directory", "_held", "_mark", "_metrics", "_writable_bases", "sync_writes",
    )  # fmt: skip

    def __init__(
        self, directory: Path, *, sync_writes: bool = False, metrics: WalMetrics | None = None
    ) -> None:
        self._directory = str(directory)
        """Kept as text: a `Path` costs 300 bytes more (its parts, its cached strings) in each
        of 100,000 idle topics (issue 23); made again when a file operation needs it."""
        self._metrics = metrics or WalMetrics()
        self._writable_bases: tuple[int, ...] = ()
        """Segments that may still be written (created here and not closed): one or two, so a
        tuple (48 bytes) rather than a set (216), held by every idle topic (issue 23)."""
        self._held: dict[int, int] = {}
        """segment base -> file descriptor, held only from a write until the fdatasync that
        makes it durable, so an error in between shows on the descriptor that wrote; none at
        rest (issue 23: a descriptor per idle topic ran a broker out of them at 10,000
        topics). A reopen costs one `open` per group commit, beside its fdatasync."""
        self._created = False
        """A segment was started since these files were opened: the next one is a rotation
        (the first after a start or a reload only reopens the log, whatever its offset)."""
        self.sync_writes = sync_writes
        """Every Write is fsynced in the same worker-thread call (`WalConfig.synced_writes`:
        the machine then asks for no Fsync after it)."""
        self._mark: ck.Checkpoint | None = None
        """The newest checkpoint mark in the file (read at recovery, then as written)."""

    @property
    def directory(self) -> Path:
        return Path(self._directory)

    def path(self, segment_base: int) -> Path:
        return Path(self._directory, format.segment_name(segment_base))

    def segment_bases(self) -> list[int]:
        bases = (format.segment_base(entry.name) for entry in os.scandir(self.directory))
        return sorted(base for base in bases if base is not None)

    async def recover(
        self, topic: str, acknowledged_end: int = 0, indexed_end: int = 0
    ) -> RecoveryPlan:
        """Scans every segment, reads the checkpoint and the operator's `accept-loss` file,
        plans recovery with that evidence and the core's (`acknowledged_end`, `indexed_end`;
        raising `CorruptSegment` when durable data changed or is missing) and performs the
        plan's actions (`scan`, then `carry_out`: what the interpreter's `recover` flow asks
        of the production port, composed here for tools and tests that hold no core)."""
        scan = await trio.to_thread.run_sync(self.scan)
        evidence = RecoveryEvidence(
            checkpoint_end=scan.checkpoint_end,
            acknowledged_end=acknowledged_end,
            indexed_end=indexed_end,
            loss_accepted_at=scan.loss_accepted_at,
        )
        plan = plan_recovery(topic, list(scan.segments), evidence)
        mark = plan.next_offset if plan.next_offset or scan.checkpoint_end is not None else None
        clear = scan.loss_accepted_at is not None
        await trio.to_thread.run_sync(
            self.carry_out, topic, tuple(plan.actions), mark, clear, _now_ms()
        )
        return plan

    def scan(self) -> TopicScan:
        """The directory as recovery sees it (`danube.effects.ScanTopic`): every segment's
        scan, the checkpoint's durable end, the `accept-loss` offset. Blocking."""
        self.directory.mkdir(parents=True, exist_ok=True)
        scans = tuple((base, _scan_file(self.path(base))) for base in self.segment_bases())
        self._mark = self._read_checkpoint()
        return TopicScan(
            scans,
            None if self._mark is None else self._mark.durable_end,
            self._read_loss_accepted(),
            self._read_epochs(),
        )

    def carry_out(
        self,
        topic: str,
        actions: tuple[Any, ...],
        mark: int | None,
        clear_loss_accepted: bool,
        now_ms: int,
    ) -> None:
        """A recovery plan's actions (`danube.effects.RecoverTopic`), then the recovered end
        marked in the checkpoint (the kept segments are durable now) and an `accept-loss`
        file removed. Blocking."""
        for action in actions:
            if isinstance(action, PlaceSegment):
                header = format.encode_segment_header(topic, action.segment_base, now_ms)
                os.close(self._create(CreateSegment(action.segment_base, header)))
            elif isinstance(action, ForgetCheckpoint):
                self.forget_checkpoint()
            elif isinstance(action, RebaseSegment):
                self._rebase(topic, action, now_ms)
            else:
                self._recovery_action(action)
        if mark is not None:
            self.write_checkpoint(mark)
        if clear_loss_accepted:
            log.warning(
                "event=wal_loss_accepted directory=%s continues_at=%d",
                self.directory, 0 if mark is None else mark,
            )  # fmt: skip
            self._remove_loss_accepted()

    def _read_epochs(self) -> EpochHistory | None:
        """The replication epochs file (`write_epochs`); None without one. It is replaced
        whole by a rename, so it is either the old or the new history, never torn; a file
        that does not parse (edited by hand) reads as none."""
        try:
            value = json.loads((self.directory / EPOCHS_NAME).read_text())
            starts = tuple((int(e), int(s)) for e, s in value["starts"])
            return EpochHistory(int(value["seen"]), starts)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            log.warning("event=wal_epochs_unreadable directory=%s", self.directory)
            return None

    def write_epochs(self, history: EpochHistory) -> None:
        """Replaces the epochs file durably (temporary file, fsync, rename, directory fsync).
        Blocking."""
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"seen": history.seen, "starts": [list(p) for p in history.starts]})
        temporary = self.directory / (EPOCHS_NAME + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, text.encode(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.directory / EPOCHS_NAME)
        _fsync_directory(self.directory)

    def _rebase(self, topic: str, action: RebaseSegment, now_ms: int) -> None:
        """A promoted follower's segment replaced by one starting where the object index
        ends (`recovery.plan_align`): the new file is durable before the old one goes."""
        data = self.path(action.segment_base).read_bytes()[action.position :]
        header = format.encode_segment_header(topic, action.new_base, now_ms)
        final = self.path(action.new_base)
        temporary = final.with_suffix(".tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, header + data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, final)
        _fsync_directory(self.directory)
        # A crash here leaves both files: the next load rebases the old one again, over the
        # same bytes (`plan_align` runs before recovery plans anything).
        self.path(action.segment_base).unlink()
        _fsync_directory(self.directory)

    def forget_checkpoint(self) -> None:
        """Deletes the checkpoint file (a follower's log was cut below its mark). Blocking."""
        self._mark = None
        (self.directory / ck.CHECKPOINT_NAME).unlink(missing_ok=True)
        _fsync_directory(self.directory)

    def _read_checkpoint(self) -> ck.Checkpoint | None:
        try:
            return ck.decode_checkpoint((self.directory / ck.CHECKPOINT_NAME).read_bytes())
        except FileNotFoundError:
            return None

    def _read_loss_accepted(self) -> int | None:
        """The offset in the operator's `accept-loss` file (0 when empty), None without one;
        an unreadable number counts as 0 (the evidence still decides)."""
        try:
            text = (self.directory / LOSS_ACCEPTED_NAME).read_text(errors="replace").strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isascii() and text.isdigit() else 0

    def _remove_loss_accepted(self) -> None:
        (self.directory / LOSS_ACCEPTED_NAME).unlink(missing_ok=True)
        _fsync_directory(self.directory)

    def write_checkpoint(self, durable_end: int) -> bool:
        """Marks `durable_end` durably in the checkpoint's other slot (one pwrite, one
        fdatasync; the directory is fsynced once, when the file is created: with the first
        segment, see `_create`, or here when a mark comes first). Skips a mark that says no
        more than the last: returns whether it wrote."""
        if durable_end <= (0 if self._mark is None else self._mark.durable_end):
            return False
        mark = ck.next_mark(self._mark, durable_end)
        path = self.directory / ck.CHECKPOINT_NAME
        created = self._mark is None and not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not kept open: see `_held`
        try:
            _write_all(fd, ck.encode_checkpoint(mark), mark.position)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_directory(self.directory)
        self._mark = mark
        return True

    def _recovery_action(self, action: TruncateSegment | SyncSegment | DeleteSegment) -> None:
        path = self.path(action.segment_base)
        if isinstance(action, DeleteSegment):
            path.unlink(missing_ok=True)
            _fsync_directory(self.directory)
            return
        fd = os.open(path, os.O_RDWR)
        try:
            if isinstance(action, TruncateSegment):
                os.ftruncate(fd, action.size)
            os.fsync(fd)
        finally:
            os.close(fd)

    async def perform(self, effect: Effect) -> None:
        """Carries out one file effect in a worker thread; raises `OSError` when the disk
        refuses. (The broker's port runs `carry` in its WAL writer threads instead.)"""
        self.note(await trio.to_thread.run_sync(self.carry, effect))

    def carry(self, effect: Effect) -> FileOutcome:
        """Carries out one file effect, blocking; raises `OSError` when the disk refuses.
        Returns what the metrics count, for `note` to add on the thread that owns them."""
        if isinstance(effect, Write):
            fd = self._writable(effect.segment_base)
            if self.sync_writes:
                synced = _write_synced(fd, effect.data, effect.position)
                self._release(effect.segment_base)
                return FileOutcome(synced, len(effect.data))
            _write_all(fd, effect.data, effect.position)
            return FileOutcome(None, len(effect.data))
        if isinstance(effect, Fsync):
            synced = _timed_fdatasync(self._writable(effect.segment_base))
            self._release(effect.segment_base)
            return FileOutcome(synced, 0)
        if isinstance(effect, CreateSegment):
            os.close(self._create(effect))  # header durable: nothing to hold
            if effect.base_offset not in self._writable_bases:
                self._writable_bases = (*self._writable_bases, effect.base_offset)
            rotated, self._created = self._created, True
            return FileOutcome(None, 0, rotated)
        if isinstance(effect, (CloseSegment, DeleteSegment)):
            self._writable_bases = tuple(
                base for base in self._writable_bases if base != effect.segment_base
            )
            self._release(effect.segment_base)
            if isinstance(effect, DeleteSegment):
                self._recovery_action(effect)
            return FileOutcome(None, 0)
        raise TypeError(f"{type(effect).__name__} is not a file effect")

    def note(self, outcome: FileOutcome) -> None:
        """Adds a file effect's outcome to the WAL metrics (on the loop: one writer)."""
        metrics = self._metrics
        if outcome.synced is not None:
            metrics.flushed(outcome.synced)
        metrics.append_bytes += outcome.appended
        if outcome.rotated:
            metrics.rotations += 1

    def _writable(self, segment_base: int) -> int:
        """The segment's descriptor: the one held since its last unsynced write, or a new one."""
        fd = self._held.get(segment_base)
        if fd is not None:
            return fd
        if segment_base not in self._writable_bases:
            raise OSError(
                errno.EBADF,
                f"segment {format.segment_name(segment_base)} is not open (creating it failed)",
            )
        fd = self._held[segment_base] = os.open(self.path(segment_base), os.O_RDWR)
        return fd

    def _release(self, segment_base: int) -> None:
        fd = self._held.pop(segment_base, None)
        if fd is not None:
            os.close(fd)
            if not self._held:  # an emptied dict keeps its table (160 bytes); a new one has none
                self._held = {}

    def _create(self, effect: CreateSegment) -> int:
        """Header into a temporary file, fsync, rename over the segment name, fsync the
        directory (the contract of `CreateSegment`): a crash leaves either no segment or one
        with its whole header, and the rename replaces a frameless file recovery kept.

        A topic's first segment also creates its checkpoint file, empty (no valid slot: read
        as no mark, as when the file is missing), before that directory fsync, so the first
        mark is a pwrite and an fdatasync with no directory fsync of its own (issue 23: one
        directory fsync per new topic fewer)."""
        final = self.path(effect.base_offset)
        temporary = final.with_suffix(".tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, effect.header, 0)
            os.fsync(fd)
            os.rename(temporary, final)
            if self._mark is None:
                # O_CREAT without O_TRUNC: a checkpoint already there is kept as it is.
                os.close(
                    os.open(self.directory / ck.CHECKPOINT_NAME, os.O_WRONLY | os.O_CREAT, 0o644)
                )
            _fsync_directory(self.directory)
        except BaseException:
            os.close(fd)
            raise
        return fd

    async def truncate(self, segment_base: int, size: int) -> None:
        """Cuts a segment to `size` bytes, durably (the repair after `Failed`)."""
        self.close()
        action = TruncateSegment(segment_base, size)
        await trio.to_thread.run_sync(self._recovery_action, action)

    def read_bytes(self, segment_base: int, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [`start`, `end`) of a segment (to its end when `end` is None); raises
        `FileNotFoundError` when the segment is gone. Blocking."""
        with open(self.path(segment_base), "rb") as file:
            file.seek(start)
            return file.read() if end is None else file.read(end - start)

    def remove(self) -> None:
        """Closes the files and deletes the directory with everything in it. Blocking."""
        self.close()
        if self.directory.exists():
            shutil.rmtree(self.directory)

    def reset(self) -> None:
        """`remove`, then the directory made again, empty (`RemoveTopicFiles(recreate=True)`:
        a fresh topic's load, whose scan is then known without reading). Blocking."""
        self.remove()
        self._mark = None
        self.directory.mkdir(parents=True, exist_ok=True)

    async def read(self, plan: FileRead) -> tuple[bytes, ...]:
        """The records a `FileRead` asked for, verified frame by frame."""

        data = await trio.to_thread.run_sync(
            self.read_bytes, plan.segment_base, plan.start, plan.end
        )
        return decode_file_read(plan, data)

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held = {}
        self._writable_bases = ()


def _timed_fdatasync(fd: int) -> float:
    """Seconds the fdatasync took: the WAL's durability cost, for the metrics."""
    started = time.perf_counter()
    os.fdatasync(fd)
    return time.perf_counter() - started


def _write_synced(fd: int, data: bytes, position: int) -> float:
    """Writes, then fdatasyncs; returns the fdatasync's seconds."""
    _write_all(fd, data, position)
    return _timed_fdatasync(fd)


def _write_all(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        if written == 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[written:]
        position += written
