"""Hostile protobuf bytes: hypothesis strategies over the wire format (valid, invalid and in
between) and crafted cases from issue 20, built by hand so nothing here trusts the codecs
under test."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.hostile.ledger import env_int

BIG_KB = env_int("HOSTILE_BIG_KB", 256)
"""Size of the large crafted inputs (kept small enough for CI's time budget)."""


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint((number << 3) | wire_type)


def field_bytes(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


def field_varint(number: int, value: int) -> bytes:
    return tag(number, 0) + varint(value)


# -- hypothesis ---------------------------------------------------------------------------------

FIELD_NUMBERS = st.one_of(
    st.integers(1, 12),
    st.sampled_from([0, 15, 16, 19_000, 19_999, 2**29 - 1, 2**29, 2**31, 2**32 - 1]),
)
TEXT = st.one_of(
    st.sampled_from(
        [
            "/default/hostile",
            "default",
            "/default/hostile-part-0",
            "",
            "/",
            "//",
            "/default/../etc",
            "/default/" + "é" * 200,
            "[" * 512,
            "{" * 512,
            "s1",
            "json_schema",
            "avro",
            "enforce",
            "BACKWARD",
        ]
    ),
    st.text(max_size=40),
)
VARINTS = st.one_of(
    st.integers(0, 2**64 - 1).map(varint),
    st.sampled_from(
        [
            b"\xff" * 9 + b"\x7f",  # ten bytes, last > 1: not a 64-bit value
            b"\xff" * 11 + b"\x01",  # longer than any varint
            b"\x80" * 10 + b"\x00",
            b"\xff",  # unfinished
        ]
    ),
)


def _field(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """One field: a tag of any number and wire type, and a value that may or may not fit it."""
    length_delimited = st.one_of(
        TEXT.map(lambda s: s.encode()),
        st.binary(max_size=64),
        children,
    )
    return st.one_of(
        st.tuples(FIELD_NUMBERS, VARINTS).map(lambda t: tag(t[0], 0) + t[1]),
        st.tuples(FIELD_NUMBERS, length_delimited).map(lambda t: field_bytes(t[0], t[1])),
        st.tuples(FIELD_NUMBERS, st.binary(min_size=8, max_size=8)).map(
            lambda t: tag(t[0], 1) + t[1]
        ),
        st.tuples(FIELD_NUMBERS, st.binary(min_size=4, max_size=4)).map(
            lambda t: tag(t[0], 5) + t[1]
        ),
        st.tuples(FIELD_NUMBERS, st.sampled_from([3, 4, 6, 7]), st.binary(max_size=8)).map(
            lambda t: tag(t[0], t[1]) + t[2]
        ),
        # a length prefix that lies
        st.tuples(FIELD_NUMBERS, st.integers(0, 2**64 - 1), st.binary(max_size=16)).map(
            lambda t: tag(t[0], 2) + varint(t[1]) + t[2]
        ),
    )


MESSAGES: st.SearchStrategy[bytes] = st.recursive(
    st.lists(_field(st.just(b"")), max_size=6).map(b"".join),
    lambda children: st.lists(_field(children), max_size=6).map(b"".join),
    max_leaves=24,
)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A structured message with bytes flipped, cut, duplicated or inserted."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup", "truncate"]))
        at = draw(st.integers(0, len(data))) if data else 0
        if op == "flip" and data:
            index = min(at, len(data) - 1)
            data[index] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut" and data:
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "dup":
            data[at:at] = data[at : at + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[at:]
    return bytes(data)


BODIES = st.one_of(
    MESSAGES,
    mutated(MESSAGES),
    st.binary(max_size=256),
)
CALLS: st.SearchStrategy[list[bytes]] = st.one_of(
    BODIES.map(lambda body: [body]),
    st.lists(BODIES, min_size=0, max_size=3),
)
"""The messages of one call: mostly one, sometimes none or two or three (a unary method must
refuse all but exactly one)."""


# -- crafted cases ------------------------------------------------------------------------------


def _nested(depth: int) -> bytes:
    body = b""
    for _ in range(depth):
        body = field_bytes(1, body)
    return body


def crafted() -> dict[str, list[bytes]]:
    """Named calls (each a list of messages) that every method gets once."""
    long_text = b"q" * 32_768
    many = BIG_KB * 1024 // 4
    return {
        "empty": [b""],
        "no_message": [],
        "two_messages": [field_bytes(1, b"/default/hostile"), field_bytes(1, b"/default/other")],
        "wrong_wire_types": [b"\x08\x01\x10\x05\x1a\x01\x01" + tag(4, 0) + b"\x01"],
        "health_wrong_type": [b"\x12\x01\x01"],
        "field_2pow29": [b"\x80\x80\x80\x80\x10\x01"],
        "field_0": [b"\x00\x01"],
        "ten_byte_varint": [tag(1, 0) + b"\xff" * 9 + b"\x7f"],
        "group_markers": [tag(1, 3) + tag(2, 0) + b"\x01" + tag(1, 4)],
        "unfinished_group": [tag(1, 3) * 2000],
        "huge_length": [tag(1, 2) + varint(2**32) + b"abc"],
        "huge_length_64": [tag(2, 2) + varint(2**64 - 1) + b"abc"],
        "deep_nesting": [_nested(3000)],
        "long_strings": [b"".join(field_bytes(n, long_text) for n in (1, 2, 3))],
        "json_brackets": [b"".join(field_bytes(n, b"[" * 5000) for n in (1, 2, 3, 4))],
        "many_repeated": [field_bytes(1, b"ab") * many],
        "many_unknown_varints": [(tag(1000, 0) + b"\x01") * (many // 2)],
        "nested_unknown": [field_bytes(7, field_bytes(7, field_bytes(7, b"\x08" * 500)))],
    }
