"""`quoted` keeps error messages short whatever a client sent (issue 20, item 1)."""

from hypothesis import given
from hypothesis import strategies as st

from danube.values.errors import QUOTE_LIMIT, quoted


def test_short_strings_are_plain_reprs() -> None:
    assert quoted("orders") == "'orders'"
    assert quoted(b"\x00k") == "b'\\x00k'"


def test_long_strings_say_their_length() -> None:
    text = quoted("q" * 400_000)
    assert text.startswith("'" + "q" * QUOTE_LIMIT + "'")
    assert text.endswith("(400000 characters)")


@given(st.one_of(st.text(), st.binary(), st.lists(st.text())))
def test_quoted_is_bounded(value: object) -> None:
    assert len(quoted(value)) <= 10 * QUOTE_LIMIT + 60
