"""JSON from a client, parsed only after its nesting is known to be bounded.

`json.loads` recurses once per level of nesting: `"[" * 5000` raised RecursionError out of an
admin call (issue 20), and deeper input could exhaust the C stack. The depth is measured first,
in linear time, from the brackets outside string literals."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from danube.values.errors import invalid

MAX_JSON_DEPTH = 64
"""Nesting of arrays and objects a client's JSON may have; Danube's own documents nest 3."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(text: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads`, refusing with INVALID_ARGUMENT text nested deeper than `max_depth` or not
    JSON at all; `what` names the document in the message ("policies")."""
    if json_depth(text) > max_depth:
        raise invalid(f"{what} nest deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise invalid(f"{what} are not valid JSON: {error.msg}") from None
    except RecursionError:  # unreachable under the depth bound; kept as a clean refusal
        raise invalid(f"{what} nest too deeply") from None
