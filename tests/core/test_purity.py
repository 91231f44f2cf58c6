"""The pure layers stay pure (design brief): no module of theirs imports what does I/O, reads
a clock, or draws from global randomness. A `random.Random` handed in by a driver is fine,
so `random` may be imported for its type, but none of its module functions may be called."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "danube"
PURE = ("core", "dispatch", "wal", "tiering", "cluster", "node", "schema", "requests")
DRIVERS = ("danube.broker", "danube.protoc", "danube.client", "danube.cli", "danube.localcluster")
"""The project's own modules that do I/O: a pure module reaching them is no longer pure."""
FORBIDDEN = {
    "asyncio", "datetime", "os", "pathlib", "shutil", "socket", "subprocess", "tempfile",
    "threading", "time", "trio", "trio_asyncio",
}  # fmt: skip


def modules() -> list[Path]:
    return sorted(path for package in PURE for path in (SRC / package).rglob("*.py"))


def impurities(path: Path) -> list[str]:
    """In line order (`ast.walk` goes breadth-first)."""
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
            if name.split(".")[0] in FORBIDDEN or name.startswith(DRIVERS)
        ]
    return [f"line {line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_a_pure_module_does_no_io_and_reads_no_clock(path: Path) -> None:
    assert impurities(path) == []


def test_the_check_sees_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nfrom time import monotonic\nimport random\nrandom.random()\n"
        "from danube.protoc import compile_proto\n"
    )
    assert impurities(sample) == [
        "line 1: imports os",
        "line 2: imports time",
        "line 4: random.random (global randomness)",
        "line 5: imports danube.protoc",
    ]
