"""Which build of the kernels this process runs: the ahead-of-time module (`_aot*.so`, built by
`python -m danube.cli.build_kernels`) when it is present and current, else numba's JIT (`jit.py`).

Why: importing numba and LLVM costs a process about 125 MiB of RSS (measured: `import numba`
154 MiB maxrss against 30 MiB for numpy), which a broker under a memory budget (issue 28,
spec/memory.md) cannot spare. The ahead-of-time module is the same numba sources compiled once
per machine into a C extension that needs neither at run time.

Current means built from these very sources for this CPU: the build bakes `source_key()` (a
hash of every kernel source and of the CPU's identity) into the module, and a module whose key
differs is never used, silently or not: `REASON` says why the JIT runs instead, and the broker
logs it.

One difference between the builds: the module's functions hold the GIL while they run (pycc's
wrappers do not release it, where the JIT's `nogil=True` does); nothing relies on that (no
kernel runs in a thread for parallelism), but a 64 MiB recovery scan holds it for ~10 ms.

`DANUBE_KERNELS` chooses: `auto` (the default, as above), `jit` (never the module), `aot` (the
module or an ImportError: for tests and benchmarks that must measure it).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pathlib
import platform
from types import ModuleType

_HERE = pathlib.Path(__file__).parent
SOURCES = (
    _HERE / "jit_crc32c.py",
    _HERE / "jit_frames.py",
    _HERE / "jit_batches.py",
    _HERE / "jit.py",
    _HERE / "twins.py",
    _HERE / "record_fields.py",
    _HERE.parent / "cli" / "build_kernels.py",
    _HERE.parent / "machines" / "wal" / "records.py",
    _HERE.parent / "machines" / "wal" / "layout.py",
    _HERE.parent / "values" / "frozen.py",
    _HERE.parent / "values" / "varint.py",
)
"""Every file whose text the compiled kernels depend on: the numba sources and every module
they import (`record_fields` takes its reason codes and limits from `records`, `twins` the
frame layout and the CRC polynomial from `layout`); `tests/kernels/test_aot.py` checks that
this list holds every module the JIT's sources load."""
AOT_MODULE = "danube.kernels._aot"
MODES = ("auto", "aot", "jit")


def cpu_identity() -> str:
    """The build machine's CPU as far as compiled code cares: the model and feature flags of
    /proc/cpuinfo's first processor (the module is compiled for the host CPU), else the
    architecture."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    first = text.split("\n\n", 1)[0]
    keep = [
        line for line in first.splitlines() if line.split(":")[0].strip() in ("model name", "flags")
    ]
    return "\n".join([platform.machine(), *keep])


def source_key() -> int:
    """63 bits of SHA-256 over the kernel sources and `cpu_identity()`."""
    digest = hashlib.sha256()
    for path in SOURCES:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(cpu_identity().encode())
    return int.from_bytes(digest.digest()[:8], "little") >> 1


def load_aot() -> tuple[ModuleType | None, str]:
    """(the ahead-of-time module, "") when it is built and current, else (None, why not)."""
    try:
        module = importlib.import_module(AOT_MODULE)
    except ImportError as error:
        return None, f"the ahead-of-time kernels are not built ({error})"
    if module.source_key() != source_key():
        return None, (
            f"the ahead-of-time kernels {module.__file__} were built from other sources or "
            "for another CPU: rebuild with `python -m danube.cli.build_kernels`"
        )
    return module, ""


def load_jit() -> ModuleType:
    return importlib.import_module("danube.kernels.jit")


def choose(mode: str) -> tuple[ModuleType, str, str]:
    """(kernels, "aot" or "jit", why not aot)."""
    if mode not in MODES:
        raise ValueError(f"DANUBE_KERNELS={mode!r}: expected one of {', '.join(MODES)}")
    if mode != "jit":
        module, reason = load_aot()
        if module is not None:
            return module, "aot", ""
        if mode == "aot":
            raise ImportError(f"DANUBE_KERNELS=aot: {reason}")
        return load_jit(), "jit", reason
    return load_jit(), "jit", "DANUBE_KERNELS=jit"


ACTIVE, IMPLEMENTATION, REASON = choose(os.environ.get("DANUBE_KERNELS", "auto"))
"""The kernels every entry point (`crc32c.crc32c`, `frames.scan_frames`, `batches.stamp_frame`,
...) calls; tests swap `ACTIVE` to run the same checks over both builds."""
