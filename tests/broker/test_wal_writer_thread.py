"""A WAL writer thread's own life (`danube.runtime.wal_writer._Writer`): it ends when idle and
the next job starts another; no job may be left in the queue with no thread to take it."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from danube.runtime import wal_writer


class _RacingQueue:
    """The writer's queue, which submits one more job from another thread at the moment the
    idle thread finds it empty and before it marks itself ended (the race of a submission
    that read `_running` without the lock: its job stayed queued with no thread)."""

    def __init__(self, writer: wal_writer._Writer, job: Any) -> None:
        self._inner: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer = writer
        self._job = job
        self.raced = False

    def put(self, item: Any) -> None:
        self._inner.put(item)

    def get(self, timeout: float | None = None) -> Any:
        return self._inner.get(timeout=timeout)

    def get_nowait(self) -> Any:
        return self._inner.get_nowait()

    def empty(self) -> bool:
        empty = self._inner.empty()
        if empty and not self.raced:
            self.raced = True
            racer = threading.Thread(target=self._writer.submit, args=self._job)
            racer.start()
            racer.join(0.2)  # with the lock held here, a correct submission waits for it
        return empty


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[wal_writer._Writer]:
    """A writer whose thread ends after 10 ms without a job."""
    monkeypatch.setattr(wal_writer, "IDLE_EXIT_S", 0.01)
    loop = asyncio.new_event_loop()
    made = wal_writer._Writer(loop, "wal-writer-test", wal_writer.Timings())
    yield made
    made.close()
    loop.close()


def _ignore(answer: Any, error: BaseException | None) -> None:
    del answer, error


def test_a_job_submitted_while_the_idle_thread_ends_still_runs(
    writer: wal_writer._Writer,
) -> None:
    late = threading.Event()
    racing = _RacingQueue(writer, (late.set, _ignore))
    writer._jobs = racing  # type: ignore[assignment]
    first = threading.Event()
    writer.submit(first.set, _ignore)
    assert first.wait(2)
    assert late.wait(2), "the job submitted as the thread ended was never run"
    assert racing.raced


def test_the_thread_ends_when_idle_and_the_next_job_starts_another(
    writer: wal_writer._Writer,
) -> None:
    for _ in range(3):
        ran = threading.Event()
        writer.submit(ran.set, _ignore)
        assert ran.wait(2)
        for _ in range(200):  # the thread ends within a few idle periods
            if not writer._running:
                break
            threading.Event().wait(0.01)
        assert not writer._running
