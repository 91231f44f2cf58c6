"""The one varint encoder every hand-written codec shares, checked against betterproto's."""

from __future__ import annotations

import betterproto
from hypothesis import given
from hypothesis import strategies as st

from danube.values.varint import append_varint, varint


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1))
def test_a_varint_is_the_bytes_protobuf_writes(value: int) -> None:
    assert varint(value) == betterproto.encode_varint(value)


@given(st.lists(st.integers(min_value=0, max_value=(1 << 64) - 1), max_size=5))
def test_appending_concatenates(values: list[int]) -> None:
    out = bytearray(b"x")
    for value in values:
        append_varint(value, out)
    assert bytes(out) == b"x" + b"".join(varint(value) for value in values)


def test_a_negative_int64_is_ten_bytes() -> None:
    assert varint(-1) == b"\xff" * 9 + b"\x01"
