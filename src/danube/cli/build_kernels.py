"""`python -m danube.cli.build_kernels`: compiles the kernels ahead of time into the C extension
`danube/kernels/_aot*.so`, for this machine's CPU, with numba's `numba.pycc` (the same numba
sources the JIT runs; `jit.py` has the same interface). A broker then runs them without
importing numba or LLVM (spec/memory.md, "Baseline"); `danube.kernels.loaded` says when it may.

Needs a C compiler and Python's headers (`Python.h`): without them it says so in one line and exits
3, and processes keep numba's JIT kernels (scripts/bootstrap.sh relies on this). Takes about 10 s
of CPU; nothing when the module is already current (`--force` builds anyway). The module is built
per machine (git-ignored): it is compiled for the host CPU and carries `loaded.source_key()`, so a
copy on another CPU or after a change of a kernel source is not used. `--check` only reports
whether the tools are there (exit 0 or 3).

numba.pycc is deprecated in numba 0.57+ but present (0.68 here); if it goes, this build fails
with its error and the JIT remains.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import shutil
import sys
import sysconfig
import tempfile
import warnings

NO_TOOLS = 3
PACKAGE_DIR = pathlib.Path(__file__).parent.parent / "kernels"


def missing_tools() -> str:
    """What the build lacks ("" when nothing): a C compiler, setuptools, Python's headers."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    missing = []
    if shutil.which(compiler) is None and shutil.which("cc") is None:
        missing.append(f"a C compiler ({compiler})")
    if importlib.util.find_spec("setuptools") is None:  # numba.pycc drives the compiler with it
        missing.append("setuptools")
    headers = pathlib.Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        missing.append(f"Python's headers ({headers})")
    return " and ".join(missing)


def compile_module(output_dir: pathlib.Path) -> pathlib.Path:
    """Compiles `_aot` into `output_dir` (through a temporary directory, then renamed into place,
    so a running process never loads a half-written file); returns its path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's deprecation warning: this module is the reason
        from numba import types
        from numba.pycc import CC

    from danube.kernels import jit
    from danube.kernels.loaded import source_key

    key = source_key()
    view = types.MemoryView(types.uint8, 1, "C", readonly=True)
    data = types.Bytes(types.uint8, 1, "C", readonly=True)
    int64s = types.Array(types.int64, 1, "C")
    rows = types.Array(types.int64, 2, "C")
    source = types.Array(types.uint8, 1, "C", readonly=True)
    out = types.Array(types.uint8, 1, "C")
    i8, ip = types.int64, types.intp
    hardware = int(jit.hardware())
    crc_update, scan, find, check, stamp = (
        jit.crc_view,
        jit.scan,
        jit.find,
        jit.check,
        jit.stamp,
    )
    with tempfile.TemporaryDirectory(prefix="danube-aot-") as scratch:
        cc = CC("_aot")
        cc.output_dir = scratch
        cc.target_cpu = "host"  # the SSE4.2 intrinsic, when `jit.hardware()`, needs it
        cc.verbose = False

        @cc.export("crc_bytes", i8(data, ip, ip, i8))
        def crc_bytes(buf, start, stop, crc):  # type: ignore[no-untyped-def]
            return crc_update(buf, start, stop, crc)

        @cc.export("crc_view", i8(view, ip, ip, i8))
        def crc_view(buf, start, stop, crc):  # type: ignore[no-untyped-def]
            return crc_update(buf, start, stop, crc)

        @cc.export("scan", types.Tuple((ip, rows))(view, ip, ip, i8))
        def scan_export(buf, start, end, expected):  # type: ignore[no-untyped-def]
            return scan(buf, start, end, expected)

        @cc.export("find", ip(view, ip, ip))
        def find_export(buf, start, end):  # type: ignore[no-untyped-def]
            return find(buf, start, end)

        @cc.export("check", types.UniTuple(i8, 2)(view, ip, int64s, int64s))
        def check_export(buf, count, payloads, positions):  # type: ignore[no-untyped-def]
            return check(buf, count, payloads, positions)

        @cc.export("stamp", ip(source, ip, view, i8, i8, out, int64s))
        def stamp_export(buf, count, msg_id, base, ms, into, positions):  # type: ignore[no-untyped-def]
            return stamp(buf, count, msg_id, base, ms, into, positions)

        @cc.export("source_key", i8())
        def source_key_export():  # type: ignore[no-untyped-def]
            return key

        @cc.export("hardware", i8())
        def hardware_export():  # type: ignore[no-untyped-def]
            return hardware

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cc.compile()
        (built,) = pathlib.Path(scratch).glob("_aot*.so")
        target = output_dir / built.name
        staged = output_dir / f".{built.name}.{os.getpid()}"
        shutil.copyfile(built, staged)
        os.replace(staged, target)
    return target


def _current_module() -> str:
    """The built module's path when it matches the sources and this CPU, else ""."""
    from danube.kernels.loaded import load_aot

    module, _ = load_aot()
    return str(module.__file__) if module is not None else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m danube.cli.build_kernels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check for a C compiler, Python's headers and setuptools",
    )
    parser.add_argument("--force", action="store_true", help="build even if the module is current")
    args = parser.parse_args(argv)
    lacking = missing_tools()
    if lacking:
        print(
            f"danube.cli.build_kernels: cannot build, missing {lacking}: brokers will use numba's "
            "JIT kernels",
            file=sys.stderr,
        )
        return NO_TOOLS
    if args.check:
        return 0
    if not args.force:
        current = _current_module()
        if current:
            print(f"danube.cli.build_kernels: {current} is current", file=sys.stderr)
            return 0
    target = compile_module(PACKAGE_DIR)
    print(f"danube.cli.build_kernels: built {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
