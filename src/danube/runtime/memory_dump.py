"""A debugging dump of where the broker's memory is (spec/memory.md, "Giving memory back"):
off unless `DANUBE_MEMORY_DUMP` names a directory when the broker starts. Then SIGUSR2 writes
`dump-<n>.json` there: the RSS, glibc's `mallinfo2` (heap held, in use, free), CPython's
small-object allocator (`sys._debugmallocstats`: arenas, pools, bytes in used and free blocks),
`sys.getallocatedblocks()` and the live objects counted by type after a full collection; with
`DANUBE_MEMORY_GARBAGE=1` what the collection freed, by type (the reference cycles left to
the collector), with `DANUBE_MEMORY_CONTAINERS=1` the longest containers and the attributes
whose containers hold the most entries summed over their owners (where entries pile up), with
`DANUBE_MEMORY_REFERRERS=<module.qualname,...>` what holds a few live
objects of those types, with `DANUBE_MEMORY_TRACE=<frames>` also tracemalloc's top allocation
sites and the whole snapshot in `dump-<n>.trace` (`bench/idle_topic_memory.py` diffs two;
tracemalloc started at once, which costs memory and time: a measurement's own run, never
production); with `DANUBE_MEMORY_TRACE_LATE=1` as well, tracemalloc starts at the first
SIGUSR2 instead (that dump untraced), so a broker set up at full speed traces only what a
later phase allocates (`bench/memory_soak.py`, bench/RESULTS.md issue 28 part 17).

It is how a leak (objects still alive after the streams that made them closed) is told from
fragmentation (the objects gone, the memory not given back): `bench/memory_return.py --dump`
takes one at each phase."""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import json
import os
import re
import signal
import sys
import tempfile
import tracemalloc
import weakref
from collections import deque as deque_type
from itertools import islice
from pathlib import Path
from types import FrameType
from typing import Any

DUMP_ENV = "DANUBE_MEMORY_DUMP"
TRACE_ENV = "DANUBE_MEMORY_TRACE"
REFERRERS_ENV = "DANUBE_MEMORY_REFERRERS"
GARBAGE_ENV = "DANUBE_MEMORY_GARBAGE"
CONTAINERS_ENV = "DANUBE_MEMORY_CONTAINERS"
TRACE_LATE_ENV = "DANUBE_MEMORY_TRACE_LATE"
MALLINFO2_FIELDS = (
    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
    "fordblks", "keepcost",
)  # fmt: skip


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def mallinfo2() -> dict[str, int] | None:
    """glibc's heap statistics (`arena`: bytes the main heap holds from the kernel, `uordblks`:
    in use, `fordblks`: free in it, `hblkhd`: in mmap'd blocks); None without glibc >= 2.33."""
    try:
        call = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    call.restype = _Mallinfo2
    info = call()
    return {name: int(getattr(info, name)) for name in MALLINFO2_FIELDS}


def pymalloc_stats() -> dict[str, int]:
    """The totals `sys._debugmallocstats()` writes to the C stderr, read back from a file."""
    with tempfile.TemporaryFile("w+") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    stats: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^#?\s*([A-Za-z\d][^=]*?)\s*=\s*([\d,]+)$", line)
        if match:
            name = re.sub(r"^\d+ unused pools.*", "unused pools bytes", match.group(1).strip())
            name = re.sub(r"^\d+ arenas \*.*", "arenas bytes", name)
            stats.setdefault(name, int(match.group(2).replace(",", "")))  # the first "Total"
    return stats


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_PLAIN = (str, bytes, int, float, bool, type(None))


def _short(value: object) -> str:
    """A value's text when it is plain and short to make, else its type's name: a `repr` of
    an arbitrary object (a dataclass holding a whole broker) can take minutes (CI's full
    run spent ten in one) and would stall a broker asked for a dump."""
    if isinstance(value, _PLAIN):
        return repr(value)[:80]
    return f"<{type(value).__qualname__}>"


def _describe(thing: object) -> str:
    kind = f"{type(thing).__module__}.{type(thing).__qualname__}"
    if isinstance(thing, dict):
        return f"{kind} keys=[{', '.join(_short(k) for k in islice(thing, 6))}]"[:300]
    if hasattr(thing, "f_code"):
        code = thing.f_code  # a frame
        return f"{kind} {code.co_qualname} {code.co_filename}:{thing.f_lineno}"
    if isinstance(thing, (list, tuple, set, frozenset, deque_type)):
        return f"{kind} len={len(thing)} [{', '.join(_short(e) for e in islice(thing, 6))}]"
    return f"{kind} {_short(thing)}"


def referrers(type_name: str, samples: int = 3, depth: int = 6) -> list[list[str]]:
    """For a few live objects of `type_name` (module.qualname), a chain of what refers to
    what back towards a root: the first referrer each step that is not the dump's own frame
    or list. How a leak's holder is found."""
    objects = gc.get_objects()
    found = [
        each
        for each in objects
        if f"{type(each).__module__}.{type(each).__qualname__}" == type_name
    ][-samples:]
    del objects
    chains = []
    here = sys._getframe()
    for start in found:
        chain, current, seen = [_describe(start)], start, {id(start)}
        mine = {id(found), id(chain), id(here)}
        for _ in range(depth):
            holders = [
                each
                for each in gc.get_referrers(current)
                if id(each) not in seen and id(each) not in mine
            ]
            mine.add(id(holders))
            if not holders:
                break
            current = holders[0]
            seen.add(id(current))
            chain.append(f"({len(holders)} holders) " + _describe(current))
        chains.append(chain)
    return chains


def _owner_fields(thing: object) -> list[tuple[str, object]]:
    """An object's attributes, from its `__dict__` and its slots."""
    fields = list(getattr(thing, "__dict__", {}).items()) if not isinstance(thing, type) else []
    for klass in type(thing).__mro__:
        for name in klass.__dict__.get("__slots__", ()):
            if isinstance(name, str) and hasattr(thing, name):
                fields.append((name, getattr(thing, name)))
    return fields


def cache_memory() -> dict[str, int]:
    """What the hot caches really hold against what they account (issue 28 point 1): every
    live `HotCache`'s accounted bytes, the bytes its chunks span (runs of pages: address
    space, resident only as far as written) and its flat arrays' (a cache's arrays keep
    evicted batches' entries until compacted); the page pool's pages handed out and given
    back (`danube.machines.memory.pages`)."""
    from danube.machines.memory.pages import PAGE, PAGES
    from danube.machines.wal.cache import HotCache

    totals = {"caches": 0, "holding": 0, "accounted": 0, "chunks": 0, "chunk_bytes": 0}
    totals |= {"arrays": 0}
    for each in gc.get_objects():
        if type(each) is not HotCache:
            continue
        totals["caches"] += 1
        totals["holding"] += each.bytes > 0
        totals["accounted"] += each.bytes
        totals["chunks"] += len(each._chunks)
        totals["chunk_bytes"] += sum(len(chunk) for chunk in each._chunks)
        arrays = (each._firsts, each._sizes, each._chunk_of, each._records_at, each._starts)
        totals["arrays"] += sum(sys.getsizeof(a) for a in arrays if len(a))
    pages = PAGES.stats()
    totals |= {"page_slabs": pages.slabs, "pages_held_bytes": pages.in_use * PAGE}
    totals |= {"pages_given_back": pages.given_back}
    return totals


_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
"""Skipped as owners: a proxy whose object is gone raises ReferenceError on any look at it
(`isinstance` included), and a live one is its object, counted as itself."""


def container_lengths(
    top: int = 25, fields_top: int | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Where entries pile up: the `top` lists, dicts, sets and deques with the most entries
    (with what holds each), and the attributes (`Owner.field`) whose containers hold the most
    entries summed over every owner. A structure that grows with every message keeps its
    object count, only its length grows, so the counts by type cannot show it; and one
    spread over 1,000 topics is short in each, so only the sum by attribute shows it. The
    objects `gc.freeze()` moved out of the collector's view at start-up (the long-lived
    tables made then) are scanned too: unfrozen and left so, so that the counts by type of
    this dump and the later ones see every object alike (frozen again, everything alive now
    would vanish from the next dump's counts). A container several owners share (the topic
    table's set of touched topics, held by every topic's record) counts once per field."""
    gc.unfreeze()
    objects = gc.get_objects()
    kinds = (list, dict, set, deque_type)
    sized = sorted(
        ((len(each), id(each)) for each in objects if type(each) in kinds), reverse=True
    )[:top]
    by_field: dict[str, list[int]] = {}
    counted: set[tuple[str, int]] = set()
    for owner in objects:
        if type(owner) in kinds or type(owner) in _PROXIES or isinstance(owner, (type, FrameType)):
            continue
        try:
            fields = _owner_fields(owner)
        except Exception:  # a property or descriptor that raises: not ours to judge
            continue
        for name, value in fields:
            if type(value) in kinds:
                field = f"{type(owner).__qualname__}.{name}"
                entry = by_field.setdefault(field, [0, 0])
                entry[1] += 1
                if (field, id(value)) not in counted:
                    counted.add((field, id(value)))
                    entry[0] += len(value)  # type: ignore[arg-type]
    wanted = {ident for _, ident in sized}
    found = {id(each): each for each in objects if id(each) in wanted}
    del objects
    largest = []
    for length, ident in sized:
        thing = found[ident]
        holders = [h for h in gc.get_referrers(thing) if h is not found]
        largest.append(
            {
                "len": length,
                "what": _describe(thing)[:160],
                "held_by": [_describe(h)[:200] for h in holders[:2]],
            }
        )
    fields_ranked = sorted(by_field.items(), key=lambda kv: -kv[1][0])[: fields_top or top]
    return {
        "largest": largest,
        "by_field": [
            {"field": name, "entries": total, "owners": owners}
            for name, (total, owners) in fields_ranked
        ],
    }


def snapshot(top: int = 60) -> dict[str, Any]:
    """Everything the dump holds, after a full collection (with `DANUBE_MEMORY_GARBAGE` set,
    what that collection freed, by type: the reference cycles left to the collector)."""
    garbage: collections.Counter[str] = collections.Counter()
    if os.environ.get(GARBAGE_ENV):
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            collected = gc.collect()
            garbage.update(
                f"{type(each).__module__}.{type(each).__qualname__}" for each in gc.garbage
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    collected = gc.collect() if not garbage else collected
    types = collections.Counter(
        f"{type(each).__module__}.{type(each).__qualname__}" for each in gc.get_objects()
    )
    out: dict[str, Any] = {
        "rss": _rss(),
        "collected": collected,
        "allocated_blocks": sys.getallocatedblocks(),
        "gc_objects": sum(types.values()),
        "mallinfo2": mallinfo2(),
        "pymalloc": pymalloc_stats(),
        "types": dict(types.most_common(top)),
    }
    if garbage:
        out["garbage"] = dict(garbage.most_common(top))
    wanted = os.environ.get(REFERRERS_ENV)
    if wanted:
        out["referrers"] = {name: referrers(name) for name in wanted.split(",")}
    if os.environ.get(CONTAINERS_ENV):
        out["containers"] = container_lengths()
        out["caches"] = cache_memory()
    if tracemalloc.is_tracing():
        traced = tracemalloc.take_snapshot().statistics("lineno")
        out["traced_bytes"] = sum(stat.size for stat in traced)
        out["traced_top"] = [
            {"where": str(stat.traceback), "bytes": stat.size, "count": stat.count}
            for stat in traced[:top]
        ]
    return out


def install_from_environment() -> bool:
    """Installs the SIGUSR2 dump when `DANUBE_MEMORY_DUMP` is set (the main thread, before the
    event loop starts); returns whether it did."""
    where = os.environ.get(DUMP_ENV)
    if not where:
        return False
    directory = Path(where)
    directory.mkdir(parents=True, exist_ok=True)
    frames = int(os.environ.get(TRACE_ENV) or 0)
    late = os.environ.get(TRACE_LATE_ENV) == "1"
    if frames and not late:
        tracemalloc.start(frames)
    dumped = 0

    def dump(signum: int, frame: FrameType | None) -> None:
        nonlocal dumped
        dumped += 1
        if frames and late and dumped == 1:  # this dump untraced; what follows traced
            path = directory / "dump-1.json"
            path.with_suffix(".tmp").write_text(json.dumps(snapshot(), indent=1))
            path.with_suffix(".tmp").rename(path)
            tracemalloc.start(frames)
            return
        path = directory / f"dump-{dumped}.json"
        path.with_suffix(".tmp").write_text(json.dumps(snapshot(), indent=1))
        path.with_suffix(".tmp").rename(path)
        if tracemalloc.is_tracing():  # the whole trace, for a diff between two dumps
            # written whole, then renamed: a reader waiting for the file never sees half of it
            tracemalloc.take_snapshot().dump(str(path.with_suffix(".trace.tmp")))
            path.with_suffix(".trace.tmp").rename(path.with_suffix(".trace"))

    signal.signal(signal.SIGUSR2, dump)
    return True
