"""The kernels as numba compiles them at run time (JIT, with numba's on-disk cache): the build
`danube.kernels.loaded` falls back to when the ahead-of-time module is not built or not current.

It has the ahead-of-time module's interface (`danube.cli.build_kernels` exports the same
names, from the same sources): `crc_bytes` and `crc_view` (CRC32C of a `bytes` or of a
read-only memoryview, `crc32c_update`'s arguments), `scan`, `find`, `check`, `stamp` (the
frame scan, the torn-tail search, the batch check and stamping), `source_key` and `hardware`.
Importing this module imports numba and LLVM (about 125 MiB of RSS), which is why the broker
prefers the other build.
"""

from __future__ import annotations

from typing import Any

from numba import types

from danube.kernels.jit_batches import _check as check
from danube.kernels.jit_batches import _stamp as stamp
from danube.kernels.jit_crc32c import HARDWARE, crc32c_update
from danube.kernels.jit_frames import _find as find
from danube.kernels.jit_frames import _scan as scan

crc_view = crc32c_update


def _resolve_crc_bytes(data: bytes, start: int, stop: int, crc: int) -> int:
    """`crc_bytes` on its first call: the kernel's compiled code for `bytes`, called without
    the dispatcher, which matches the arguments' numba types on every call (0.23 against
    0.56 µs a call here; the simulator checksums every segment header and frame it writes or
    reads). Any other build of the kernel (no `overloads`) is called as it is."""
    global crc_bytes
    found = crc32c_update(data, start, stop, crc)  # compiles, or loads the cached code
    overloads = getattr(crc32c_update, "overloads", {})
    crc_bytes = next(
        (r.entry_point for sig, r in overloads.items() if isinstance(sig[0], types.Bytes)),
        crc32c_update,
    )
    return int(found)


crc_bytes: Any = _resolve_crc_bytes


def source_key() -> int:
    """The JIT always runs the sources as they are: it matches any key."""
    from danube.kernels.loaded import source_key as current

    return current()


def hardware() -> int:
    """1 when the CRC32C kernel uses the SSE4.2 instruction."""
    return int(HARDWARE)


def cache_dir() -> str:
    """Where numba keeps the kernels' compiled code ("unknown" if numba's internals moved)."""
    # numba internals (`Dispatcher._cache._cache_path`): informative only.
    path = getattr(getattr(scan, "_cache", None), "_cache_path", None)
    return str(path) if path else "unknown"


__all__ = ["check", "crc_bytes", "crc_view", "find", "scan", "stamp"]
