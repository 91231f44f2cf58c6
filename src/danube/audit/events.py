"""Settlements from brokers' logs: the `policy_dropped` events a broker logs (one line each,
`event=policy_dropped topic=… subscription=… offset=… attempts=…`) turned into the audit's
settlement log (`danube.audit.logs.SETTLEMENT_SCHEMA`), so that the audit counts a message the
Drop poison policy passed as dropped by policy, not as `unseen` (spec/audit.md).

    python -m danube.audit.events --logs ./run-logs broker-1.log broker-2.log

A line that is not such an event is skipped; an event line whose fields cannot be read is
counted and reported (a truncated last line after a crash, say), never guessed at.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from danube.audit.logs import Settlement, SettlementLog

EVENT = "policy_dropped"
_FIELD = re.compile(r"""(\w+)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S+)""")


def event_fields(line: str) -> dict[str, str] | None:
    """The `key=value` fields of one event line (a quoted value read as the `repr` the broker
    wrote), or None when the line is no event."""
    at = line.find("event=")
    if at < 0:
        return None
    fields: dict[str, str] = {}
    for match in _FIELD.finditer(line, at):
        key, value = match.group(1), match.group(2)
        if value[:1] in ("'", '"'):
            try:
                value = str(ast.literal_eval(value))
            except (SyntaxError, ValueError):
                return None
        fields[key] = value
    return fields


def settlements(lines: Iterable[str]) -> Iterator[Settlement | str]:
    """A `Settlement` for each `policy_dropped` event; the line itself for an event line
    whose fields are missing or malformed."""
    for line in lines:
        if f"event={EVENT}" not in line:
            continue
        fields = event_fields(line)
        if fields is None or fields.get("event") != EVENT:
            yield line
            continue
        topic, subscription = fields.get("topic"), fields.get("subscription")
        offset, attempts = fields.get("offset", ""), fields.get("attempts", "0")
        if not topic or not subscription or not offset.isdigit() or not attempts.isdigit():
            yield line
            continue
        yield Settlement(topic, subscription, int(offset), "dropped", int(attempts))


def convert(paths: Sequence[Path], logs: Path, writer: str = "broker-events") -> tuple[int, int]:
    """Writes the settlements of every log in `paths` under `logs`; (rows, unreadable)."""
    out = SettlementLog(logs, writer)
    rows = unreadable = 0
    for path in paths:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for found in settlements(handle):
                if isinstance(found, Settlement):
                    out.settled(found)
                    rows += 1
                else:
                    unreadable += 1
    out.close()
    return rows, unreadable


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m danube.audit.events",
        description="Turn brokers' policy_dropped log events into the audit's settlement log.",
    )
    parser.add_argument("--logs", type=Path, required=True, help="the audit's --logs directory")
    parser.add_argument("broker_logs", type=Path, nargs="+", help="broker log files")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.broker_logs if not path.is_file()]
    if missing:
        parser.error(f"no such log file: {', '.join(missing)}")
    rows, unreadable = convert(args.broker_logs, args.logs)
    print(f"{rows} settlements written under {args.logs}/settlements")
    if unreadable:
        print(f"{unreadable} policy_dropped lines could not be read", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
