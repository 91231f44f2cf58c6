"""The one varint encoder every hand-written codec shares, checked against betterproto's."""

from __future__ import annotations

import betterproto
import pytest
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


@pytest.mark.parametrize("value", [-1, -5, 1 << 64, (1 << 64) + 7])
def test_an_unsigned_varint_out_of_range_is_refused_not_wrapped(value: int) -> None:
    """A negative request id or a timestamp past 64 bits is a caller's bug: stored as another
    number it would be durable and wrong."""
    with pytest.raises(ValueError, match=r"0\.\.2"):
        append_varint(value, bytearray())


@pytest.mark.parametrize("value", [-(1 << 63) - 1, 1 << 64])
def test_a_signed_varint_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match="int64"):
        varint(value)


def test_a_wal_record_with_a_negative_request_id_is_refused() -> None:
    from danube.machines.wal import records

    with pytest.raises(ValueError):
        records.encode(records.Record(request_id=-5, has_msg_id=False))
