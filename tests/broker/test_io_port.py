"""The production port (`danube.runtime.io_port`) under the one interpreter: what the broker
process does with answers the old runtime had no tests for. A metadata write whose outcome
is unknown fails the reply that waited for it; an object read that fails and then heals
serves its records (the decided policy, spec/effects.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_asyncio

from danube.effects import Backoff, RecoverTopic
from danube.effects.flow import Finished, Flow, step
from danube.interpreter import flows
from danube.machines.tiering import ObjectRead
from danube.machines.wal.format import encode_frame
from danube.metadata import MemoryStore, MetadataError
from danube.runtime.broker import BrokerRuntime
from danube.runtime.io_port import ProductionPort, format_event
from danube.runtime.metrics import BrokerMetrics
from danube.testing import make_core
from danube.values.errors import DanubeError, ErrorCode


class _LostAnswers(MemoryStore):
    """A store whose transactions time out: their outcome is unknown."""

    async def txn(self, *args: Any, **kwargs: Any) -> Any:
        raise MetadataError("the request timed out")


class _HealingObjects:
    """An object store whose first `failures` reads fail."""

    def __init__(self, data: bytes, failures: int) -> None:
        self.data = data
        self.failures = failures
        self.reads = 0

    def get_range(self, key: str, start: int, end: int | None) -> bytes:
        self.reads += 1
        if self.reads <= self.failures:
            raise OSError(5, "We encountered an internal error. Please try again.")
        return self.data[start:end]


@pytest.mark.trio
async def test_an_unknown_metadata_outcome_fails_the_reply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    core = make_core()
    metrics = BrokerMetrics(core, "b1", "standalone")
    caplog.set_level(logging.ERROR, "danube.runtime")
    async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
        runtime = BrokerRuntime(core, _LostAnswers(), tmp_path, nursery, loop, metrics=metrics)
        with pytest.raises(DanubeError) as failed:
            await trio_asyncio.aio_as_trio(runtime.run)(core.bootstrap(["default"]))
        assert failed.value.code is ErrorCode.UNAVAILABLE
        assert "could not persist metadata" in str(failed.value)
        nursery.cancel_scope.cancel()
    assert "event=metadata_write_failed" in caplog.text


@pytest.mark.trio
async def test_a_committed_metadata_change_answers_the_reply(tmp_path: Path) -> None:
    core = make_core()
    metrics = BrokerMetrics(core, "b1", "standalone")
    store = MemoryStore()
    async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
        runtime = BrokerRuntime(core, store, tmp_path, nursery, loop, metrics=metrics)
        await trio_asyncio.aio_as_trio(runtime.run)(core.bootstrap(["default"]))
        await trio_asyncio.aio_as_trio(runtime.flush_metadata)()
        nursery.cancel_scope.cancel()
    assert await store.scan("/")


async def _answer(port: ProductionPort, request: Any) -> tuple[Any, BaseException | None]:
    answered = trio.Event()
    box: list[tuple[Any, BaseException | None]] = []

    def done(answer: Any = None, error: BaseException | None = None) -> None:
        box.append((answer, error))
        answered.set()

    port.perform(request, done)
    await answered.wait()
    return box[0]


async def _drive(port: ProductionPort, flow: Flow[Any]) -> Any:
    """Runs a flow against the port as the interpreter does: one request at a time, its
    answer delivered on the asyncio loop."""
    request = step(flow)
    while not isinstance(request, Finished):
        answer, error = await _answer(port, request)
        request = step(flow, error=error) if error is not None else step(flow, answer=answer)
    if request.error is not None:
        raise request.error
    return request.value


@pytest.mark.trio
async def test_an_object_read_that_fails_twice_then_heals_serves_its_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = [b"zero", b"one", b"two"]
    data = encode_frame(0, 1_000, records)
    plan = ObjectRead("t/0.wal", 0, 0, len(data), 0, 0, 3)
    objects = _HealingObjects(data, failures=2)
    core = make_core()
    metrics = BrokerMetrics(core, "b1", "standalone")
    caplog.set_level(logging.WARNING, "danube.runtime")
    async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
        port = ProductionPort(
            MemoryStore(),
            tmp_path,
            nursery,
            loop,
            objects,  # type: ignore[arg-type]
            metrics=metrics,
            claims=lambda: None,
        )
        attempts: list[int] = []

        def failed(attempt: int, error: BaseException) -> None:
            attempts.append(attempt)
            port.event("object_read_failed", topic="/default/t", key=plan.key, attempt=attempt,
                       error=error)  # fmt: skip

        fast = Backoff(first_ms=1, cap_ms=5, attempts=None)
        outcome = await _drive(port, flows.read_object(plan, lambda: True, fast, failed))
        nursery.cancel_scope.cancel()
    assert outcome == flows.ReadOutcome(tuple(records))
    assert attempts == [1, 2] and objects.reads == 3
    assert "event=object_read_failed topic=/default/t key=t/0.wal attempt=1" in caplog.text
    assert "We encountered an internal error" in caplog.text


def test_log_lines_keep_their_old_shape() -> None:
    line = format_event("topic_stopped", {"topic": "/default/t", "reason": "bad frame at 3"})
    assert line == "event=topic_stopped topic=/default/t reason='bad frame at 3'"
    error = OSError(5, "slow")
    assert format_event("upload_failed", {"kind": "throttled", "error": error}) == (
        "event=upload_failed kind=throttled error=OSError(5, 'slow')"
    )


def _counted_hops(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The functions handed to `trio.to_thread.run_sync` from now on (worker-thread hops)."""
    hops: list[object] = []
    real = trio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    return hops


def _standalone_port(tmp_path: Path, nursery: Any, loop: Any, core: Any) -> ProductionPort:
    return ProductionPort(
        MemoryStore(),
        tmp_path,
        nursery,
        loop,
        None,
        metrics=BrokerMetrics(core, "b1", "standalone"),
        claims=lambda: None,
    )


@pytest.mark.trio
async def test_a_recovery_with_nothing_to_carry_out_takes_no_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new topic's load ends with a `RecoverTopic` that has no action, no mark and no file
    to clear: the port answers it without a hop to a worker thread; one with work still goes."""
    hops = _counted_hops(monkeypatch)
    core = make_core()
    async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
        port = _standalone_port(tmp_path, nursery, loop, core)
        assert await port._directory(RecoverTopic("/default/t", (), None, False)) is None
        assert hops == []
        await port._directory(RecoverTopic("/default/t", (), 0, False))
        assert len(hops) == 1
        nursery.cancel_scope.cancel()


@pytest.mark.trio
@pytest.mark.parametrize("leftovers", [False, True])
async def test_a_fresh_topics_load_is_one_writer_job_and_leaves_an_empty_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leftovers: bool
) -> None:
    """Issue 23: a new topic's load used to take two worker-thread hops (its leftovers
    removed, then the directory scanned). Now a new topic's directory is made on the topic's
    WAL writer thread and the flow knows the scan is empty: no `trio.to_thread` at all, the
    plan a new log's. Leftovers (a replica's whole log) are removed in a worker thread, not
    on the writer thread other topics' group commits wait on (review finding)."""
    hops = _counted_hops(monkeypatch)
    directory = tmp_path / "default" / "t"
    if leftovers:
        directory.mkdir(parents=True)
        (directory / "00000000000000000000.wal").write_bytes(b"an earlier topic's segment")
    core = make_core()
    async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
        port = _standalone_port(tmp_path, nursery, loop, core)
        flow = flows.recover("/default/t", lambda: (0, 0), fresh=True, now_ms=lambda: 0)
        plan = await _drive(port, flow)
        port.wal_writers.close()
        nursery.cancel_scope.cancel()
    assert [getattr(fn, "__name__", None) for fn in hops] == (
        ["remove", "reset"] if leftovers else []
    )
    assert directory.is_dir() and list(directory.iterdir()) == []
    assert plan.next_offset == 0 and not plan.segments and not plan.actions
