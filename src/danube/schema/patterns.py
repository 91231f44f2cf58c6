"""Regular expressions of JSON Schema (`pattern`, `patternProperties`) searched under a time
limit. The patterns come from clients and so do the strings: a pattern such as `^(a+)+$`
backtracks exponentially in the standard `re`, which cannot be interrupted and holds the
interpreter while it runs. The `regex` package reads the same syntax as `re` (its version 0)
and stops a search after a timeout, which becomes a `LimitExceeded` naming the limit."""

from __future__ import annotations

import functools
from typing import Any

import regex

from danube.core.errors import quoted
from danube.schema import budget as budgets
from danube.schema.limits import PATTERN_SECONDS

PATTERN_CACHE = 1024


@functools.lru_cache(maxsize=PATTERN_CACHE)
def _compiled(pattern: str) -> Any:
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
