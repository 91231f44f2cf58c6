"""Hot loops over whole buffers: CRC32C and the WAL frame scan (spec/wal-format.md), and the
check and stamping of published batches (spec/protocol.md).

`crc32c`, `scan_frames`, `find_frame` (and `batches.check_records`, `batches.stamp_frame`) are
Python entry points over numba kernels (sources `jit_crc32c.py`, `jit_frames.py`,
`jit_batches.py`); each has a plain-Python twin in `danube.kernels.twins` (`*_py`), the oracle
their tests compare against, for both builds.

Two builds of the same kernels, chosen once at import by `loaded.py`:

- **ahead of time** (`_aot*.so`, made per machine by `python -m danube.cli.build_kernels`, which
  scripts/bootstrap.sh runs): a C extension compiled by `numba.pycc` for the host CPU. Used when
  present and built from the current sources for this CPU (a key baked into it). A process then
  imports neither numba nor LLVM, about 125 MiB less RSS: why it exists (issue 28, a broker
  under a 256 MiB budget started at 186 MiB). Nothing to compile at run time.
- **JIT** (`jit.py`) otherwise, or with `DANUBE_KERNELS=jit`: importing it imports numba and
  numpy (0.3–0.6 s here). Each kernel compiles on its first call (bytes and read-only
  memoryviews are the only argument types: `crc32c.byte_view` turns any other buffer into the
  latter) and numba caches the machine code next to the sources (`__pycache__/*.nbi`, `*.nbc`,
  keyed by the CPU). The first process after an install or a change of the kernels pays the
  compile, about 5 s for all of them; later processes load them from the cache, and the first
  kernel call of a process, which also initialises numba's compiler, then takes 0.2–0.4 s.

Note: the package attribute `crc32c` is the function, which shadows the submodule of the same
name; import from the module with `from danube.kernels.crc32c import ...`.
"""

from danube.kernels.crc32c import crc32c
from danube.kernels.frames import find_frame, scan_frames
from danube.kernels.twins import (
    FrameScan,
    crc32c_py,
    find_frame_py,
    scan_frames_py,
)

__all__ = [
    "FrameScan",
    "crc32c",
    "crc32c_py",
    "find_frame",
    "find_frame_py",
    "scan_frames",
    "scan_frames_py",
]
