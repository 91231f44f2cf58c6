"""What `danube-admin` prints: aligned tables for people, one JSON document for scripts.

Every command returns a `Result` (the data, and the same data laid out for a terminal), so
the choice between the two is made once, in one place, and a command cannot forget it."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import betterproto

OUTPUTS = ("table", "json")


@dataclass(frozen=True, slots=True)
class Result:
    data: object
    """JSON-ready: dicts with the proto's snake_case field names, lists, scalars."""
    text: str
    """The same for a person; never empty (an empty listing says so)."""
    exit_code: int = 0
    """Non-zero for an answer a script should stop at (a schema that is not compatible)."""


def record(message: betterproto.Message) -> dict[str, object]:
    """`plain` of one message, typed as the dict it is, for commands that add a field."""
    found = plain(message)
    assert isinstance(found, dict)
    return found


def snake(name: str) -> str:
    """`DeadLetter` -> `dead_letter`: an enum member as the CLI's flags spell it."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def plain(value: object) -> object:
    """A proto message (or anything inside one) as JSON-ready data. Unlike betterproto's
    `to_dict`, 64-bit integers stay numbers (proto3 JSON makes them strings, which scripts
    then have to convert back) and enums are their lower-case names, as the flags take them."""
    if isinstance(value, betterproto.Message):
        value = value.to_pydict(casing=betterproto.Casing.SNAKE, include_default_values=True)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, enum.Enum | betterproto.Enum):
        return snake(value.name)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def cell(value: object) -> str:
    """A table cell: absent values are a dash, lists comma-separated, booleans yes/no."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.0f}"
    if isinstance(value, enum.Enum | betterproto.Enum):
        return snake(value.name)
    if isinstance(value, list | tuple):
        return ", ".join(cell(item) for item in value) or "-"
    return str(value)


def _numeric(value: object) -> bool:
    named = isinstance(value, bool | enum.Enum | betterproto.Enum)
    return isinstance(value, int | float) and not named


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str) -> str:
    """Columns padded to their widest cell, numeric columns right-aligned; `empty` (which
    says what there is none of) when there are no rows."""
    values = [list(row) for row in rows]
    if not values:
        return empty
    cells = [[cell(value) for value in row] for row in values]
    right = [all(_numeric(row[i]) for row in values) for i in range(len(headers))]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]

    def line(texts: Sequence[str]) -> str:
        padded = (
            text.rjust(width) if align else text.ljust(width)
            for text, width, align in zip(texts, widths, right, strict=True)
        )
        return "  ".join(padded).rstrip()

    return "\n".join([line([h.upper() for h in headers]), *(line(row) for row in cells)])


def fields(pairs: Iterable[tuple[str, object]]) -> str:
    """One `name: value` line per field, names aligned: a single record (a topic, a policy)."""
    found = list(pairs)
    width = max(len(name) for name, _ in found)
    return "\n".join(f"{name + ':':<{width + 1}} {cell(value)}" for name, value in found)


def render(result: Result, output: str) -> str:
    if output == "json":
        return json.dumps(result.data, indent=2, sort_keys=True)
    return result.text
