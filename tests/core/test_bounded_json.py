"""Client JSON is refused by its nesting before `json.loads` recurses into it (issue 20)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.values import bounded_json
from danube.values.errors import DanubeError, ErrorCode

documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\ab'), inner, max_size=3)
    ),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(documents)
def test_depth_is_measured_as_json_nests_strings_aside(value: Any) -> None:
    """Brackets and escaped quotes inside strings do not count."""
    assert bounded_json.json_depth(json.dumps(value)) == _depth(value)


@pytest.mark.parametrize(
    "text", ["[" * 5000, "[" * 5000 + "]" * 5000, '{"a":' * 65 + "1" + "}" * 65]
)
def test_deep_json_is_invalid_argument(text: str) -> None:
    with pytest.raises(DanubeError) as refused:
        bounded_json.loads(text, "policies")
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert "nest deeper than 64 levels" in refused.value.message


def test_json_at_the_limit_and_bad_json() -> None:
    assert bounded_json.loads('{"a":' * 63 + "[1]" + "}" * 63, "policies")
    with pytest.raises(DanubeError, match="not valid JSON"):
        bounded_json.loads("{", "policies")
