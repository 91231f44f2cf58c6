"""The hostile suite's report: printed at the end of every pytest run that ran any of it, and
written as JSON to $HOSTILE_REPORT when set (bench/hostile.py sets it; bench/RESULTS.md quotes
it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hostile.ledger import LEDGER


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LEDGER.runs:
        return
    terminalreporter.section("hostile input")
    for line in LEDGER.summary_lines():
        terminalreporter.write_line(line)
    target = os.environ.get("HOSTILE_REPORT")
    if target:
        LEDGER.write(Path(target))
        terminalreporter.write_line(f"report written to {target}")
