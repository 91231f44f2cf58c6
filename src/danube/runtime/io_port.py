"""The production port of the effect interpreter (`danube.interpreter.Host`): real disks,
the metadata store, the object store and the clock, inside the broker process.

A topic's WAL file effects (`TopicFile`: write, fdatasync, create, close and delete a
segment), the publish's hot path, never leave the asyncio loop but for one hand-off to a
long-lived WAL writer thread (`danube.runtime.wal_writer`), whose answers come back in
batches; checkpoint marks (`MarkDurable`) go the same way to writer threads of their own,
and `Sleep` is a timer on the loop. Every other `danube.effects` value is carried out in a
trio task of the broker's nursery, its blocking calls in worker threads: the rest of a
topic's directory through `SegmentFiles`, objects through `ObjectStore`, metadata through
`store_port.perform_store` (fenced by the broker's ownership claims in cluster mode), `Work`
with `trio.to_thread`, and, in cluster mode, replication's sends, answers and questions to
other brokers through the `ReplicationPort` (runtime/replication_port.py). The answer goes
back to the interpreter on the asyncio loop, where the gRPC handlers call the core: every
core call, and so every interpreter call, happens on that one loop, in one order.

The port decides nothing (spec/effects.md): the order of a topic's file effects, retries,
what a failure means and the tables of waiting replies are the interpreter's. What it adds is
what only production knows: where a topic's directory is, which of the object store's own
errors mean "slow down", how a log line is written, which metrics an answer feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from danube.effects import (
    CloseTopicFiles,
    IoEffect,
    MarkDurable,
    ObjectDelete,
    ObjectFailure,
    ObjectGet,
    ObjectList,
    ObjectPut,
    ObjectStoreFailed,
    ReadTopicFile,
    RecoverTopic,
    RemoveTopicFiles,
    ScanTopic,
    Sleep,
    TopicFile,
    TruncateTopicFile,
    Work,
    WriteEpochs,
)
from danube.interpreter.host import Done
from danube.machines.node.effects import ForwardDeadLetter
from danube.machines.tiering import UploadError
from danube.metadata import MetadataStore
from danube.runtime.dead_letter_forward import DeadLetterForward
from danube.runtime.memory_return import MemoryReturner
from danube.runtime.metrics import BrokerMetrics
from danube.runtime.object_store import ObjectStore
from danube.runtime.object_store import classify as classify_store_error
from danube.runtime.replication_port import PORT_EFFECTS as REPLICA_EFFECTS
from danube.runtime.replication_port import ReplicationPort
from danube.runtime.segment_files import FileOutcome, SegmentFiles
from danube.runtime.store_port import STORE_EFFECTS, perform_store
from danube.runtime.wal_writer import WalWriters
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic

log = logging.getLogger("danube.runtime")

WAL_WRITER_THREADS = 4
"""Writer threads for the topics' WAL file effects (a topic always uses the same one): a
single thread would put every topic's fdatasync in one line; a topic's own effects are one
at a time anyway (the interpreter's lane)."""

CHECKPOINT_THREADS = 2
"""Writer threads for checkpoint marks, apart from the WAL writers: with many busy topics
the marks queue there instead of in front of the segment writes and fsyncs that
acknowledgements wait for."""

TOPIC_EFFECTS = (
    TopicFile,
    ReadTopicFile,
    ScanTopic,
    RecoverTopic,
    TruncateTopicFile,
    MarkDurable,
    WriteEpochs,
    RemoveTopicFiles,
    CloseTopicFiles,
)


def now_ms() -> int:
    """The clock the core and its machines get: wall-clock milliseconds (written into WAL
    frames as publish time; dispatch timers tolerate steps, see dispatch/reliable.py)."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """The clock that times waits (a publish waiting for room in the publish pool): never
    steps, unlike `now_ms`, which NTP or an operator may set back or forward."""
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class StreamSlot:
    """The live receive stream of one consumer, as its writer sees it."""

    generation: int
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False


@dataclass(slots=True)
class Streams:
    """Open receive streams: where `ConsumerReady` and `EndStream` go."""

    slots: dict[int, StreamSlot] = field(default_factory=dict)
    """Open streams by generation: an old stream stays addressable after a takeover."""
    current: dict[int, int] = field(default_factory=dict)
    """consumer id -> generation of its newest stream (where its messages go)."""

    def attach(self, consumer_id: int, generation: int) -> StreamSlot:
        slot = StreamSlot(generation)
        self.slots[generation] = slot
        self.current[consumer_id] = generation
        return slot

    def detach(self, consumer_id: int, slot: StreamSlot) -> None:
        self.slots.pop(slot.generation, None)
        if self.current.get(consumer_id) == slot.generation:
            del self.current[consumer_id]


# -- log lines --------------------------------------------------------------------------------

_LEVELS: dict[str, int] = {
    "wal_failed": logging.ERROR,
    "topic_stopped": logging.ERROR,
    "tier_halted": logging.ERROR,
    "wal_load_failed": logging.ERROR,
    "wal_io_failed": logging.ERROR,
    "wal_checkpoint_failed": logging.ERROR,
    "metadata_write_failed": logging.ERROR,
    "wal_drop_failed": logging.ERROR,
    "retention_skipped": logging.WARNING,
    "policy_dropped": logging.WARNING,
    "dead_lettered": logging.WARNING,
    "dead_letter_failed": logging.WARNING,
    "object_read_failed": logging.WARNING,
    "upload_failed": logging.WARNING,
    "orphan_delete_failed": logging.WARNING,
    "objects_not_deleted": logging.WARNING,
    "index_commit_unresolved": logging.INFO,
    "wal_loaded": logging.INFO,
    "wal_dropped": logging.INFO,
    "segment_uploaded": logging.INFO,
    "orphan_deleted": logging.INFO,
}
"""The level of each event's log line; the rest (`acknowledged`, `object_read`, `upload`,
…: one per message or per request) are DEBUG."""

_RENAMED = {"publish_failed": "wal_failed", "topic_objects_left": "objects_not_deleted"}
"""Events whose log lines kept the names operators grep for since before the interpreter."""


def _field(value: Any) -> str:
    """`topic=/default/t` plain; text with spaces or quotes and exceptions as `repr` (the
    old `%r` fields: `reason='…'`, `error=OSError(…)`)."""
    if isinstance(value, str):
        if value and not any(c.isspace() or c in "'\"=" for c in value):
            return value
        return repr(value)
    if isinstance(value, BaseException):
        return repr(value)
    return str(value)


def format_event(name: str, fields: Mapping[str, Any]) -> str:
    parts = [f"event={name}"]
    parts.extend(f"{key}={_field(value)}" for key, value in fields.items())
    return " ".join(parts)


# -- the port ---------------------------------------------------------------------------------


class ProductionPort:
    """`Host` of the broker process (see the module's docstring). `deliver` runs an answer
    on the asyncio loop; the runtime sets `interpreter` after building both."""

    def __init__(
        self,
        store: MetadataStore,
        wal_root: Path,
        nursery: trio.Nursery,
        loop: asyncio.AbstractEventLoop,
        objects: ObjectStore | None,
        *,
        metrics: BrokerMetrics,
        claims: Callable[[], Mapping[str, int] | None],
    ) -> None:
        self._store = store
        self._wal_root = wal_root
        self._nursery = nursery
        self._loop = loop
        self.objects = objects
        self.metrics = metrics
        self._claims = claims
        self._files: dict[str, SegmentFiles] = {}
        self.wal_writers = WalWriters(loop, WAL_WRITER_THREADS, "danube-wal")
        self._checkpoint_writers = WalWriters(loop, CHECKPOINT_THREADS, "danube-checkpoint")
        self.streams = Streams()
        self.on_restart: Callable[[str], None] | None = None
        """Cluster mode: the ownership driver's `restart` (`Host.restart_topic`)."""
        self.return_memory = MemoryReturner()
        """`ReturnMemory`: a collection and `malloc_trim` (spec/memory.md)."""
        self.stopped = False
        """Set at the end of a graceful stop: the topics' files are closed, and WAL
        directory effects asked later are not carried out (recovery redoes them)."""
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()
        self._loaded_at: dict[str, float] = {}
        self.replication: ReplicationPort | None = None
        """Cluster mode: carries the replication effects (set by the server)."""
        self.dead_letters: DeadLetterForward | None = None
        """Cluster mode: the internal producer of dead letters for topics served
        elsewhere (`ForwardDeadLetter`; set by the server)."""

    # -- Host ------------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return now_ms()

    def perform(self, effect: IoEffect, done: Done) -> None:
        if isinstance(effect, TOPIC_EFFECTS) and self.stopped:
            return  # never answered: the interpreter is done with the files
        if isinstance(effect, TopicFile):
            self._write(effect, done)
            return
        if isinstance(effect, Sleep):
            # a timer on this loop: the checkpoint writer pauses between marks of a busy
            # topic, and a trio task per pause is what the hot path is rid of
            self._loop.call_later(effect.ms / 1000, done, None, None)
            return
        if isinstance(effect, RemoveTopicFiles) and effect.recreate:
            files = self._new_files(effect.topic)
            if not files.directory.exists():  # a new topic: nothing to remove
                self._reset_files(effect.topic, files, done)
                return
            # Leftovers (a replica's log, a deleted topic's files): removed in a worker
            # thread, not on the WAL writer thread whose other topics' group commits would
            # wait behind the removal of a whole log (review finding).
        if isinstance(effect, MarkDurable):
            self._began()
            files = self._topic_files(effect.topic)
            run = partial(files.write_checkpoint, effect.end)
            self._checkpoint_writers.submit(effect.topic, run, partial(self._marked, done))
            return
        if isinstance(effect, ForwardDeadLetter):
            if self.dead_letters is None:
                done(None, DanubeError(ErrorCode.UNAVAILABLE, "no other broker to forward to"))
            else:
                self.dead_letters.perform(effect, done)
            return
        if isinstance(effect, REPLICA_EFFECTS):
            if self.replication is None:
                done(None, DanubeError(ErrorCode.UNAVAILABLE, "this broker does not replicate"))
            else:
                self.replication.perform(effect, done)
            return
        self._nursery.start_soon(self._perform, effect, done)

    def event(self, name: str, **fields: Any) -> None:
        if name == "acknowledged":
            previous, through = fields["previous"], fields["through"]
            if previous is not None and through > previous:
                # the records this group commit made durable (unknown for a topic's first)
                self.metrics.wal.group_commit.observe(through - previous)
            return
        if name == "object_read_failed":
            attempt = fields["attempt"]
            if attempt > 5 and attempt % 20:
                return  # a store down for long: every 20th attempt is enough to tell
        if name == "wal_loaded":
            started = self._loaded_at.pop(fields["topic"], None)
            if started is not None:
                fields["seconds"] = f"{time.monotonic() - started:.3f}"
        name = _RENAMED.get(name, name)
        level = _LEVELS.get(name, logging.DEBUG)
        if name == "wal_loaded" and fields.get("fresh"):
            # a new topic's empty WAL says nothing a `producer_created` line does not: one log
            # line per new topic fewer (issue 23); stored topics' loads stay at INFO
            level = logging.DEBUG
        if log.isEnabledFor(level):
            log.log(level, "%s", format_event(name, fields))

    def wake(self, consumer_id: int) -> None:
        streams = self.streams
        generation = streams.current.get(consumer_id)
        slot = streams.slots.get(generation) if generation is not None else None
        if slot is not None:
            slot.wakeup.set()

    def restart_topic(self, topic: str) -> None:
        if self.on_restart is not None:
            self.on_restart(topic)

    def end_stream(self, generation: int) -> None:
        slot = self.streams.slots.get(generation)
        if slot is not None:
            slot.ended = True
            slot.wakeup.set()

    def resolve(self, waiter: Any) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def fail(self, waiter: Any, error: DanubeError) -> None:
        if not waiter.done():
            waiter.set_exception(error)

    # -- carrying effects out ----------------------------------------------------------------

    def _write(self, effect: TopicFile, done: Done) -> None:
        """The hot path: the file effect goes to the topic's WAL writer thread and its answer
        comes back on this loop, in a batch (`danube.runtime.wal_writer`)."""
        self._began()
        files = self._topic_files(effect.topic)
        files.sync_writes = effect.sync  # read by `carry`: one effect per topic at a time
        run = partial(files.carry, effect.effect)
        self.wal_writers.submit(effect.topic, run, partial(self._written, files, done))

    def _written(
        self,
        files: SegmentFiles,
        done: Done,
        outcome: FileOutcome | None,
        error: BaseException | None,
    ) -> None:
        self._ended()
        if error is None and outcome is not None:
            files.note(outcome)
            if outcome.appended or outcome.synced is not None:  # not a segment's creation
                submitted, _, finished, answered = self.wal_writers.timings.last
                self.metrics.stages.committed(
                    submitted, finished, answered, outcome.synced, wrote=outcome.appended > 0
                )
        done(None, error)

    def _reset_files(self, topic: str, files: SegmentFiles, done: Done) -> None:
        """A new topic's directory made on the topic's WAL writer thread, ahead of the
        segment it creates next: one batched hand-off instead of a trio task and a
        `trio.to_thread` call for each of a removal and a scan (issue 23)."""
        self._began()
        self._loaded_at.setdefault(topic, time.monotonic())
        stale = self._files.pop(topic, None)
        if stale is not None:
            stale.close()
        self._files[topic] = files
        self.wal_writers.submit(topic, files.reset, partial(self._marked, done))

    def _marked(self, done: Done, _wrote: Any, error: BaseException | None) -> None:
        self._ended()
        done(None, error)

    def _began(self) -> None:
        self._in_flight += 1
        if self._in_flight == 1:
            self._idle = trio.Event()

    def _ended(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def _perform(self, effect: IoEffect, done: Done) -> None:
        topical = isinstance(effect, TOPIC_EFFECTS)
        if topical:
            self._began()
        try:
            try:
                answer = await self._answer(effect)
            except Exception as error:
                self._loop.call_soon_threadsafe(_deliver, done, None, error)
            else:
                self._loop.call_soon_threadsafe(_deliver, done, answer, None)
        finally:
            if topical:
                self._ended()

    async def _answer(self, effect: IoEffect) -> Any:
        if isinstance(effect, STORE_EFFECTS):
            return await perform_store(self._store, effect, self._claims())  # type: ignore[arg-type]
        if isinstance(effect, Work):
            return await trio.to_thread.run_sync(effect.run)
        if isinstance(effect, ReadTopicFile):
            # a topic whose files are not open here (dropped meanwhile) reads what is left
            files = self._files.get(effect.topic) or self._new_files(effect.topic)
            return await trio.to_thread.run_sync(
                files.read_bytes, effect.segment_base, effect.start, effect.end
            )
        if isinstance(effect, WriteEpochs):
            files = self._topic_files(effect.topic)
            await trio.to_thread.run_sync(files.write_epochs, effect.history)
            return None
        if isinstance(effect, (ObjectGet, ObjectPut, ObjectList, ObjectDelete)):
            return await self._object(effect)
        return await self._directory(effect)

    async def _directory(self, effect: IoEffect) -> Any:
        """Loads, repairs and drops of a topic's WAL directory."""
        if isinstance(effect, ScanTopic):
            self._loaded_at.setdefault(effect.topic, time.monotonic())
            return await trio.to_thread.run_sync(self._topic_files(effect.topic).scan)
        if isinstance(effect, RecoverTopic):
            files = self._topic_files(effect.topic)
            if not (effect.actions or effect.mark is not None or effect.clear_loss_accepted):
                # Nothing to carry out (a new topic's empty directory): no thread hop, which
                # cost a new topic more GIL time than any of its file work (issue 23).
                return None
            await trio.to_thread.run_sync(
                files.carry_out,
                effect.topic,
                effect.actions,
                effect.mark,
                effect.clear_loss_accepted,
                effect.now_ms,
            )
            return None
        if isinstance(effect, TruncateTopicFile):
            await self._topic_files(effect.topic).truncate(effect.segment_base, effect.size)
            return None
        if isinstance(effect, RemoveTopicFiles):
            files = self._files.pop(effect.topic, None) or self._new_files(effect.topic)
            await trio.to_thread.run_sync(files.remove)
            if effect.recreate:  # a fresh topic over leftovers: its directory again, empty
                files = self._files[effect.topic] = self._new_files(effect.topic)
                await trio.to_thread.run_sync(files.reset)
            return None
        if isinstance(effect, CloseTopicFiles):
            files = self._files.pop(effect.topic, None)
            if files is not None:
                files.close()
            return None
        raise TypeError(f"the production port cannot perform {effect!r}")

    async def _object(self, effect: ObjectGet | ObjectPut | ObjectList | ObjectDelete) -> Any:
        objects = self.objects
        if objects is None:
            raise ObjectStoreFailed(ObjectFailure.FATAL, "this broker has no object tier")
        try:
            if isinstance(effect, ObjectGet):
                return await trio.to_thread.run_sync(
                    objects.get_range, effect.key, effect.start, effect.end
                )
            if isinstance(effect, ObjectPut):
                await trio.to_thread.run_sync(objects.put, effect.key, effect.data)
                return None
            if isinstance(effect, ObjectList):
                return await trio.to_thread.run_sync(objects.list, effect.prefix)
            with contextlib.suppress(FileNotFoundError):  # what is not there is deleted
                await trio.to_thread.run_sync(objects.delete, effect.key)
            return None
        except ObjectStoreFailed:
            raise
        except Exception as error:
            # S3's SlowDown reaches us as an OSError(EBUSY) or in the text of a cause: the
            # vocabulary's THROTTLED (the uploader backs every upload off). The rest stays
            # as the store raised it (the log shows what the store said).
            if classify_store_error(error) is UploadError.THROTTLED:
                raise ObjectStoreFailed(ObjectFailure.THROTTLED, repr(error)) from error
            raise

    def _topic_files(self, topic: str) -> SegmentFiles:
        files = self._files.get(topic)
        if files is None:
            files = self._files[topic] = self._new_files(topic)
        return files

    def _new_files(self, topic: str) -> SegmentFiles:
        name = parse_topic(topic)
        directory = self._wal_root / name.namespace / name.local
        return SegmentFiles(directory, metrics=self.metrics.wal)

    # -- stopping ---------------------------------------------------------------------------------

    async def stop(self) -> None:
        """The end of a graceful stop: no WAL directory effect starts any more; once the ones
        under way finished, every topic's files are closed."""
        self.stopped = True
        await self._idle.wait()
        self.wal_writers.close()
        self._checkpoint_writers.close()
        for files in self._files.values():
            files.close()
        self._files.clear()


def _deliver(done: Done, answer: Any, error: BaseException | None) -> None:
    done(answer, error)
