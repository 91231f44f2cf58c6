"""The numba kernels compiled, or loaded from numba's cache, before the broker says it is
ready (issue 26). With the ahead-of-time build (`danube.kernels.loaded`) there is nothing to
compile and this takes milliseconds; what follows is about the JIT fallback.

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
    build: str
    """"aot" or "jit" (`danube.kernels.loaded`)."""
    cache_dir: str
    """Where the kernels' compiled code is: the ahead-of-time module's file, or numba's cache."""
    why_jit: str
    """Why the ahead-of-time module is not used ("" when it is)."""


def warm_kernels() -> Warmed:
    """Calls every kernel the broker uses on a tiny valid input; blocking (run it in a
    worker thread: numba's compiler holds the GIL for long stretches, but the event loop
    keeps answering `/healthz` between them)."""
    started = time.perf_counter()
    from danube.kernels import crc32c, find_frame, loaded, scan_frames
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
    cache = loaded.ACTIVE.__file__ if loaded.IMPLEMENTATION == "aot" else loaded.ACTIVE.cache_dir()
    return Warmed(time.perf_counter() - started, loaded.IMPLEMENTATION, str(cache), loaded.REASON)
