"""The ahead-of-time build of the kernels (`danube.cli.build_kernels`, `danube.kernels.loaded`):
a broker that runs it imports neither numba nor LLVM (why it exists: issue 28, about 125 MiB of
RSS), a module built from other sources is never used, and a machine without a C compiler is
told so in one line and keeps the JIT. The kernels' results over this build are checked by the
other modules here (`conftest.kernel_build`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from danube.cli import build_kernels as build
from danube.kernels import loaded
from danube.localcluster.broker_process import BrokerProcess
from tests.kernels.conftest import AOT, AOT_MISSING

needs_aot = pytest.mark.skipif(AOT is None, reason=AOT_MISSING)


@needs_aot
def test_a_broker_process_with_the_aot_build_imports_no_numba() -> None:
    """Every module of the broker imported and its kernels warmed: no numba, no llvmlite."""
    script = (
        "import sys\n"
        "import danube.runtime.server, danube.cli.broker\n"
        "from danube.runtime.kernels_warm import warm_kernels\n"
        "warmed = warm_kernels()\n"
        "assert warmed.build == 'aot', warmed\n"
        "found = sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite'))\n"
        "assert not found, found\n"
    )
    env = {**os.environ, "DANUBE_KERNELS": "auto"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)


@needs_aot
def test_a_running_broker_maps_no_llvm(broker_factory: type[BrokerProcess], tmp_path: Path) -> None:
    """The real process, started as an operator starts it: its log names the build, and no
    numba or llvmlite library is mapped into it."""
    process = broker_factory(tmp_path / "data", env={"DANUBE_KERNELS": "auto"}).start()
    ready = next(line for line in process.log_lines if "event=kernels_ready" in line)
    assert "build=aot" in ready, ready
    maps = Path(f"/proc/{process.pid}/maps").read_text()
    assert "llvmlite" not in maps and "/numba/" not in maps


@needs_aot
def test_a_stale_build_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loaded, "source_key", lambda: 1)
    module, reason = loaded.load_aot()
    assert module is None and "built from other sources or for another CPU" in reason
    kernels, implementation, why = loaded.choose("auto")
    assert implementation == "jit" and kernels is loaded.load_jit() and why == reason
    with pytest.raises(ImportError, match="DANUBE_KERNELS=aot"):
        loaded.choose("aot")


def test_the_key_covers_every_kernel_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any change of any source the compiled code depends on changes the key."""
    copies = []
    for source in loaded.SOURCES:
        copy = tmp_path / source.parent.name / source.name
        copy.parent.mkdir(exist_ok=True)
        copy.write_bytes(source.read_bytes())
        copies.append(copy)
    monkeypatch.setattr(loaded, "SOURCES", tuple(copies))
    before = loaded.source_key()
    for copy in copies:
        text = copy.read_bytes()
        copy.write_bytes(text + b"\n")
        assert loaded.source_key() != before, copy
        copy.write_bytes(text)
    assert loaded.source_key() == before
    jit_sources = {p.name for p in Path(loaded.__file__).parent.glob("jit*.py")}
    assert jit_sources <= {p.name for p in loaded.SOURCES}


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of auto, aot, jit"):
        loaded.choose("fast")


def test_without_a_compiler_the_build_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert build.main([]) == build.NO_TOOLS
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a C compiler" in err and "numba's JIT" in err, err


WRAPPERS = frozenset({"__init__.py", "crc32c.py", "frames.py", "batches.py", "loaded.py"})
"""The Python entry points around the compiled functions: not compiled into the module."""


def test_the_key_covers_every_module_the_jit_sources_load() -> None:
    """A constant the kernels compile in may live in any module their sources import (the
    frame layout in `machines/wal/layout.py`, say): each such file must be in SOURCES, or a
    change of it would leave a stale module looking current."""
    program = (
        "import sys, danube.kernels.jit\n"
        "for name, module in sorted(sys.modules.items()):\n"
        "    if name.startswith('danube') and getattr(module, '__file__', None):\n"
        "        print(module.__file__)\n"
    )
    env = {**os.environ, "DANUBE_KERNELS": "jit"}
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, env=env
    )
    loaded_files = {Path(line) for line in result.stdout.split()}
    sources = {path.resolve() for path in loaded.SOURCES}
    missing = sorted(
        str(path)
        for path in loaded_files
        if path.suffix == ".py" and path.name not in WRAPPERS and path.resolve() not in sources
    )
    assert missing == [], f"kernel sources' imports missing from loaded.SOURCES: {missing}"
