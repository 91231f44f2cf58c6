"""The numba kernels compiled, or loaded from numba's cache, before the broker says it is
ready (issue 26).

Without this, the first client batch paid the compile (5–10 s on a fresh install) while
`/readyz` already answered ready, and a client's first send timed out or looked hung. Each
kernel is called here once for every argument type the broker's paths pass it (`bytes`, and
a read-only memoryview for the CRC and the frame scan), since numba compiles per type.

Where the compiled code is kept: numba's rule (`NUMBA_CACHE_DIR` when set; otherwise
`__pycache__` next to the kernels' sources when that is writable, as in a checkout or an
image that warmed the cache at build time with `danube-broker --warm-kernels`; otherwise a
per-user directory, `~/.cache/numba` style). The broker logs the directory it used. A cache
is valid for the CPU it was built on (numba keys entries by CPU name and features);
`NUMBA_CPU_NAME=generic` builds one any x86-64 can load, without the SSE4.2 CRC path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Warmed:
    seconds: float
    cache_dir: str
    """Where numba keeps the kernels' compiled code (see the module's doc)."""


def _cache_dir() -> str:
    from danube.kernels import frames

    # numba internals (`Dispatcher._cache._cache_path`): informative only, so any change
    # there gives "unknown", never an error.
    path = getattr(getattr(frames._scan, "_cache", None), "_cache_path", None)
    return str(path) if path else "unknown"


def warm_kernels() -> Warmed:
    """Calls every kernel the broker uses on a tiny valid input; blocking (run it in a
    worker thread: numba's compiler holds the GIL for long stretches, but the event loop
    keeps answering `/healthz` between them)."""
    started = time.perf_counter()
    from danube.kernels import crc32c, find_frame, scan_frames
    from danube.machines.wal import batches, checkpoint, format, records

    header = format.encode_segment_header("/warm/up", 0, 0)
    record = records.encode(records.Record(request_id=1, payload=b"warm", has_msg_id=False))
    frame = format.encode_frame(0, 0, [record])
    segment = header + frame
    for data in (segment, memoryview(segment).toreadonly()):
        crc32c(data)
        scan_frames(data, len(header), len(data), 0)
        find_frame(data, len(header), len(data))
    format.scan_segment(segment + b"\x00" * 8)
    checkpoint.decode_checkpoint(checkpoint.encode_checkpoint(checkpoint.next_mark(None, 0)))
    batch = batches.check_batch(frame)
    batches.stamp(batch, 0, 0, 1, "/warm/up", "http://127.0.0.1:6650")
    return Warmed(time.perf_counter() - started, _cache_dir())
