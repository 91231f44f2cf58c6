"""The publish hot path of the production port (issue 23, point 1): a group commit's file
effect goes from the asyncio loop to a WAL writer thread and its answer comes back in one
batch, without a trio task or a second thread hand-off; a disk that refuses is still
reported as before (the reply fails UNAVAILABLE, `wal_io_failed` and `wal_failed` logged).

The broker runs in this process (`BrokerRuntime` over a real WAL directory), so the tests
can count what crossed between the loop, trio and the writer threads."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_asyncio

from danube.machines.wal.machine import WalConfig
from danube.metadata import MemoryStore
from danube.runtime import segment_files
from danube.runtime.broker import BrokerRuntime
from danube.runtime.metrics import BrokerMetrics
from danube.runtime.wal_writer import WalWriters
from danube.testing import make_core
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode

TOPIC = "/default/hot"


class _CountingNursery:
    """The broker's nursery, counting the trio tasks the port starts."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.started = 0

    def start_soon(self, *args: Any, **kwargs: Any) -> None:
        self.started += 1
        self._nursery.start_soon(*args, **kwargs)


async def _producer(runtime: BrokerRuntime) -> int:
    """A producer of the reliable topic (its WAL loaded)."""
    created = runtime.core.create_producer(
        TOPIC, "p", access_mode=0, strategy=DispatchStrategy.RELIABLE
    )
    await runtime.run(created)
    return created.value


async def _publish_all(
    runtime: BrokerRuntime, producer: int, messages: int, rounds: int
) -> list[int]:
    """Publishes `messages` at once, `rounds` times (each round's publishes meet in a few
    group commits); returns their offsets."""
    core = runtime.core
    offsets: list[int] = []
    for round_ in range(rounds):
        publishes = []
        for i in range(messages):
            payload = f"m{round_}-{i}"
            step = core.publish(
                producer,
                TOPIC,
                payload,
                len(payload),
                None,
                encode=lambda offset, payload=payload: payload.encode(),
                now_ms=1_000,
            )
            publishes.append(runtime.publish(TOPIC, step))
        offsets.extend(await asyncio.gather(*publishes))
    return offsets


async def _in_broker(tmp_path: Path, body: Any) -> tuple[Any, BrokerRuntime, _CountingNursery]:
    core = make_core(wal_config=WalConfig(synced_writes=True))  # as the broker runs fsync
    metrics = BrokerMetrics(core, "b1", "standalone")
    store = MemoryStore()
    async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
        counting = _CountingNursery(nursery)
        runtime = BrokerRuntime(
            core,
            store,
            tmp_path,
            counting,  # type: ignore[arg-type]
            loop,
            metrics=metrics,
        )
        await trio_asyncio.aio_as_trio(runtime.run)(core.bootstrap(["default"]))
        result = await trio_asyncio.aio_as_trio(body)(runtime, counting)
        nursery.cancel_scope.cancel()
    return result, runtime, counting


class _Recorded(WalWriters):
    """The port's writers, recording each submission's file effect."""

    effects: list[str]

    def submit(self, topic: str, run: Any, done: Any) -> None:
        args = getattr(run, "args", ())  # a file effect's partial, or a new topic's reset
        self.effects.append(type(args[0]).__name__ if args else run.__name__)
        super().submit(topic, run, done)


@pytest.mark.trio
async def test_a_group_commit_takes_one_hand_off_to_a_writer_thread_and_back(
    tmp_path: Path,
) -> None:
    commits: list[int] = []

    async def body(runtime: BrokerRuntime, nursery: _CountingNursery) -> dict[str, int]:
        port = runtime.port
        writers = port.wal_writers
        writers.__class__ = _Recorded
        writers.effects = []  # type: ignore[attr-defined]
        event = port.event

        def counted(name: str, **fields: Any) -> None:
            if name == "acknowledged":
                commits.append(fields["through"])
            event(name, **fields)

        port.event = counted  # type: ignore[method-assign]
        producer = await _producer(runtime)
        tasks, submitted, batches = nursery.started, writers.submissions, writers.batches
        offsets = await _publish_all(runtime, producer, messages=20, rounds=5)
        assert sorted(offsets) == list(range(100))
        return {
            "tasks": nursery.started - tasks,
            "submissions": writers.submissions - submitted,
            "batches": writers.batches - batches,
            "writes": writers.effects.count("Write"),  # type: ignore[attr-defined]
            "creates": writers.effects.count("CreateSegment"),  # type: ignore[attr-defined]
        }

    counts, _runtime, _nursery = await _in_broker(tmp_path, body)
    assert commits and commits[-1] == 99
    # Each acknowledgement is one Write (synced in the same call) handed to the writer once;
    # the only other hand-off is the creation of the topic's first segment.
    assert counts["writes"] == len(commits), counts
    assert counts["submissions"] == counts["writes"] + counts["creates"] <= len(commits) + 1
    # Answers come back in batches: never more posts to the loop than hand-offs.
    assert 0 < counts["batches"] <= counts["submissions"], counts
    # Group commits happened (100 publishes in far fewer writes).
    assert len(commits) < 100
    # The publishes started no trio task: checkpoint marks go to writer threads of their
    # own and the checkpoint writer's pause is a timer on the loop.
    assert counts["tasks"] == 0, counts


@pytest.mark.trio
async def test_a_disk_that_refuses_a_write_fails_the_publish_as_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, "danube.runtime")

    def full(fd: int, data: bytes, position: int) -> float:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def body(runtime: BrokerRuntime, _nursery: _CountingNursery) -> DanubeError:
        producer = await _producer(runtime)
        monkeypatch.setattr(segment_files, "_write_synced", full)
        with pytest.raises(DanubeError) as failed:
            await _publish_all(runtime, producer, messages=3, rounds=1)
        monkeypatch.undo()
        # The disk heals: once the topic's repair is done, publishes are acknowledged again.
        for _ in range(500):
            try:
                await _publish_all(runtime, producer, messages=1, rounds=1)
                break
            except DanubeError:
                await asyncio.sleep(0.01)
        else:
            raise AssertionError("the topic never took publishes again")
        return failed.value

    error, _runtime, _nursery = await _in_broker(tmp_path, body)
    assert error.code is ErrorCode.UNAVAILABLE
    assert "event=wal_io_failed" in caplog.text
    assert "No space left on device" in caplog.text
    assert "event=wal_failed" in caplog.text
