"""Brokers' `policy_dropped` log events become the audit's settlement log
(danube.audit.events), read back as Parquet rows; unreadable event lines are counted, never
guessed at."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from danube.audit.events import convert, main, settlements
from danube.audit.logs import SETTLEMENTS, Settlement
from danube.runtime.io_port import format_event

PREFIX = "2026-11-29 16:00:00,000 WARNING danube.runtime.io_port "


def line(**fields: object) -> str:
    return PREFIX + format_event("policy_dropped", fields) + "\n"


def test_an_event_line_is_a_settlement_whatever_its_quoting() -> None:
    lines = [
        "2026-11-29 INFO danube event=topic_loaded topic=/default/t kept_local_wal=False\n",
        line(topic="/default/t", subscription="plain", offset=4, attempts=3),
        line(topic="/default/t", subscription="with space 'and quote'", offset=5, attempts=1),
    ]
    assert list(settlements(lines)) == [
        Settlement("/default/t", "plain", 4, "dropped", 3),
        Settlement("/default/t", "with space 'and quote'", 5, "dropped", 1),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        PREFIX + "event=policy_dropped topic=/default/t subscription=s offset=",  # cut short
        PREFIX + "event=policy_dropped topic=/default/t offset=3 attempts=1",  # no subscription
        PREFIX + "event=policy_dropped topic=/default/t subscription='open offset=3 attempts=1",
    ],
)
def test_an_unreadable_event_line_is_returned_not_guessed(bad: str) -> None:
    assert list(settlements([bad])) == [bad]


def test_the_command_writes_the_settlement_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker_log = tmp_path / "broker.log"
    broker_log.write_text(
        line(topic="/default/t-part-2", subscription="s", offset=9, attempts=2)
        + PREFIX
        + "event=policy_dropped topic=/default/t\n"
    )
    assert main(["--logs", str(tmp_path / "logs"), str(broker_log)]) == 0
    out = capsys.readouterr()
    assert "1 settlements written" in out.out and "1 policy_dropped lines" in out.err
    parts = sorted((tmp_path / "logs" / SETTLEMENTS).glob("*.parquet"))
    rows = pq.read_table(parts).to_pylist()
    assert rows == [
        {
            "topic": "/default/t-part-2",
            "partition": 2,
            "subscription": "s",
            "offset": 9,
            "action": "dropped",
            "attempts": 2,
        }
    ]
    assert convert([], tmp_path / "empty") == (0, 0)


def test_a_missing_log_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--logs", str(tmp_path), str(tmp_path / "nope.log")])
    assert exit_.value.code == 2
