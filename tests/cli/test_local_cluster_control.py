"""The commands a running `danube-local-cluster` takes on standard input
(danube.localcluster.control): a typo is a one-line answer, never the end of the cluster."""

from __future__ import annotations

import pytest

from danube.localcluster.control import Command, CommandError, parse_command


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("status", Command("status")),
        ("  KILL 2 \n", Command("kill", 2)),
        ("stop 0", Command("stop", 0)),
        ("restart 1", Command("restart", 1)),
        ("add", Command("add")),
        ("exit", Command("quit")),
        ("", None),
        ("   \n", None),
    ],
)
def test_commands(line: str, command: Command | None) -> None:
    assert parse_command(line, 3) == command


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("kill", "needs one broker number, 0 to 2"),
        ("kill x", "needs one broker number"),
        ("kill 3", "there is no broker 3: 0 to 2"),
        ("kill -1", "needs one broker number"),
        ("status now", "status takes no argument"),
        ("reboot 1", "unknown command 'reboot'; type help"),
    ],
)
def test_a_bad_line_says_what_would_do(line: str, says: str) -> None:
    with pytest.raises(CommandError, match=says):
        parse_command(line, 3)
