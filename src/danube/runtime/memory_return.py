"""Carries out `ReturnMemory` (spec/memory.md, "Giving memory back"): a full collection, then
glibc's `malloc_trim(0)`, which hands the heap's free pages back to the kernel (CPython's
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
import time
from collections.abc import Callable

log = logging.getLogger("danube.runtime")

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
    """The production port's `return_memory`."""

    def __init__(self, trim: Callable[[], object] | bool | None = True) -> None:
        """`trim`: True finds glibc's `malloc_trim`; None (or no glibc) makes it a no-op."""
        self._trim = _trimmer() if trim is True else (trim if callable(trim) else None)
        self._said_absent = False
        self.returned = 0
        """Bytes of RSS the returns gave back, added up (a counter, for tests and logs)."""

    def __call__(self, freed: int) -> None:
        before = rss_bytes()
        started = time.perf_counter()
        collected = gc.collect()
        if self._trim is not None:
            self._trim()
        elif not self._said_absent:
            self._said_absent = True
            log.info("event=malloc_trim_absent detail=no glibc: freed heap stays with the process")
        after = rss_bytes()
        gave = before - after if before is not None and after is not None else 0
        self.returned += max(0, gave)
        log.info(
            "event=memory_returned accounted_fell=%d collected=%d rss_before=%s rss_after=%s "
            "ms=%.1f",
            freed, collected, before, after, (time.perf_counter() - started) * 1000,
        )  # fmt: skip
