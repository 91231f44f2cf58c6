"""The debugging memory dump (`danube.runtime.memory_dump`): off unless asked, and what it
writes is what `bench/memory_return.py --dump` reads."""

from __future__ import annotations

import gc
import json
import os
import signal
import tracemalloc
import weakref
from pathlib import Path

import pytest

from danube.runtime import memory_dump


def test_off_unless_the_environment_names_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memory_dump.DUMP_ENV, raising=False)
    before = signal.getsignal(signal.SIGUSR2)
    assert memory_dump.install_from_environment() is False
    assert signal.getsignal(signal.SIGUSR2) is before


def test_sigusr2_writes_a_dump(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(memory_dump.DUMP_ENV, str(tmp_path))
    monkeypatch.setenv(memory_dump.REFERRERS_ENV, "builtins.frozenset")
    monkeypatch.setenv(memory_dump.GARBAGE_ENV, "1")
    before = signal.getsignal(signal.SIGUSR2)
    try:
        assert memory_dump.install_from_environment() is True
        cycle: list[object] = []
        cycle.append(cycle)  # garbage only the collector frees: the dump names it
        del cycle
        os.kill(os.getpid(), signal.SIGUSR2)
        dump = json.loads((tmp_path / "dump-1.json").read_text())
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert dump["rss"] > 0 and dump["gc_objects"] > 0 and dump["allocated_blocks"] > 0
    assert dump["pymalloc"]["arenas allocated current"] > 0
    assert dump["types"] and "builtins.frozenset" in dump["referrers"]
    assert dump["garbage"]["builtins.list"] >= 1
    if dump["mallinfo2"] is not None:  # glibc >= 2.33
        assert dump["mallinfo2"]["uordblks"] > 0


def test_a_late_trace_starts_at_the_first_dump(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`DANUBE_MEMORY_TRACE_LATE`: not traced until the first SIGUSR2 (that dump untraced),
    the next one traced with its snapshot, so what it holds was allocated after the first."""
    monkeypatch.setenv(memory_dump.DUMP_ENV, str(tmp_path))
    monkeypatch.setenv(memory_dump.TRACE_ENV, "2")
    monkeypatch.setenv(memory_dump.TRACE_LATE_ENV, "1")
    before = signal.getsignal(signal.SIGUSR2)
    assert not tracemalloc.is_tracing()
    try:
        assert memory_dump.install_from_environment() is True
        assert not tracemalloc.is_tracing()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert tracemalloc.is_tracing()
        kept = [bytearray(1000) for _ in range(100)]
        os.kill(os.getpid(), signal.SIGUSR2)
        first = json.loads((tmp_path / "dump-1.json").read_text())
        second = json.loads((tmp_path / "dump-2.json").read_text())
        trace = tracemalloc.Snapshot.load(str(tmp_path / "dump-2.trace"))
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGUSR2, before)
    assert "traced_bytes" not in first and not (tmp_path / "dump-1.trace").exists()
    assert second["traced_bytes"] >= 100_000
    here = [s for s in trace.statistics("filename") if s.traceback[0].filename == __file__]
    assert sum(s.size for s in here) >= 100_000 and len(kept) == 100


class _Holder:
    """A per-topic record whose field grows: short in each, long summed over all."""

    __slots__ = ("offsets",)

    def __init__(self, count: int) -> None:
        self.offsets = list(range(count))


def test_container_lengths_sum_a_field_over_its_owners() -> None:
    holders = [_Holder(300) for _ in range(40)]
    # every field ranked: in a process that ran other tests, others may outrank this one
    lengths = memory_dump.container_lengths(fields_top=1_000_000)
    fields = {entry["field"]: entry for entry in lengths["by_field"]}
    assert fields["_Holder.offsets"]["entries"] == 12_000
    assert fields["_Holder.offsets"]["owners"] == 40
    assert lengths["largest"] and all(entry["len"] > 0 for entry in lengths["largest"])
    assert len(holders) == 40


def test_a_shared_container_counts_once() -> None:
    shared = list(range(700))
    holders = [_Holder(0) for _ in range(30)]
    for holder in holders:
        holder.offsets = shared
    lengths = memory_dump.container_lengths(fields_top=1_000_000)
    fields = {entry["field"]: entry for entry in lengths["by_field"]}
    assert fields["_Holder.offsets"]["entries"] == 700
    assert fields["_Holder.offsets"]["owners"] == 30


class _Gone:
    pass


def test_a_dead_weak_proxy_anywhere_does_not_stop_the_dump() -> None:
    """A `weakref.proxy` whose object is gone, left in any container of the process (asyncio
    and the tests leave some), raised ReferenceError out of `container_lengths`."""
    proxies = [weakref.proxy(_Gone())]
    gc.collect()
    lengths = memory_dump.container_lengths(fields_top=1_000_000)
    assert lengths["largest"]
    assert len(proxies) == 1


def test_container_lengths_see_frozen_objects() -> None:
    holder = _Holder(5_000)
    gc.freeze()
    try:
        lengths = memory_dump.container_lengths(fields_top=1_000_000)
        assert gc.get_freeze_count() == 0  # left unfrozen: later counts by type see all alike
    finally:
        gc.unfreeze()
    fields = {entry["field"]: entry for entry in lengths["by_field"]}
    assert fields["_Holder.offsets"]["entries"] == 5_000
    assert holder.offsets[-1] == 4_999


class _Costly:
    """An object whose `repr` must never be made by a dump (CI's full run spent ten minutes
    in the `repr` of a holder)."""

    def __repr__(self) -> str:
        raise AssertionError("a dump made a repr of an arbitrary object")


def test_a_dump_never_makes_the_repr_of_an_arbitrary_holder() -> None:
    holder = _Holder(0)
    holder.offsets = [_Costly() for _ in range(200_000)]  # the longest container by far
    lengths = memory_dump.container_lengths()
    [entry] = [e for e in lengths["largest"] if e["len"] == 200_000]
    assert "_Costly" in entry["what"]
    assert memory_dump._describe({_Costly(): 1, "k": 2}).endswith("keys=[<_Costly>, 'k']")
