"""The hostile suite's report: printed at the end of every pytest run that ran any of it, and
written as JSON to $HOSTILE_REPORT when set (bench/hostile.py sets it; bench/RESULTS.md quotes
it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.ledger import LEDGER
from tests.hostile.secured import SecuredBroker, start_secured


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    """A broker with TLS and tokens on (issue 25, deliver 7), one per module that runs its
    scenarios secured, as each plain module has its own: one broker shared by the whole
    suite carried every module's leftovers (RSS 89 -> 140 MB) into the next one's
    HealthCheck bound."""
    secured = start_secured(tmp_path_factory.mktemp("hostile-secured"))
    try:
        yield secured
    finally:
        watched = secured.watched
        if watched.process.alive:  # the run since the last module's checkpoint, reported
            watched.finish(reread=False)
        if not watched.run.health_checks:  # nothing ran since: no line in the report
            LEDGER.runs.pop(watched.run.name, None)
        watched.close()


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
