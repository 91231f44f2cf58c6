"""What an operator types to a running `danube-local-cluster` (one command a line on its
standard input), read into commands by a pure parser, so a typo gets a one-line answer and
the cluster keeps running: the cluster is there to try failover, and a broker that dies, or
that the operator kills, is part of that, not a reason to stop everything."""

from __future__ import annotations

from dataclasses import dataclass

HELP = """\
commands (one a line):
  status          every broker: alive or exited, its URLs
  kill N          SIGKILL broker N (a crash: its topics fail over once its lease expires)
  stop N          SIGTERM broker N (a clean stop: it hands its topics over first)
  restart N       start broker N again, on its ports and with its data
  add             start one more broker
  quit            stop everything (as Ctrl-C)
  help            this text"""


@dataclass(frozen=True, slots=True)
class Command:
    verb: str
    """status, kill, stop, restart, add, quit or help."""
    broker: int | None = None


class CommandError(ValueError):
    """A line that is no command: the message says what would be."""


NEEDS_BROKER = frozenset({"kill", "stop", "restart"})
BARE = frozenset({"status", "add", "quit", "exit", "help"})


def parse_command(line: str, brokers: int) -> Command | None:
    """The command on `line` (None for a blank line) for a cluster of `brokers` brokers."""
    words = line.split()
    if not words:
        return None
    verb, rest = words[0].lower(), words[1:]
    if verb in BARE:
        if rest:
            raise CommandError(f"{verb} takes no argument")
        return Command("quit" if verb == "exit" else verb)
    if verb not in NEEDS_BROKER:
        raise CommandError(f"unknown command {words[0]!r}; type help")
    if len(rest) != 1 or not rest[0].isdigit():
        raise CommandError(f"{verb} needs one broker number, 0 to {brokers - 1}")
    index = int(rest[0])
    if index >= brokers:
        raise CommandError(f"there is no broker {index}: 0 to {brokers - 1}")
    return Command(verb, index)
