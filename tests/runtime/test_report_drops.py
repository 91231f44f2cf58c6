"""The broker's periodic drop report: non-reliable drops are summed up in the log; a poison
policy's drops are logged where they happen (`policy_dropped`) and not again here."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from danube.runtime import server


class _Core:
    def drop_counts(self) -> dict[tuple[str, str, str], int]:
        return {
            ("/default/t", "s", "queue_full"): 3,
            ("/default/t", "p", "poison_policy"): 2,
        }


def test_poison_drops_are_not_reported_again(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        with trio.move_on_after(server.DROP_CHECK_SECONDS * 2.5):
            await server._report_drops(_Core())  # type: ignore[arg-type]

    caplog.set_level(logging.WARNING, logger="danube")
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    lines: list[Any] = [
        r.getMessage() for r in caplog.records if "messages_dropped" in r.getMessage()
    ]
    assert any("reason=queue_full" in line for line in lines), lines
    assert not any("poison_policy" in line for line in lines), lines
