"""No hand-written module in src/danube/ is over 800 lines (issue 21): a module that long holds
more than one job, and a reader cannot tell from its name what is inside. The generated wire
types (`danube/proto/**`, betterproto's output) are not hand-written."""

from __future__ import annotations

from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 800
GENERATED = ("danube/proto/",)


def hand_written() -> list[str]:
    found = (p.relative_to(SRC).as_posix() for p in (SRC / "danube").rglob("*.py"))
    return sorted(p for p in found if not p.startswith(GENERATED))


def lines(module: str) -> int:
    return len((SRC / module).read_text().splitlines())


@pytest.mark.parametrize("module", hand_written())
def test_a_hand_written_module_is_at_most_800_lines(module: str) -> None:
    assert lines(module) <= MAX_LINES, f"{module}: {lines(module)} lines"
