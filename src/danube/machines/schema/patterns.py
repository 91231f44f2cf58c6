"""Regular expressions of JSON Schema (`pattern`, `patternProperties`) searched under a time
limit. The patterns come from clients and so do the strings: a pattern such as `^(a+)+$`
backtracks exponentially in the standard `re`, which cannot be interrupted and holds the
interpreter while it runs. The `regex` package reads the same syntax as `re` (its version 0)
and stops a search after a timeout, which becomes a `LimitExceeded` naming the limit."""

from __future__ import annotations

import contextlib
import functools
import re
import re._constants as sre_constants
import re._parser as sre_parse
from collections.abc import Iterator
from typing import Any

import regex

from danube.machines.schema import budget as budgets
from danube.machines.schema.limits import MAX_PATTERN_SIZE, PATTERN_SECONDS
from danube.values.errors import quoted

PATTERN_CACHE = 1024
_REPEATS = frozenset(
    {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT}
)


def check_pattern(pattern: str) -> None:
    """Refuses a pattern whose compiled form would be huge: `regex` (like `re`'s matcher)
    unrolls counted repetitions, so `(a{1000}){1000}` takes seconds to compile. The size is
    the pattern's items with each repetition counted as many times as its upper bound (its
    lower one when unbounded); over MAX_PATTERN_SIZE is `LimitExceeded`. A pattern that is
    no valid expression is left to the caller (it matches nothing)."""
    try:
        size = _size(sre_parse.parse(pattern))
    except (re.error, RecursionError, OverflowError, ValueError):
        return
    if size > MAX_PATTERN_SIZE:
        raise budgets.LimitExceeded(
            "pattern size",
            f"the pattern {quoted(pattern)} unrolls to {size:,} items, a pattern may have "
            f"{MAX_PATTERN_SIZE:,}",
        )


def _size(items: Any) -> int:
    total = 0
    for op, argument in items:
        if op in _REPEATS:
            low, high, item = argument
            times = low if high == sre_constants.MAXREPEAT else high
            total += max(1, times) * _size(item)
        else:
            total += 1 + sum(_size(inner) for inner in _inner(argument))
        if total > MAX_PATTERN_SIZE:
            return total
    return total


def _inner(argument: Any) -> Iterator[Any]:
    """The subpatterns inside an item's argument (a group's, each branch of `|`, ...)."""
    if isinstance(argument, sre_parse.SubPattern):
        yield argument
    elif isinstance(argument, tuple | list):
        for part in argument:
            yield from _inner(part)


def prepare(pattern: str) -> None:
    """At registration (in a worker): `check_pattern`, and the compiled form cached, so the
    first payload checked on the event loop does not pay for compiling."""
    with contextlib.suppress(regex.error, RecursionError, OverflowError):
        _compiled(pattern)  # no valid expression matches nothing: not an error here


@functools.lru_cache(maxsize=PATTERN_CACHE)
def _compiled(pattern: str) -> Any:
    check_pattern(pattern)
    return regex.compile(pattern, regex.VERSION0)


def search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches somewhere in `text` (as `re.search`), within the pattern
    time limit of the budget in force (PATTERN_SECONDS without one). A pattern that is not
    a valid expression matches nothing."""
    budget = budgets.current()
    seconds = PATTERN_SECONDS
    if budget is not None:
        budget.spend(1 + len(text) // 64)
        seconds = budget.remaining_seconds(budget.pattern_seconds)
    try:
        compiled = _compiled(pattern)
    except (regex.error, RecursionError, OverflowError):
        return False
    try:
        return compiled.search(text, timeout=seconds) is not None
    except TimeoutError:
        raise budgets.LimitExceeded(
            "pattern seconds",
            f"the pattern {quoted(pattern)} took more than {seconds:g} s on a string of "
            f"{len(text)} characters",
        ) from None
