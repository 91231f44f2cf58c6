"""Long-lived writer threads for the WAL's file effects, answering on the asyncio loop.

Issue 23, point 1. The gRPC handlers, the core and the interpreter all run on the asyncio
loop that trio-asyncio hosts. A group commit used to leave that loop for a trio task of the
broker's nursery, then for a worker thread (`trio.to_thread.run_sync`, a thread-cache
hand-off and a cancel scope per call), back to trio, and back to the asyncio loop with
`call_soon_threadsafe`: per file effect. The profile of a broker at 1,000 msg/s with fsync
(bench/RESULTS.md, 2026-11-29) showed that hand-off machinery, not the disk, was most of the
broker's CPU per commit besides gRPC itself.

A `WalWriters` is a few threads, each fed by its own queue. A topic always goes to the same
thread (a hash of its name), so its file effects run in the order they were submitted (the
interpreter hands out one at a time per topic anyway). A thread takes everything queued at
once, carries it out in order, and posts all the completions back with ONE
`call_soon_threadsafe`: one hand-off to a thread and one back per group commit, fewer when
commits of several topics meet in one batch. A thread that has had nothing to do for
`IDLE_EXIT_S` ends; the next submission starts it again.

The writers decide nothing: a job is a blocking call and a completion; what the answer
means is the interpreter's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

Completion = Callable[[Any, BaseException | None], None]
"""Called on the asyncio loop with (answer, None) or (None, error)."""

log = logging.getLogger("danube.runtime")

TIMINGS_KEPT = 4096

IDLE_EXIT_S = 10.0
"""A writer thread with nothing to do for this long ends (a broker with idle topics keeps
no threads; tests that never stop their port leak none for long)."""


class Timings:
    """The newest `TIMINGS_KEPT` jobs' three legs, in seconds: the hand-off to the thread
    (submitted until it started: the queue and the thread's wake-up), the I/O (the blocking
    call: write and fdatasync) and the way back (done until its answer ran on the loop: the
    batch's later jobs, `call_soon_threadsafe` and the loop's queue). The breakdown of a
    group commit's time outside the core (`bench/hot_path.py` prints it)."""

    def __init__(self) -> None:
        self.handoff: deque[float] = deque(maxlen=TIMINGS_KEPT)
        self.io: deque[float] = deque(maxlen=TIMINGS_KEPT)
        self.back: deque[float] = deque(maxlen=TIMINGS_KEPT)
        self.last = (0.0, 0.0, 0.0, 0.0)
        """The job whose completion runs now: submitted, started, finished, answered
        (`perf_counter` seconds), for the stage metrics its completion adds."""

    def summary(self) -> dict[str, float]:
        """p50 and p99 of each leg, in milliseconds."""
        out: dict[str, float] = {}
        for name, values in (("handoff", self.handoff), ("io", self.io), ("back", self.back)):
            ordered = sorted(values)
            if ordered:
                out[f"{name}_p50_ms"] = round(1000 * ordered[len(ordered) // 2], 3)
                out[f"{name}_p99_ms"] = round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 3)
        return out


class _Writer:
    """One thread and its queue (a C `SimpleQueue`: a submission is one `put`, no Python
    condition variable on the loop's side)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, timings: Timings) -> None:
        self._loop = loop
        self._name = name
        self._timings = timings
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Completion, float] | None]
        self._jobs = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False
        self._closed = False
        self.batches = 0
        """Completion batches posted back to the loop (one `call_soon_threadsafe` each)."""

    def submit(self, run: Callable[[], Any], done: Completion) -> None:
        if self._closed:
            raise RuntimeError("the WAL writer is closed")
        # The put and the test of `_running` under the thread's lock: read without it, a
        # thread deciding in `_idle_exit` that the queue is empty could end just after this
        # job went in, leaving it with no thread (its topic's publishes would wait forever).
        with self._lock:
            self._jobs.put((run, done, time.perf_counter()))
            if not self._running:
                self._running = True
                threading.Thread(target=self._serve, name=self._name, daemon=True).start()

    def close(self) -> None:
        """No more jobs: the thread ends once it answered the ones queued."""
        self._closed = True
        self._jobs.put(None)

    def _idle_exit(self) -> bool:
        """Nothing came for `IDLE_EXIT_S`: the thread ends, unless a job slipped in."""
        with self._lock:
            if self._jobs.empty():
                self._running = False
                return True
            return False

    def _serve(self) -> None:
        try:
            self._serve_jobs()
        except BaseException:
            # A thread ended by something other than its own rules (idle, closed, the loop
            # gone) must not leave the writer marked running with nobody taking jobs: the
            # next submission starts another (the batch under way is lost with the error).
            with self._lock:
                self._running = False
            raise

    def _serve_jobs(self) -> None:
        jobs = self._jobs
        while True:
            try:
                first = jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                if self._idle_exit():
                    return
                continue
            batch = [first]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(jobs.get_nowait())
            answers: list[_Answer] = []
            closing = False
            for job in batch:
                if job is None:
                    closing = True
                    continue
                run, done, submitted = job
                started = time.perf_counter()
                try:
                    answer, error = run(), None
                except Exception as failure:  # the disk's refusal, answered as the error
                    answer, error = None, failure
                answers.append((done, answer, error, submitted, started, time.perf_counter()))
            if answers:
                self.batches += 1
                try:
                    self._loop.call_soon_threadsafe(_complete, answers, self._timings)
                except Exception:  # closed (RuntimeError) or torn down (trio-asyncio
                    # drops its token first: AttributeError): the process is going away
                    # and nobody waits for these answers
                    return
            if closing:
                return


_Answer = tuple[Completion, Any, BaseException | None, float, float, float]
"""done, answer, error, and when the job was submitted, started and finished."""


def _complete(answers: list[_Answer], timings: Timings) -> None:
    now = time.perf_counter()
    for done, answer, error, submitted, started, finished in answers:
        timings.handoff.append(started - submitted)
        timings.io.append(finished - started)
        timings.back.append(now - finished)
        timings.last = (submitted, started, finished, now)
        try:
            done(answer, error)
        except Exception:  # a bug where the answer went: the batch's other answers still go
            log.exception("event=wal_completion_failed")


class WalWriters:
    """`threads` writer threads; a topic's jobs always go to the same one (see the module's
    docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError("at least one writer thread")
        self.timings = Timings()
        self._writers = [_Writer(loop, f"{name}-{i}", self.timings) for i in range(threads)]
        self.submissions = 0
        """Jobs handed to a thread so far: one per file effect (tests count them)."""

    def submit(self, topic: str, run: Callable[[], Any], done: Completion) -> None:
        """Runs `run()` in the topic's writer thread; `done` hears its answer on the loop."""
        writers = self._writers
        writer = (
            writers[zlib.crc32(topic.encode()) % len(writers)] if len(writers) > 1 else writers[0]
        )
        self.submissions += 1
        writer.submit(run, done)

    @property
    def batches(self) -> int:
        """Completion batches posted back so far (each one `call_soon_threadsafe`)."""
        return sum(writer.batches for writer in self._writers)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
