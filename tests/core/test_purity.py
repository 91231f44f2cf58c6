"""The pure layers stay pure (design brief, "Layers"): no module of theirs imports what does
I/O, reads a clock, or draws from global randomness, and imports go one way, down the layers.
A `random.Random` handed in by a driver is fine, so `random` may be imported for its type, but
none of its module functions may be called.

Two checks, because a direct one passes while an import two steps away loads trio:

- Each machine module's own source (`impurities`).
- Everything a machine module reaches (`reach`): an AST walk of `import` and `from` statements
  inside the danube package, resolved to files, following each one, and counting the package
  `__init__` that importing a submodule runs first. Imports under `if TYPE_CHECKING:` run
  never; a package's lazy attributes (a `_LAZY` table of name → module, PEP 562) are followed
  only where a module names them. Function-level imports count: they run when the function
  does. The walk sees danube's code only; a third-party library's own imports are its
  business (numba starts no thread, but loads `threading`), so `a_fresh_interpreter` adds the
  runtime check for the third-party I/O frameworks, against a baseline interpreter.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src"
SRC = ROOT / "danube"

# -- the layers ---------------------------------------------------------------------------------

VALUES = ("danube.values", "danube.keys")
"""Names, errors, config and keys: they import nothing of the layers above."""
MACHINES = (
    *VALUES,
    "danube.effects",
    "danube.interpreter",
    "danube.kernels",
    "danube.machines",
    "danube.metadata.model",
    "danube.metadata.state",
)
"""The pure state machines and what they are made of (values, kernels, the metadata store's
values and its in-memory state): inputs in, effects out."""
PURE = ("values", "machines", "effects", "interpreter")
"""Packages whose own sources are checked line by line (`impurities`)."""
DRIVERS = (
    "danube.audit",
    "danube.runtime",
    "danube.cli",
    "danube.client",
    "danube.localcluster",
    "danube.metadata.embedded",
    "danube.metadata.etcd",
    "danube.metadata.memory",
    "danube.protoc",
)
"""The project's own modules that do I/O (the runtime, the clients and tools, the store
backends; not their interface, `danube.metadata.store`, a `Protocol` that imports nothing
of theirs): a pure module reaching them is no longer pure."""
FORBIDDEN = {
    # I/O, files and processes
    "fcntl", "mmap", "os", "pathlib", "shutil", "subprocess", "tempfile",
    # the network and event loops
    "asyncio", "select", "selectors", "socket", "ssl", "trio", "trio_asyncio",
    "grpc", "grpclib", "h2", "etcd3", "fsspec", "s3fs",
    # clocks, threads, signals and logging (a machine returns a Log effect instead)
    "datetime", "time", "threading", "multiprocessing", "concurrent", "signal", "logging",
}  # fmt: skip
EXEMPT = {
    ("danube.kernels.batches", "threading"): "a `threading.local` scratch buffer per calling "
    "thread (the broker runs kernels in worker threads); nothing is started or waited on",
    ("danube.kernels.loaded", "os"): "chooses once, at import, which build of the same kernels "
    "runs (the ahead-of-time module or numba's JIT: `DANUBE_KERNELS`); both compute the same "
    "results, and no kernel does I/O",
    ("danube.kernels.loaded", "pathlib"): "hashes the kernel sources and reads the CPU's "
    "identity once, at import, to tell whether the ahead-of-time module is current",
    ("danube.machines.memory.pages", "mmap"): "the hot caches' page allocator: anonymous "
    "slabs and `madvise` give evicted memory back to the kernel at once (issue 28); no file, "
    "no clock, and what it hands out is decided by the caches and the ledger, not by it",
    ("danube.machines.memory.pages", "threading"): "a lock over the free maps, because a "
    "cache collected as garbage gives its pages back from whichever thread the collector runs "
    "in; nothing is started or waited on",
}
"""(module, import) pairs allowed on purpose, each with its reason."""
KNOWN_IMPURE: dict[str, str] = {}
"""Machine modules whose walk still finds something, each with its reason and owner: a list the
lead shortens, never a place to hide a new one (the walk still runs on each, and the test
fails once one comes clean, so the entry is removed)."""
RUNTIME_FORBIDDEN = (
    "trio",
    "trio_asyncio",
    "grpclib",
    "grpc",
    "asyncio",
    "etcd3",
    "fsspec",
    "s3fs",
)
"""Top-level modules a fresh interpreter must not have loaded after importing every machine
module (numba loads `threading` and `socket` itself, so those are left to the AST walk)."""


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


# -- resolving modules ----------------------------------------------------------------------------


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of a module of ours, None if there is none (a name, not a module)."""
    base = root.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else None


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def machine_modules(root: Path = ROOT) -> list[str]:
    found = []
    for name in MACHINES:
        path = module_file(name, root)
        if path is not None and path.name != "__init__.py":
            found.append(name)
        elif path is not None:
            found += [module_name(p, root) for p in sorted(path.parent.rglob("*.py"))]
    return sorted(set(found))


def _lazy_table(path: Path) -> dict[str, str]:
    """A package's `_LAZY = {"Name": "module", ...}` (PEP 562 attributes), else {}."""
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["_LAZY"]
            and isinstance(node.value, ast.Dict)
        ):
            return {
                k.value: v.value
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
    return {}


def _runs(node: ast.AST) -> Iterator[ast.AST]:
    """Every node that may run, skipping `if TYPE_CHECKING:` bodies (their `else` runs) and a
    module's `__getattr__` (its imports are followed through `_LAZY` where they are named)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield other
                yield from _runs(other)
            continue
        if isinstance(child, ast.FunctionDef) and child.name == "__getattr__":
            continue
        yield child
        yield from _runs(child)


def imports(name: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import module `name` may run, resolved to module names: `from
    pkg import sub` names `pkg.sub` when that is a module, `pkg`'s lazy attribute's module
    when it is one, else `pkg`."""
    path = module_file(name, root)
    assert path is not None, name
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in _runs(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            init = module_file(base, root) if base.startswith("danube") else None
            lazy = _lazy_table(init) if init is not None and init.name == "__init__.py" else {}
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if base.startswith("danube") and module_file(full, root) is not None:
                    found.append((node.lineno, full))
                elif alias.name in lazy:
                    found.append((node.lineno, lazy[alias.name]))
                else:
                    found.append((node.lineno, base))
    return found


def _with_parents(name: str) -> list[str]:
    """Importing `a.b.c` runs `a`, `a.b` and `a.b.c`."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


# -- the walk -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reached:
    module: str
    via: tuple[str, ...]
    """The import chain from the start, as `module:line` steps."""


def reach(start: str, root: Path = ROOT) -> dict[str, Reached]:
    """Every module of ours that importing `start` may run, with one chain that gets there;
    modules outside danube are leaves, listed under their own name."""
    seen: dict[str, Reached] = {}
    queue = [Reached(m, ()) for m in _with_parents(start)]
    while queue:
        item = queue.pop(0)
        if item.module in seen:
            continue
        seen[item.module] = item
        if not item.module.startswith("danube") or module_file(item.module, root) is None:
            continue
        for line, imported in imports(item.module, root):
            targets = _with_parents(imported) if imported.startswith("danube") else [imported]
            for target in targets:
                if target not in seen:
                    queue.append(Reached(target, (*item.via, f"{item.module}:{line}")))
    return seen


def violations(start: str, allowed: tuple[str, ...] | None = None, root: Path = ROOT) -> list[str]:
    """What importing `start` may load that it must not: a forbidden library, a driver, or
    (with `allowed`, for a layer that may only import within itself) any danube module outside
    `allowed`. Each with the chain that reaches it."""
    found = []
    for item in reach(start, root).values():
        name, top = item.module, item.module.split(".")[0]
        importer = item.via[-1].partition(":")[0] if item.via else ""
        if top in FORBIDDEN and (importer, top) not in EXEMPT:
            why = "I/O, a clock, a thread or an event loop"
        elif _in(name, DRIVERS):
            why = "a driver"
        elif allowed is not None and top == "danube" and name != "danube":
            why = "" if _in(name, allowed) else "a layer above"
        else:
            why = ""
        if why:
            found.append(f"{name} ({why}) via {' -> '.join(item.via) or 'itself'}")
    return sorted(found)


@pytest.mark.parametrize("module", machine_modules())
def test_a_machine_loads_no_io_not_even_indirectly(module: str) -> None:
    if module in KNOWN_IMPURE:
        assert violations(module) != [], f"{module} is clean now: remove it from KNOWN_IMPURE"
    else:
        assert violations(module) == []


@pytest.mark.parametrize("module", [m for m in machine_modules() if _in(m, VALUES)])
def test_values_import_no_machine(module: str) -> None:
    """Values sit below machines: a value importing a machine turns the layers upside down
    (and makes a cycle as soon as the machine imports the value)."""
    assert violations(module, allowed=VALUES) == []


def test_a_fresh_interpreter_importing_every_machine_loads_no_io_framework() -> None:
    """The runtime check beside the AST walk: what the interpreter actually loaded, third-party
    libraries' own imports included, minus what a bare interpreter loads anyway."""
    listing = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    clean = [m for m in machine_modules() if m not in KNOWN_IMPURE]
    machines = "; ".join(f"import {m}" for m in clean)
    env_path = {"PYTHONPATH": str(ROOT)}
    base, after = (
        set(json.loads(_run(code, env_path))) for code in (listing, f"{machines}; {listing}")
    )
    loaded = sorted(m for m in after - base if m.split(".")[0] in RUNTIME_FORBIDDEN)
    assert loaded == []


def _run(code: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_walk_follows_imports_transitively(tmp_path: Path) -> None:
    """The walk must be able to fail: a planted package whose machine imports a value that
    imports a helper that imports trio, a machine reaching a driver through a package
    `__init__`, and one whose lazy attribute is a driver."""
    files = {
        "danube/__init__.py": "",
        "danube/values/__init__.py": "",
        "danube/values/value.py": "from danube.values import helper\n",
        "danube/values/helper.py": "def f():\n    import trio\n",
        "danube/machines/wal/__init__.py": "",
        "danube/machines/wal/machine.py": (
            "from . import checks\nfrom danube.values.value import X\n"
        ),
        "danube/machines/wal/checks.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import socket\n",
        "danube/metadata/__init__.py": "import danube.runtime.broker\n",
        "danube/metadata/model.py": "",
        "danube/machines/tiering/__init__.py": "",
        "danube/machines/tiering/reader.py": "from danube.metadata import model\n",
        "danube/machines/node/__init__.py": "_LAZY = {'Store': 'danube.runtime.store'}\n",
        "danube/machines/node/core.py": "from danube.machines.node import Store\n",
        "danube/runtime/__init__.py": "",
        "danube/runtime/broker.py": "import time\n",
        "danube/runtime/store.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert violations("danube.machines.wal.machine", root=tmp_path) == [
        "trio (I/O, a clock, a thread or an event loop) via danube.machines.wal.machine:2 -> "
        "danube.values.value:1 -> danube.values.helper:2"
    ]
    assert violations("danube.machines.tiering.reader", root=tmp_path) == [
        "danube.runtime (a driver) via danube.machines.tiering.reader:1 -> danube.metadata:1",
        "danube.runtime.broker (a driver) via danube.machines.tiering.reader:1 -> "
        "danube.metadata:1",
        "time (I/O, a clock, a thread or an event loop) via danube.machines.tiering.reader:1 -> "
        "danube.metadata:1 -> danube.runtime.broker:1",
    ]
    assert violations("danube.machines.node.core", root=tmp_path) == [
        "danube.runtime (a driver) via danube.machines.node.core:1",
        "danube.runtime.store (a driver) via danube.machines.node.core:1",
    ]
    assert violations("danube.values.value", allowed=("danube.values",), root=tmp_path) == [
        "trio (I/O, a clock, a thread or an event loop) via danube.values.value:1 -> "
        "danube.values.helper:2"
    ]
    assert violations("danube.machines.wal.machine", allowed=("danube.machines",), root=tmp_path)[
        0
    ] == ("danube.values (a layer above) via danube.machines.wal.machine:2")


# -- each module's own source ---------------------------------------------------------------------


def modules() -> list[Path]:
    return sorted(path for package in PURE for path in (SRC / package).rglob("*.py"))


def impurities(path: Path) -> list[str]:
    """In line order (`ast.walk` goes breadth-first); an `EXEMPT` pair is allowed here too."""
    module = module_name(path) if path.is_relative_to(ROOT) else ""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
            and node.attr != "Random"
        ):
            found.append((node.lineno, f"random.{node.attr} (global randomness)"))
            continue
        else:
            continue
        found += [
            (node.lineno, f"imports {name}")
            for name in names
            if (name.split(".")[0] in FORBIDDEN and (module, name.split(".")[0]) not in EXEMPT)
            or _in(name, DRIVERS)
        ]
    return [f"line {line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_a_pure_module_does_no_io_and_reads_no_clock(path: Path) -> None:
    assert impurities(path) == []


def test_the_check_sees_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nfrom time import monotonic\nimport random\nrandom.random()\n"
        "from danube.protoc import compile_proto\nimport mmap\n"
    )
    assert impurities(sample) == [
        "line 1: imports os",
        "line 2: imports time",
        "line 4: random.random (global randomness)",
        "line 5: imports danube.protoc",
        "line 6: imports mmap",  # exempt in the page allocator only
    ]
