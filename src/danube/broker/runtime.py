"""Executes the core's effects inside the broker process.

gRPC handlers run on the asyncio loop that trio-asyncio hosts; they call the core synchronously
(one thread, so no locks) and hand the resulting effects here. Metadata changes are written by
one writer in the order the core produced them, and a reply waits until every change produced
before it is durable: no client is ever told about state a crash could forget. A reliable
publish's reply also waits for the WAL acknowledgement that covers its offset.

WAL work (recovery, each topic's ordered file effects, subscription file reads) runs in trio
tasks; their completions go back into the core, and its effects come back here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio_asyncio

from danube.broker.metrics import BrokerMetrics
from danube.broker.object_store import ObjectStore, classify, delete_topic_objects
from danube.broker.segment_files import SegmentFiles, WalExecutor
from danube.cluster.ownership import NotOwner, fence_compares
from danube.core.errors import DanubeError, ErrorCode
from danube.core.names import parse_topic
from danube.dispatch import ConsumerReady
from danube.metadata import MetadataStore
from danube.node.core import (
    BrokerCore,
    DropWal,
    Effect,
    EndStream,
    LoadWal,
    PersistMeta,
    PublishAcked,
    PublishFailed,
    ReadObject,
    ReadWal,
    RepairWal,
    RetentionSkipped,
    Step,
    TierHalted,
    TierIo,
    TopicStopped,
    WalIo,
)
from danube.tiering import (
    CommitIndex,
    ListObjects,
    StoredObject,
    UploadSegment,
    decode_object_read,
    describe_object,
)
from danube.wal import machine as wal
from danube.wal.format import WalFormatError
from danube.wal.recovery import CorruptSegment

log = logging.getLogger("danube.broker")

T = TypeVar("T")

MAX_REMEMBERED_FAILURES = 1024
"""A reply checks the failures of its own writes; older ones are of no one's interest."""


@dataclass(slots=True)
class StreamSlot:
    """The live receive stream of one consumer, as its writer sees it."""

    generation: int
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False


async def persist(
    store: MetadataStore, effect: PersistMeta, claims: Mapping[str, int] | None = None
) -> None:
    result = await store.txn(fence_compares(effect.keys, claims), effect.ops())
    if not result.succeeded:
        raise NotOwner("this broker's claim on the topic is gone")


def now_ms() -> int:
    """The clock the core and its machines get: wall-clock milliseconds (written into WAL
    frames as publish time; dispatch timers tolerate steps, see dispatch/reliable.py)."""
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class TopicWal:
    """The driver side of one reliable topic's WAL."""

    files: SegmentFiles
    executor: WalExecutor
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    stopped: trio.Event = field(default_factory=trio.Event)
    lock: trio.Lock = field(default_factory=trio.Lock)
    """Orders loads, repairs, drops and checkpoint writes of the topic's directory."""
    checkpoint_target: int = 0
    """The durable end the checkpoint should mark (`BrokerCore.wal_durable_end`)."""
    checkpoint_wakeup: trio.Event = field(default_factory=trio.Event)
    checkpoint_cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    checkpoint_stopped: trio.Event = field(default_factory=trio.Event)


CHECKPOINT_INTERVAL_SECONDS = 0.01
"""Least time between two checkpoint writes of one topic (spec/wal-format.md, "Remaining
window"): bounds the extra fdatasyncs a busy topic costs, at the price of a mark that trails
the acknowledgements by up to this much more."""
CHECKPOINT_THREADS = 4
"""Checkpoint writes at once, in threads of their own: with many busy topics they queue
(and coalesce) there instead of taking the threads that segment writes and fsyncs, which
acknowledgements wait for, run in."""


class BrokerRuntime:
    def __init__(
        self,
        core: BrokerCore,
        store: MetadataStore,
        wal_root: Path,
        nursery: trio.Nursery,
        loop: asyncio.AbstractEventLoop,
        objects: ObjectStore | None = None,
        *,
        metrics: BrokerMetrics,
        clustered: bool = False,
    ) -> None:
        self.core = core
        self.metrics = metrics
        self.claims: dict[str, int] | None = {} if clustered else None
        """Cluster mode: topic -> revision of this broker's ownership claim, the fencing
        token of every metadata write for the topic (kept by the ownership driver)."""
        self._loop = loop
        self.objects = objects
        """The object tier (None without one); the admin's cluster DeleteTopic uses it too."""
        self._store = store
        self._wal_root = wal_root
        self._nursery = nursery
        self._wals: dict[str, TopicWal] = {}
        self._checkpoint_threads = trio.CapacityLimiter(CHECKPOINT_THREADS)
        self._drops: dict[str, trio.Event] = {}
        """Topics whose deleted WAL directory is being removed: a new load waits for it."""
        self._loads: dict[str, trio.Event] = {}
        """Topics whose WAL is being loaded: replies that created them wait for it."""
        self._acked: dict[str, int] = {}
        self._publishes: dict[str, collections.deque[tuple[int, asyncio.Future[None]]]] = {}
        self._slots: dict[int, StreamSlot] = {}
        """Open streams by generation: an old stream stays addressable after a takeover."""
        self._current: dict[int, int] = {}
        """consumer id -> generation of its newest stream (where its messages go)."""
        self._pending: collections.deque[PersistMeta] = collections.deque()
        self._submitted = 0
        self._durable = 0
        self._writer_wakeup = asyncio.Event()
        self._progress = asyncio.Event()
        self._write_failures: dict[int, str] = {}
        """Sequence number -> why that metadata write failed (the newest few)."""
        self._closed = False
        """Set once shutdown stopped the WAL executors: later completions are dropped (their
        tasks' nursery is closing) and recovery redoes whatever they would have done."""
        self.fenced: str | None = None
        """Cluster mode: why this broker may not acknowledge publishes now (its membership
        is not renewed in time), else None."""
        self.stopping = False
        """Set at shutdown: new receive streams are refused so that clients which reopen
        their stream at once (the official ones do) cannot keep the broker from stopping."""

    async def run(self, step: Step[T]) -> T:
        """Executes the step's effects and returns its value once its metadata is durable
        and the WALs of the reliable topics it created are loaded."""
        await self.start(step)
        return step.value

    def start(self, step: Step[Any]) -> Awaitable[None]:
        """`run`, split for callers that must keep the core's order between steps: the
        effects start now, before the caller's next await; the result waits for the rest."""
        first = self._submitted + 1
        target = self.apply(step.effects)
        return self._settled(first, target, step.effects)

    async def _settled(self, first: int, target: int, effects: tuple[Effect, ...]) -> None:
        while self._durable < target:
            await self._progress.wait()
        for sequence in range(first, target + 1):
            failure = self._write_failures.get(sequence)
            if failure is not None:
                raise DanubeError(
                    ErrorCode.UNAVAILABLE,
                    f"the broker could not persist metadata ({failure}); retry later",
                )
        for effect in effects:
            if isinstance(effect, LoadWal):
                loading = self._loads.get(effect.topic)
                if loading is not None:
                    await trio_asyncio.trio_as_aio(loading.wait)()

    async def pace(self, topic: str, count: int) -> None:
        """Holds `count` messages of `topic` as long as its `max_publish_rate` asks
        (`BrokerCore.publish_pace`): the caller's reply, and so its producer, waits."""
        delay_ms = self.core.publish_pace(topic, count, now_ms())
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)

    async def publish(self, topic: str, step: Step[int]) -> int:
        """Runs a reliable publish's step; returns its offset once the WAL acknowledged it
        at the topic's durability level."""
        await self.start_publish(topic, step, step.value)
        return step.value

    def start_publish(self, topic: str, step: Step[int], through: int) -> Awaitable[None]:
        """`publish`, split as `start` splits `run`, for a step that appended offsets up to
        `through` (a batch): done once the WAL acknowledged all of them."""
        # Registered before any effect runs, so no acknowledgement can slip past it.
        waiter: asyncio.Future[None] | None = None
        if self._acked.get(topic, -1) < through:
            waiter = asyncio.get_running_loop().create_future()
            self._publishes.setdefault(topic, collections.deque()).append((through, waiter))
        return self._acknowledged(self.start(step), waiter)

    async def _acknowledged(
        self, settled: Awaitable[None], waiter: asyncio.Future[None] | None
    ) -> None:
        await settled
        if waiter is not None:
            await waiter
        self.check_unfenced()

    def check_unfenced(self) -> None:
        """A fenced broker (cluster mode) acknowledges nothing: another broker may own the
        topic by now (spec/cluster.md, "Ownership fencing", rule 1)."""
        if self.fenced is not None:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"this broker is fenced ({self.fenced}); look the topic up and send again",
            )

    def apply(self, effects: tuple[Effect, ...] | list[Effect]) -> int:
        """Starts every effect; returns the metadata sequence number a reply must wait for."""
        for effect in effects:
            if isinstance(effect, WalIo):
                self._wals[effect.topic].executor.submit(effect.effects)
            elif isinstance(effect, PublishAcked):
                self._acknowledge(effect.topic, effect.through_offset)
            elif isinstance(effect, ReadWal):
                self._nursery.start_soon(self._read_wal, effect)
            elif isinstance(effect, ReadObject):
                self._nursery.start_soon(self._read_object, effect)
            elif isinstance(effect, TierIo):
                self._nursery.start_soon(self._tier_io, effect)
            elif isinstance(effect, TierHalted):
                log.error(
                    "event=tier_halted topic=%s resumable=%s reason=%r",
                    effect.topic, effect.resumable, effect.reason,
                )  # fmt: skip
            elif isinstance(effect, (LoadWal, RepairWal, DropWal)):
                self._start_wal_task(effect)
            elif isinstance(effect, PublishFailed):
                log.error(
                    "event=wal_failed topic=%s from_offset=%d reason=%r",
                    effect.topic, effect.from_offset, effect.reason,
                )  # fmt: skip
                self._fail_publishes(effect.topic, effect.from_offset, effect.reason)
            elif isinstance(effect, TopicStopped):
                log.error("event=topic_stopped topic=%s reason=%r", effect.topic, effect.reason)
                self._fail_publishes(effect.topic, 0, f"topic stopped: {effect.reason}")
            elif isinstance(effect, RetentionSkipped):
                log.warning(
                    "event=retention_skipped topic=%s subscription=%s first=%d end=%d",
                    effect.topic, effect.subscription, effect.first, effect.end,
                )  # fmt: skip
            elif isinstance(effect, ConsumerReady):
                generation = self._current.get(effect.consumer_id)
                slot = self._slots.get(generation) if generation is not None else None
                if slot is not None:
                    slot.wakeup.set()
            elif isinstance(effect, EndStream):
                slot = self._slots.get(effect.generation)
                if slot is not None:
                    slot.ended = True
                    slot.wakeup.set()
            else:
                self._pending.append(effect)
                self._submitted += 1
                self._writer_wakeup.set()
        return self._submitted

    # -- reliable topics ----------------------------------------------------------------------

    def _acknowledge(self, topic: str, through: int) -> None:
        previous = self._acked.get(topic)
        if previous is not None and through > previous:
            # the records this group commit made durable (unknown for a topic's first one)
            self.metrics.wal.group_commit.observe(through - previous)
        self._acked[topic] = through if previous is None else max(previous, through)
        waiting = self._publishes.get(topic)
        while waiting and waiting[0][0] <= through:
            _, waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _fail_publishes(self, topic: str, from_offset: int, reason: str) -> None:
        self._acked[topic] = min(self._acked.get(topic, -1), from_offset - 1)
        waiting = self._publishes.get(topic)
        while waiting and waiting[-1][0] >= from_offset:
            _, waiter = waiting.pop()
            if not waiter.done():
                waiter.set_exception(
                    DanubeError(
                        ErrorCode.UNAVAILABLE,
                        f"{reason}; the message is not acknowledged, send it again",
                    )
                )

    def _topic_dir(self, topic: str) -> Path:
        name = parse_topic(topic)
        return self._wal_root / name.namespace / name.local

    def _start_wal_task(self, effect: LoadWal | RepairWal | DropWal) -> None:
        topic = effect.topic
        if isinstance(effect, LoadWal):
            self._loads[topic] = trio.Event()
        if isinstance(effect, DropWal):
            self._fail_publishes(topic, 0, effect.reason)
            self._acked.pop(topic, None)
            dropped = self._wals.pop(topic, None)
            if dropped is not None:
                done = self._drops[topic] = trio.Event()
                self._nursery.start_soon(self._drop_wal, effect, dropped, done)
            return
        topic_wal = self._wals.get(topic)
        if topic_wal is None:
            sync_writes = self.core.wal_syncs_every_write(topic)
            files = SegmentFiles(
                self._topic_dir(topic), sync_writes=sync_writes, metrics=self.metrics.wal
            )
            executor = WalExecutor(files, self._completion(topic), self._unexpected)
            topic_wal = self._wals[topic] = TopicWal(files, executor)
            self._nursery.start_soon(self._run_executor, topic_wal)
            self._nursery.start_soon(self._run_checkpoints, topic, topic_wal)
        self._nursery.start_soon(self._wal_task, effect, topic_wal)

    async def _run_executor(self, topic_wal: TopicWal) -> None:
        try:
            with topic_wal.cancel:
                await topic_wal.executor.run()
        finally:
            topic_wal.stopped.set()

    async def _run_checkpoints(self, topic: str, topic_wal: TopicWal) -> None:
        """Marks the topic's durable end in its WAL checkpoint as fsyncs complete, beside the
        executor rather than in its queue: no acknowledgement waits for a checkpoint write.
        Coalescing: marks that arrive during a write are covered by the next one. The mark
        trails the acknowledgements by about one fdatasync; a last frame damaged in that
        window reads as a torn tail (spec/wal-format.md "Reading and recovery")."""
        try:
            with topic_wal.checkpoint_cancel:
                while True:
                    await topic_wal.checkpoint_wakeup.wait()
                    topic_wal.checkpoint_wakeup = trio.Event()
                    async with topic_wal.lock:
                        await self._write_checkpoint(topic, topic_wal)
                    # Marks arriving meanwhile are covered by the next write: a busy topic
                    # costs at most one checkpoint fdatasync per interval.
                    await trio.sleep(CHECKPOINT_INTERVAL_SECONDS)
        finally:
            topic_wal.checkpoint_stopped.set()

    async def _write_checkpoint(self, topic: str, topic_wal: TopicWal) -> None:
        try:
            await trio.to_thread.run_sync(
                topic_wal.files.write_checkpoint,
                topic_wal.checkpoint_target,
                limiter=self._checkpoint_threads,
            )
        except OSError as error:
            # The mark only lags (weaker evidence); the next fsync tries again.
            log.error("event=wal_checkpoint_failed topic=%s error=%r", topic, error)

    def _durable_moved(self, topic: str) -> None:
        """After a WAL completion: wakes the checkpoint writer when the durable end grew."""
        topic_wal = self._wals.get(topic)
        end = self.core.wal_durable_end(topic)
        if topic_wal is not None and end is not None and end > topic_wal.checkpoint_target:
            topic_wal.checkpoint_target = end
            topic_wal.checkpoint_wakeup.set()

    @staticmethod
    async def _stop_executor(topic_wal: TopicWal) -> None:
        """Cancels the executor and the checkpoint writer; an effect under way in a thread
        finishes first, and only then are the files closed."""
        topic_wal.cancel.cancel()
        topic_wal.checkpoint_cancel.cancel()
        await topic_wal.stopped.wait()
        await topic_wal.checkpoint_stopped.wait()
        topic_wal.files.close()

    async def _drop_wal(self, effect: DropWal, topic_wal: TopicWal, done: trio.Event) -> None:
        topic = effect.topic
        try:
            async with topic_wal.lock:
                await self._stop_executor(topic_wal)
                if effect.delete_files:
                    await trio.to_thread.run_sync(_remove_tree, topic_wal.files.directory)
                if effect.delete_objects and self.objects is not None:
                    # Before the drop completes: a topic created again under the name
                    # uploads only after its predecessor's objects are gone.
                    await delete_topic_objects(self.objects, topic)
                log.info("event=wal_dropped topic=%s deleted=%s", topic, effect.delete_files)
        finally:
            done.set()
            if self._drops.get(topic) is done:
                del self._drops[topic]

    async def _wal_task(self, effect: LoadWal | RepairWal, topic_wal: TopicWal) -> None:
        topic = effect.topic
        dropping = self._drops.get(topic)
        if dropping is not None:  # the topic was deleted and created again
            await dropping.wait()
        async with topic_wal.lock:
            try:
                if isinstance(effect, RepairWal):
                    topic_wal.executor.discard()
                    await topic_wal.executor.idle()
                    await topic_wal.files.truncate(effect.segment_base, effect.truncate_to)
                elif effect.fresh:
                    topic_wal.files.close()
                    await trio.to_thread.run_sync(_remove_tree, topic_wal.files.directory)
                started = time.monotonic()
                acknowledged_end, indexed_end = self.core.recovery_evidence(topic)
                plan = await topic_wal.files.recover(topic, acknowledged_end, indexed_end)
                topic_wal.checkpoint_target = plan.next_offset
            except CorruptSegment as error:
                self._in_loop(self.core.wal_load_failed, topic, str(error))
            except OSError as error:
                reason = f"the WAL directory {topic_wal.files.directory} failed: {error}"
                self._in_loop(self.core.wal_load_failed, topic, reason)
            else:
                log.info(
                    "event=wal_loaded topic=%s segments=%d next_offset=%d seconds=%.3f",
                    topic, len(plan.segments), plan.next_offset, time.monotonic() - started,
                )  # fmt: skip
                self._in_loop(self.core.wal_loaded, topic, plan, now_ms=now_ms())
            finally:
                loading = self._loads.pop(topic, None)
                if loading is not None:
                    # after the core heard of the load (the loop runs callbacks in order)
                    self._loop.call_soon_threadsafe(loading.set)

    def _in_loop(self, call: Callable[..., Step[Any]], *args: Any, **kwargs: Any) -> None:
        """Calls the core from a trio task: on the asyncio loop, where the handlers call it
        too, so every core call and the execution of its effects keep one order. (Effects
        applied straight from trio would not wake the loop's waiters promptly either.)"""

        def run() -> None:
            if not self._closed:
                self.apply(call(*args, **kwargs).effects)

        self._loop.call_soon_threadsafe(run)

    async def wal_loads_done(self) -> None:
        """Waits until every WAL load started so far has finished (broker start)."""
        while self._loads:
            await next(iter(self._loads.values())).wait()

    def _completion(self, topic: str) -> Callable[[wal.Effect, OSError | None], list[wal.Effect]]:
        def complete(effect: wal.Effect, error: OSError | None) -> list[wal.Effect]:
            reason = None if error is None else f"{type(error).__name__}: {error}"

            def run() -> None:
                if not self._closed:
                    self.apply(
                        self.core.wal_io_done(topic, effect, reason, now_ms=now_ms()).effects
                    )
                    self._durable_moved(topic)

            self._loop.call_soon_threadsafe(run)
            return []

        return complete

    @staticmethod
    def _unexpected(effect: wal.Effect) -> None:
        raise AssertionError(f"the core passes only file effects to executors, not {effect}")

    async def _read_wal(self, read: ReadWal) -> None:
        topic_wal = self._wals.get(read.topic)
        if topic_wal is None:
            return
        try:
            records = await topic_wal.files.read(read.plan)
        except FileNotFoundError as error:
            self._in_loop(
                self.core.wal_read_failed, read, str(error), missing=True, now_ms=now_ms()
            )
        except (OSError, WalFormatError) as error:
            reason = f"reading {topic_wal.files.directory} failed: {error}"
            self._in_loop(self.core.wal_read_failed, read, reason, missing=False, now_ms=now_ms())
        else:
            self._in_loop(self.core.wal_read_done, read, records, now_ms=now_ms())

    # -- object tier ------------------------------------------------------------------------------

    async def _read_object(self, read: ReadObject) -> None:
        """History for a subscription. Store errors are retried for as long as they last
        (backoff capped at 5 s): a stopped topic is for data that is wrong, not for a store
        that is down for a while. Only bytes that do not verify stop the topic."""
        assert self.objects is not None
        plan, delay, attempt = read.plan, 0.2, 0
        while not self._closed and read.topic in self._wals:
            attempt += 1
            try:
                data = await trio.to_thread.run_sync(
                    self.objects.get_range, plan.key, plan.start_byte, plan.end_byte
                )
                records = decode_object_read(plan, data)
            except WalFormatError as error:
                reason = f"object {plan.key} does not verify: {error}"
                self._in_loop(
                    self.core.wal_read_failed, read, reason, missing=False, now_ms=now_ms()
                )
                return
            except Exception as error:  # the store's errors vary by backend
                if attempt <= 5 or attempt % 20 == 0:
                    log.warning(
                        "event=object_read_failed topic=%s key=%s attempt=%d error=%r",
                        read.topic, plan.key, attempt, error,
                    )  # fmt: skip
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                self._in_loop(self.core.wal_read_done, read, records, now_ms=now_ms())
                return

    async def _tier_io(self, io: TierIo) -> None:
        assert self.objects is not None
        effect, topic = io.effect, io.topic
        if isinstance(effect, UploadSegment):
            await self._upload(io, effect)
        elif isinstance(effect, CommitIndex):
            await self._commit(io, effect)
        elif isinstance(effect, ListObjects):
            try:
                listed = await trio.to_thread.run_sync(self.objects.list, effect.prefix)
            except Exception as error:  # an empty listing: the next scan tries again
                log.warning("event=object_list_failed topic=%s error=%r", topic, error)
                listed = []
            objects = [StoredObject(key, modified) for key, modified in listed]
            self._in_loop(self.core.tier_objects_listed, io, objects, now_ms=now_ms())
        else:
            try:
                await trio.to_thread.run_sync(self.objects.delete, effect.key)
                log.info("event=orphan_deleted topic=%s key=%s", topic, effect.key)
            except Exception as error:  # the next scan tries again
                log.warning("event=orphan_delete_failed key=%s error=%r", effect.key, error)

    async def _upload(self, io: TierIo, effect: UploadSegment) -> None:
        topic = io.topic
        assert self.objects is not None
        objects = self.objects
        topic_wal = self._wals.get(topic)
        path = topic_wal.files.path(effect.segment_base) if topic_wal else None

        def upload() -> tuple[int, int, tuple[tuple[int, int], ...]]:
            if path is None:
                raise FileNotFoundError(f"{topic} has no WAL directory on this broker")
            data = path.read_bytes()
            facts = describe_object(
                data, effect.segment_base, effect.next_offset, effect.index_interval_bytes
            )
            objects.put(effect.key, data)
            return facts.size, facts.crc32c, tuple(facts.offset_index)

        started = time.monotonic()
        try:
            size, crc, index = await trio.to_thread.run_sync(upload)
        except Exception as error:  # classified: throttled, transient or fatal
            kind = classify(error)
            log.warning(
                "event=upload_failed topic=%s key=%s kind=%s error=%r",
                topic, effect.key, kind.value, error,
            )  # fmt: skip
            reason = f"{type(error).__name__}: {error}"
            self._in_loop(self.core.tier_upload_failed, io, kind, reason, now_ms=now_ms())
            return
        log.info(
            "event=segment_uploaded topic=%s key=%s bytes=%d seconds=%.3f",
            topic, effect.key, size, time.monotonic() - started,
        )  # fmt: skip
        self._in_loop(self.core.tier_upload_done, io, size, crc, index, now_ms=now_ms())

    async def _commit(self, io: TierIo, effect: CommitIndex) -> None:
        topic = io.topic
        try:
            compares, ops = effect.creation()
            fence = fence_compares([effect.path], self.claims)
            result = await self._store.txn([*compares, *fence], ops)
            if result.succeeded:
                self._in_loop(self.core.tier_index_committed, io, now_ms=now_ms())
                return
            existing = await self._store.get(effect.path)
        except Exception as error:  # outcome unknown: the machine retries
            log.warning("event=index_commit_failed topic=%s error=%r", topic, error)
            self._in_loop(self.core.tier_commit_failed, io, now_ms=now_ms())
            return
        value = None if existing is None else existing.value
        self._in_loop(self.core.tier_index_read, io, value, now_ms=now_ms())

    async def tick(self, period: float) -> None:
        """Time-driven work of the core (WAL flushes and rotation, dispatch timers)."""
        while True:
            await trio.sleep(period)
            self._in_loop(self.core.tick, now_ms())

    async def quiesce(self, timeout: float, upload_timeout: float = 0.0) -> None:
        """Graceful stop: cursors persisted, WALs sealed and idle (or `timeout` passed), and,
        with an object tier, the sealed tails uploaded and indexed (or `upload_timeout`
        passed), so a broker that loses its disk later loses nothing that was stored."""
        applied = trio.Event()

        def quiesce() -> None:
            self.apply(self.core.quiesce(now_ms()).effects)
            applied.set()

        self._loop.call_soon_threadsafe(quiesce)
        await applied.wait()
        with trio.move_on_after(timeout):
            while self.core.wal_busy():
                await trio.sleep(0.01)
        with trio.move_on_after(upload_timeout):
            while self.core.tier_busy():
                await trio.sleep(0.05)
        for topic, topic_wal in list(self._wals.items()):
            # The last marks, so that a restart can tell damage from a torn tail.
            end = self.core.wal_durable_end(topic)
            if end is not None and end > topic_wal.checkpoint_target:
                topic_wal.checkpoint_target = end
            async with topic_wal.lock:
                await self._write_checkpoint(topic, topic_wal)
        self._closed = True
        for topic_wal in list(self._wals.values()):
            await self._stop_executor(topic_wal)

    # -- streams --------------------------------------------------------------------------------

    def attach_stream(self, consumer_id: int, generation: int) -> StreamSlot:
        slot = StreamSlot(generation)
        self._slots[generation] = slot
        self._current[consumer_id] = generation
        return slot

    def detach_stream(self, consumer_id: int, slot: StreamSlot) -> None:
        self._slots.pop(slot.generation, None)
        if self._current.get(consumer_id) == slot.generation:
            del self._current[consumer_id]

    @property
    def open_streams(self) -> int:
        return len(self._slots)

    async def flush_metadata(self) -> None:
        """Waits until every metadata change submitted so far is durable (shutdown)."""
        while self._durable < self._submitted:
            await self._progress.wait()

    async def write_metadata(self) -> None:
        """The single metadata writer (an asyncio task for the broker's lifetime)."""
        while True:
            await self._writer_wakeup.wait()
            self._writer_wakeup.clear()
            while self._pending:
                effect = self._pending.popleft()
                try:
                    await trio_asyncio.trio_as_aio(persist)(self._store, effect, self.claims)
                except Exception as error:
                    failure = f"{type(error).__name__}: {error}"
                    self._write_failures[self._durable + 1] = failure
                    if len(self._write_failures) > MAX_REMEMBERED_FAILURES:
                        del self._write_failures[min(self._write_failures)]
                    log.error("event=metadata_write_failed error=%r", failure)
                self._durable += 1
                progress, self._progress = self._progress, asyncio.Event()
                progress.set()


def _remove_tree(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
