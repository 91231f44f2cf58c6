"""google.protobuf's own parser (upb) as the oracle of which bytes every Danube client parses
(`upb_server.py`, a process of its own), and hypothesis strategies for bytes near that boundary
(spec/record-validity.md)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

from hypothesis import strategies as st

from danube.machines.wal import records

SERVER = pathlib.Path(__file__).with_name("upb_server.py")


class Oracle:
    """A running `upb_server.py`: one request line, one answer line."""

    def __init__(self, python: str, *flags: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
        self._process = subprocess.Popen(
            [python, "-I", str(SERVER), *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        atexit.register(self.close)

    def ask(self, name: str, data: bytes) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(f"{name} {data.hex()}\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        assert line, f"the upb oracle process ended (exit status {self._process.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()  # type: ignore[union-attr]
            self._process.wait(timeout=30)


@functools.cache
def upb() -> Oracle:
    """The oracle on this interpreter's google.protobuf (upb) and our proto/DanubeApi.proto."""
    return Oracle(sys.executable)


def every_client_accepts(name: str, data: bytes) -> bool:
    """Whether upb parses `danube.<name>` from `data` and no other Danube client's parser is
    stricter about these bytes."""
    return bool(upb().ask(name, data)["accepted"])


def upb_fields(name: str, data: bytes) -> dict[str, Any] | None:
    """The fields upb read (bytes as hex, unset messages and optionals None), None if refused."""
    fields: dict[str, Any] | None = upb().ask(name, data)["fields"]
    return fields


def record_of_upb(fields: dict[str, Any]) -> records.Record:
    """What upb read of a `StreamMessage`, in the shape of our record."""
    msg_id = fields["msg_id"] or {}
    return records.Record(
        request_id=fields["request_id"],
        producer_id=msg_id.get("producer_id", 0),
        topic_name=msg_id.get("topic_name", ""),
        broker_addr=msg_id.get("broker_addr", ""),
        topic_offset=msg_id.get("topic_offset", 0),
        payload=bytes.fromhex(fields["payload"]),
        publish_time=fields["publish_time"],
        producer_name=fields["producer_name"],
        subscription_name=fields["subscription_name"],
        attributes=fields["attributes"],
        schema_id=fields["schema_id"],
        schema_version=fields["schema_version"],
        routing_key=fields["routing_key"],
        has_msg_id=fields["msg_id"] is not None,
    )


# -- strategies ---------------------------------------------------------------------------------


def varint(value: int, pad: int = 0) -> bytes:
    """`value`'s varint, `pad` bytes longer than it needs (a valid, non-minimal encoding)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    for _ in range(pad):
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


@st.composite
def varints(draw: st.DrawFn, longest: int = 11) -> bytes:
    """Value varints: minimal, padded, 10 bytes with any last byte, longer than 10."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return varint(draw(st.integers(0, 2**64 - 1)))
    if kind == 1:
        value = draw(st.integers(0, 2**35))
        return varint(value, draw(st.integers(0, 10 - len(varint(value)))))
    head = bytes(b | 0x80 for b in draw(st.binary(min_size=9, max_size=9)))
    if kind == 2:
        return head + bytes([draw(st.integers(0, 1) | st.integers(2, 0x7F))])
    return head + b"\x80" * draw(st.integers(1, longest - 10)) + b"\x01"


FIELD_NUMBERS = st.one_of(
    st.integers(1, 11),
    st.integers(1, 2**29 - 1),
    st.integers(1, 2**29 - 1),
    st.sampled_from([0, 15, 16, 2**29 - 1, 2**29, 2**32 - 1, 19000, 19999]),
)
WIRE_TYPES = st.sampled_from([0, 0, 1, 2, 2, 2, 5, 3, 3, 4, 6, 7])


@st.composite
def tags(draw: st.DrawFn, number: int | None = None, wire: int | None = None) -> bytes:
    """A field tag, sometimes padded (up to 7 bytes: upb takes 5) or out of range."""
    number = draw(FIELD_NUMBERS) if number is None else number
    wire = draw(st.integers(0, 7)) if wire is None else wire
    tag = number << 3 | wire
    pad = draw(st.sampled_from([0] * 6 + [1, 5 - len(varint(tag)), 6 - len(varint(tag))]))
    return varint(tag, max(pad, 0))


TEXTS = st.text(max_size=8).map(str.encode)
BAD_UTF8 = st.sampled_from(
    [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]
)  # a stray byte, a cut sequence, a surrogate, past U+10FFFF, an overlong "/"
STRINGS = st.one_of(TEXTS, TEXTS, TEXTS, BAD_UTF8)


@st.composite
def length_delimited(draw: st.DrawFn, content: bytes) -> bytes:
    pad = draw(st.sampled_from([0] * 6 + [1, 4, 5]))
    return varint(len(content), pad) + content


def entry_chunks() -> st.SearchStrategy[bytes]:
    """Fields of an attributes entry: mostly its key and value, sometimes anything else."""
    good = st.builds(
        lambda number, text: varint(number << 3 | 2) + varint(len(text)) + text,
        st.sampled_from([1, 2]),
        STRINGS,
    )
    return st.one_of(good, good, good, simple_fields())


@st.composite
def simple_fields(draw: st.DrawFn) -> bytes:
    """One field of any tag and a value of its wire type (nothing, or an empty group, for a
    group's)."""
    number, wire = draw(FIELD_NUMBERS), draw(WIRE_TYPES)
    tag = draw(tags(number, wire))
    if wire == 0:
        return tag + draw(varints())
    if wire == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    if wire == 2:
        return tag + draw(length_delimited(draw(STRINGS | st.binary(max_size=6))))
    if wire == 3 and draw(st.booleans()):
        return tag + varint(number << 3 | 4)  # an empty group, which upb skips
    return tag


def msg_id_contents() -> st.SearchStrategy[bytes]:
    """The fields of a `MsgID`: its own (1, 5 integers; 2, 3 strings) and any other."""
    ints = st.builds(
        lambda n, v: varint(n << 3) + varint(v),
        st.sampled_from([1, 5]),
        st.integers(0, 2**64 - 1),
    )
    texts = st.builds(
        lambda n, t: varint(n << 3 | 2) + varint(len(t)) + t, st.sampled_from([2, 3]), STRINGS
    )
    return st.lists(st.one_of(ints, ints, texts, texts, simple_fields()), max_size=4).map(b"".join)


@st.composite
def known_fields(draw: st.DrawFn, *, msg_id: bool) -> bytes:
    """One StreamMessage field as a client would send it (some in odd but valid encodings)."""
    number = draw(st.sampled_from([1, 3, 4, 5, 6, 7, 8, 9, 10] + ([2] if msg_id else [])))
    if number in (1, 4, 8, 9):
        value = draw(st.integers(0, 2**64 - 1))
        return draw(tags(number, 0)) + varint(value, draw(st.integers(0, 10 - len(varint(value)))))
    if number == 7:
        entry = b"".join(draw(st.lists(entry_chunks(), max_size=3)))
    elif number == 2:
        entry = draw(msg_id_contents())
    elif number == 3:
        entry = draw(st.binary(max_size=12))
    else:
        entry = draw(STRINGS)
    return draw(tags(number, 2)) + draw(length_delimited(entry))


@st.composite
def mutated(draw: st.DrawFn, chunks: st.SearchStrategy[bytes]) -> bytes:
    """A message made of fields, then sometimes damaged: a byte changed, inserted or deleted,
    or the end cut off."""
    data = bytearray(b"".join(draw(st.lists(chunks, max_size=6))))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        kind = draw(st.integers(0, 3))
        at = draw(st.integers(0, len(data)))
        if kind == 0 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == 1:
            data.insert(at, draw(st.integers(0, 255)))
        elif kind == 2 and at < len(data):
            del data[at]
        elif kind == 3:
            del data[at:]
    return bytes(data)


def stream_messages(*, msg_id: bool) -> st.SearchStrategy[bytes]:
    """Bytes near the boundary of what every client parses as a `StreamMessage`: its fields,
    unknown ones, odd and invalid encodings, damage."""
    chunks = st.one_of(known_fields(msg_id=msg_id), known_fields(msg_id=msg_id), simple_fields())
    return st.one_of(mutated(chunks), st.binary(max_size=40))


def client_messages(*, msg_id: bool) -> st.SearchStrategy[bytes]:
    """`StreamMessage`s as clients send them, in any valid encoding and with unknown fields,
    undamaged (some still refused: a bad string, an odd entry, an odd unknown field); with
    `msg_id`, each carries one (the plain path requires it)."""
    known = known_fields(msg_id=False)
    fields = st.lists(st.one_of(known, known, known, simple_fields()), max_size=8).map(b"".join)
    if not msg_id:
        return fields
    msg_ids = msg_id_contents().map(lambda inner: b"\x12" + varint(len(inner)) + inner)
    return st.tuples(fields, msg_ids, fields).map(b"".join)
