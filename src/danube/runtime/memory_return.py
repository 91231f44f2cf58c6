"""Carries out `ReturnMemory` (spec/memory.md, "Giving memory back"): a collection (of every
generation when the effect is `full`, else of generations 0 and 1 only, which visits what the
last seconds allocated and not the broker's long-lived state), then glibc's `malloc_trim(0)`,
which hands the heap's free pages back to the kernel (CPython's
small-object arenas are returned by the allocator itself once empty; the rest of the freed
memory sits in malloc's free lists). Where there is no glibc (musl, macOS) the trim is a
no-op, logged once. The RSS before and after is logged (`event=memory_returned`), which is
how its effect is measured (bench/RESULTS.md, issue 28 part 5). The decision is the pure
machine's (`danube.machines.memory.giveback`); this only carries it out."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("danube.runtime")

YOUNG = 1
"""The oldest generation a light return collects (0 and 1; 2 is the long-lived state)."""
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _trimmer() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def rss_bytes() -> int | None:
    """This process's resident set (Linux's /proc/self/statm), None elsewhere."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


class MemoryReturner:
    """The production port's `return_memory`. The collection runs on the event loop (it must:
    objects are freed where they live); the trim, by default, in a short-lived worker thread:
    ctypes lets go of the GIL during the call, and with 1,000 topics the trim walking glibc's
    heap was most of the 0.4-1.1 s the loop stalled at each return (bench/RESULTS.md, issue 28
    part 6). The log line says both times and how long the loop was held (`stall_ms`)."""

    def __init__(
        self, trim: Callable[[], object] | bool | None = True, in_thread: bool = True
    ) -> None:
        """`trim`: True finds glibc's `malloc_trim`; None (or no glibc) makes it a no-op.
        `in_thread`: the trim runs in a worker thread (False: on the caller's)."""
        self._trim = _trimmer() if trim is True else (trim if callable(trim) else None)
        self._in_thread = in_thread
        self._said_absent = False
        self._worker: threading.Thread | None = None
        self.returned = 0
        """Bytes of RSS the returns gave back, added up (a counter, for tests and logs)."""

    def __call__(self, freed: int, full: bool = True) -> None:
        before = rss_bytes()
        started = time.perf_counter()
        collected = gc.collect() if full else gc.collect(YOUNG)
        gc_s = time.perf_counter() - started
        if self._trim is None:
            if not self._said_absent:
                self._said_absent = True
                log.info(
                    "event=malloc_trim_absent detail=no glibc: freed heap stays with the process"
                )
            self._finish(freed, full, collected, before, gc_s, 0.0, gc_s)
        elif self._in_thread and (self._worker is None or not self._worker.is_alive()):
            self._worker = threading.Thread(
                target=self._trim_then_finish, args=(freed, full, collected, before, gc_s),
                name="danube-malloc-trim", daemon=True,
            )  # fmt: skip
            self._worker.start()
        else:  # inline, or a trim still running (returns are 30 s apart: not expected)
            trimmed = time.perf_counter()
            self._trim()
            trim_s = time.perf_counter() - trimmed
            self._finish(freed, full, collected, before, gc_s, trim_s, gc_s + trim_s)

    def _trim_then_finish(
        self, freed: int, full: bool, collected: int, before: int | None, gc_s: float
    ) -> None:
        assert self._trim is not None
        trimmed = time.perf_counter()
        self._trim()
        self._finish(freed, full, collected, before, gc_s, time.perf_counter() - trimmed, gc_s)

    def _finish(
        self, freed: int, full: bool, collected: int, before: int | None, gc_s: float,
        trim_s: float, stall_s: float,
    ) -> None:  # fmt: skip
        after = rss_bytes()
        gave = before - after if before is not None and after is not None else 0
        self.returned += max(0, gave)
        log.info(
            "event=memory_returned accounted_fell=%d collected=%d rss_before=%s rss_after=%s "
            "ms=%.1f gc_ms=%.1f trim_ms=%.1f stall_ms=%.1f full=%s",
            freed, collected, before, after, (gc_s + trim_s) * 1000, gc_s * 1000,
            trim_s * 1000, stall_s * 1000, full,
        )  # fmt: skip

    def wait(self, timeout: float | None = None) -> None:
        """Until the last trim's worker is done (tests; a broker never waits for it)."""
        if self._worker is not None:
            self._worker.join(timeout)
