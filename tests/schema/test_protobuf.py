"""Protobuf schemas: protoc parsing, fingerprints, payload checks and wire compatibility.

protoc runs as a subprocess (tens of milliseconds), so every distinct text is compiled once
per module through `_parse`'s cache; most compatibility cases share their texts."""

from __future__ import annotations

import functools
import itertools
import json
import tempfile

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.protobuf import (
    ProtoSchema,
    encode_json_message,
    from_descriptor_set,
    proto_can_read,
    validate_payload,
)
from danube.protoc import compile_proto


def parse_proto(definition: bytes, message: str | None = None) -> ProtoSchema:
    return from_descriptor_set(compile_proto(definition), message)


@functools.cache
def _parse(text: str, message: str | None = None) -> ProtoSchema:
    return parse_proto(text.encode(), message)


SHOP = """\
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

// An order as the shop front writes it.
message Order {
  int64 id = 1;
  repeated Item items = 3;
  google.protobuf.Timestamp placed = 4;
  map<string, int32> tags = 5;

  message Item {
    string sku = 1;
    uint32 qty = 2;
  }
}

message Customer {
  string name = 1;
}
"""

LEGACY = """\
syntax = "proto2";
package legacy;

message Invoice {
  required int32 id = 1;
  optional string memo = 2;
}
"""


def one_message(body: str, syntax: str = "proto3", extra: str = "") -> str:
    """A file with package `t` whose first (so chosen) message is `M`, followed by `extra`."""
    return f'syntax = "{syntax}";\npackage t;\nmessage M {{\n{body}\n}}\n{extra}\n'


def can_read(reader: str, writer: str) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in proto_can_read(_parse(reader), _parse(writer))]


# --- parsing -----------------------------------------------------------------------------


def test_parse_proto3_picks_the_first_message() -> None:
    schema = _parse(SHOP)
    assert schema.message == "shop.Order"
    assert [f.name for f in schema.descriptor.fields] == ["id", "items", "placed", "tags"]
    assert schema.fingerprint.startswith("sha256:") and len(schema.fingerprint) == 71


def test_parse_proto2() -> None:
    schema = _parse(LEGACY)
    assert schema.message == "legacy.Invoice"
    assert schema.descriptor.fields_by_name["id"].is_required


def test_parse_imports_well_known_types() -> None:
    placed = _parse(SHOP).descriptor.fields_by_name["placed"]
    assert placed.message_type.full_name == "google.protobuf.Timestamp"


def test_parse_chooses_a_second_or_nested_message() -> None:
    assert _parse(SHOP, "shop.Customer").descriptor.full_name == "shop.Customer"
    item = _parse(SHOP, "shop.Order.Item")
    assert [f.name for f in item.descriptor.fields] == ["sku", "qty"]


def test_syntax_error_names_line_and_column_without_temporary_path() -> None:
    text = 'syntax = "proto3";\nmessage M {\n  int32 id = 1\n  string name = 2;\n}\n'
    with pytest.raises(SchemaParseError) as raised:
        parse_proto(text.encode())
    message = str(raised.value)
    assert message.startswith("schema.proto:4:3: Expected")
    assert tempfile.gettempdir() not in message
    assert "danube-proto" not in message


def test_missing_import_is_protoc_error() -> None:
    text = 'syntax = "proto3";\nimport "nowhere.proto";\nmessage M {}\n'
    with pytest.raises(SchemaParseError, match=r"schema\.proto:2:1: Import \"nowhere\.proto\""):
        parse_proto(text.encode())


def test_unknown_message_lists_the_defined_ones() -> None:
    with pytest.raises(SchemaParseError) as raised:
        parse_proto(SHOP.encode(), "shop.Nope")
    assert "'shop.Nope'" in str(raised.value)
    assert "shop.Order, shop.Order.Item, shop.Customer" in str(raised.value)
    assert "TagsEntry" not in str(raised.value)


def test_file_without_messages_and_non_utf8_are_refused() -> None:
    with pytest.raises(SchemaParseError, match="defines no message"):
        parse_proto(b'syntax = "proto3";\nenum E { E_ZERO = 0; }\n')
    with pytest.raises(SchemaParseError, match="not UTF-8"):
        parse_proto(b'syntax = "proto3";\nmessage M {} // \xff\n')


# --- fingerprints ------------------------------------------------------------------------


def test_fingerprint_ignores_comments_and_whitespace() -> None:
    reformatted = (
        SHOP.replace("// An order as the shop front writes it.\n", "/* orders */\n\n")
        .replace("  int64 id = 1;", "int64   id=1 ;  // the key")
        .replace("\n", "\n\n")
    )
    assert _parse(reformatted).fingerprint == _parse(SHOP).fingerprint


@pytest.mark.parametrize(
    ("old", "new"),
    [("int64 id = 1;", "int32 id = 1;"), ("int64 id = 1;", "int64 id = 2;")],
)
def test_fingerprint_changes_with_type_or_number(old: str, new: str) -> None:
    assert _parse(SHOP.replace(old, new)).fingerprint != _parse(SHOP).fingerprint


def test_fingerprint_depends_on_the_chosen_message() -> None:
    assert _parse(SHOP, "shop.Customer").fingerprint != _parse(SHOP).fingerprint


# --- payloads ----------------------------------------------------------------------------


def test_json_round_trip_through_binary() -> None:
    schema = _parse(SHOP)
    document = {
        "id": "7",
        "items": [{"sku": "apple", "qty": 2}],
        "placed": "2024-05-01T12:00:00Z",
        "tags": {"gift": 1},
    }
    payload = encode_json_message(schema, json.dumps(document))
    assert validate_payload(schema, payload) is None
    decoded = schema.message_class.FromString(payload)
    assert json_format.MessageToDict(decoded, descriptor_pool=schema.pool) == document


def test_garbage_payload_is_rejected() -> None:
    reason = validate_payload(_parse(SHOP), b"\xff\xff\xff\xff")
    assert reason is not None and reason.startswith("not a valid shop.Order: ")


def test_proto2_missing_required_field_is_reported() -> None:
    schema = _parse(LEGACY)
    memo_only = encode_json_message(_parse(LEGACY.replace("required", "optional")), '{"memo": "x"}')
    assert validate_payload(schema, memo_only) == (
        "not a valid legacy.Invoice: missing required fields: id"
    )
    with pytest.raises(ValueError, match="missing required fields: id"):
        encode_json_message(schema, '{"memo": "x"}')


@pytest.mark.parametrize(
    ("document", "field"), [('{"id": "seven"}', "id"), ('{"nope": 1}', "nope"), ("{", "JSON")]
)
def test_bad_json_names_the_field(document: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        encode_json_message(_parse(SHOP), document)


# --- compatibility: scalar wire groups ---------------------------------------------------

WIRE_GROUPS = [
    {"int32", "uint32", "int64", "uint64", "bool"},
    {"sint32", "sint64"},
    {"fixed32", "sfixed32"},
    {"fixed64", "sfixed64"},
    {"string", "bytes"},
    {"float"},
    {"double"},
]
SCALARS = sorted(set().union(*WIRE_GROUPS))
ENUM_READABLE = {"int32", "uint32", "int64", "uint64"}
ENUM = "enum E { E_ZERO = 0; E_ONE = 1; }"


def typed_field(type_name: str) -> str:
    return one_message(f"  {type_name} f = 1;", extra=ENUM if type_name == "E" else "")


def wire_compatible(a: str, b: str) -> bool:
    if a == b or any({a, b} <= group for group in WIRE_GROUPS):
        return True
    return "E" in {a, b} and bool({a, b} & ENUM_READABLE)


@pytest.mark.parametrize(("reader", "writer"), list(itertools.product([*SCALARS, "E"], repeat=2)))
def test_scalar_type_matrix(reader: str, writer: str) -> None:
    found = can_read(typed_field(reader), typed_field(writer))
    if wire_compatible(reader, writer):
        assert found == []
    else:
        assert [path for path, _ in found] == ["t.M.f[1]"]
        assert "wire encodings differ" in found[0][1]


# --- compatibility: one case per rule ----------------------------------------------------

NODE = "message Node {{\n  {value} v = 1;\n  repeated Node children = 2;\n}}\n"
ORDER = "message Order {{\n  repeated Item items = 3;\n}}\nmessage Item {{\n  {qty} qty = 1;\n}}\n"
CLOSED = "enum E {{ E_ZERO = 0; {extra}}}\nmessage M {{\n  optional E e = 1;\n}}\n"
OPEN = "enum E {{ E_ZERO = 0; {extra}}}\nmessage M {{\n  E e = 1;\n}}\n"
P2 = 'syntax = "proto2";\npackage t;\n'
P3 = 'syntax = "proto3";\npackage t;\n'

CASES: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "int32 to sint32 refused": (
        one_message("  sint32 f = 1;"),
        one_message("  int32 f = 1;"),
        [("t.M.f[1]", "sint32 in the reader but int32 in the writer")],
    ),
    "string read as bytes": (one_message("  bytes f = 1;"), one_message("  string f = 1;"), []),
    "bytes read as string": (one_message("  string f = 1;"), one_message("  bytes f = 1;"), []),
    "scalar to message refused": (
        one_message("  N f = 1;", extra="message N {}"),
        one_message("  int32 f = 1;", extra="message N {}"),
        [("t.M.f[1]", "message t.N in the reader but int32")],
    ),
    "message to scalar refused": (
        one_message("  string f = 1;", extra="message N {}"),
        one_message("  N f = 1;", extra="message N {}"),
        [("t.M.f[1]", "string in the reader but message t.N")],
    ),
    "singular to repeated refused": (
        one_message("  repeated int32 f = 1;"),
        one_message("  int32 f = 1;"),
        [("t.M.f[1]", "repeated in the reader but singular")],
    ),
    "repeated to singular refused": (
        one_message("  string f = 1;"),
        one_message("  repeated string f = 1;"),
        [("t.M.f[1]", "singular in the reader but repeated")],
    ),
    "packed reads unpacked": (
        one_message("  repeated int64 f = 1 [packed = true];", "proto2"),
        one_message("  repeated int32 f = 1;", "proto2"),
        [],
    ),
    "field name changed": (one_message("  int32 renamed = 1;"), one_message("  int32 f = 1;"), []),
    "writer field unknown to the reader": (
        one_message("  int32 f = 1;"),
        one_message("  int32 f = 1;\n  string extra = 2;"),
        [],
    ),
    "reserved number": (
        one_message("  int32 f = 1;\n  reserved 2;"),
        one_message("  int32 f = 1;\n  string old = 2;"),
        [("t.M.old[2]", "field number 2, which the reader reserves")],
    ),
    "reserved range": (
        one_message("  int32 f = 1;\n  reserved 5 to 9;"),
        one_message("  int32 f = 1;\n  string old = 7;"),
        [("t.M.old[7]", "field number 7, which the reader reserves")],
    ),
    "reserved name": (
        one_message('  int32 f = 1;\n  reserved "old";'),
        one_message("  int32 f = 1;\n  string old = 2;"),
        [("t.M.old[2]", "field name 'old', which the reader reserves")],
    ),
    "renamed with the old name reserved": (
        one_message('  int32 new_name = 1;\n  reserved "f";'),
        one_message("  int32 f = 1;"),
        [],
    ),
    "required added": (
        one_message("  required int32 f = 1;\n  required int32 g = 2;", "proto2"),
        one_message("  required int32 f = 1;", "proto2"),
        [("t.M.g[2]", "required in the reader but the writer has no such field")],
    ),
    "optional made required": (
        one_message("  required int32 f = 1;", "proto2"),
        one_message("  optional int32 f = 1;", "proto2"),
        [("t.M.f[1]", "required in the reader but optional in the writer")],
    ),
    "required made optional": (
        one_message("  optional int32 f = 1;", "proto2"),
        one_message("  required int32 f = 1;", "proto2"),
        [],
    ),
    "fields moved into a new oneof": (
        one_message("  oneof o {\n    int32 a = 1;\n    string b = 2;\n  }"),
        one_message("  int32 a = 1;\n  string b = 2;"),
        [
            ("t.M.a[1]", "moved from outside any oneof into the reader's oneof o"),
            ("t.M.b[2]", "moved from outside any oneof into the reader's oneof o"),
        ],
    ),
    "single field moved into a new oneof": (
        one_message("  oneof o {\n    int32 a = 1;\n    string b = 2;\n  }"),
        one_message("  int32 a = 1;"),
        [],
    ),
    "field moved into an existing oneof": (
        one_message("  oneof o {\n    int32 a = 1;\n    string b = 2;\n  }"),
        one_message("  oneof o {\n    int32 a = 1;\n  }\n  string b = 2;"),
        [("t.M.b[2]", "set it together with a")],
    ),
    "oneofs merged": (
        one_message("  oneof o {\n    int32 a = 1;\n    int32 b = 2;\n    int32 c = 3;\n  }"),
        one_message(
            "  oneof o {\n    int32 a = 1;\n    int32 b = 2;\n  }\n  oneof p { int32 c = 3; }"
        ),
        [("t.M.c[3]", "moved from oneof p into the reader's oneof o")],
    ),
    "oneof renamed": (
        one_message("  oneof renamed {\n    int32 a = 1;\n    string b = 2;\n  }"),
        one_message("  oneof o {\n    int32 a = 1;\n    string b = 2;\n  }"),
        [],
    ),
    "field moved out of a oneof": (
        one_message("  int32 a = 1;\n  oneof o { string b = 2; }"),
        one_message("  oneof o {\n    int32 a = 1;\n    string b = 2;\n  }"),
        [
            (
                "t.M.a[1]",
                "moved out of the writer's oneof o: the reader no longer treats it as exclusive",
            )
        ],
    ),
    "single-field oneof dissolved": (
        one_message("  int32 a = 1;"),
        one_message("  oneof o { int32 a = 1; }"),
        [],
    ),
    "proto3 optional is no oneof": (
        one_message("  optional int32 a = 1;\n  optional int32 b = 2;"),
        one_message("  int32 a = 1;\n  int32 b = 2;"),
        [],
    ),
    "nested message change": (
        P3 + ORDER.format(qty="sint32"),
        P3 + ORDER.format(qty="int32"),
        [("t.Order.items[3].qty[1]", "sint32 in the reader but int32")],
    ),
    "map value change": (
        one_message("  map<string, int32> m = 1;"),
        one_message("  map<string, string> m = 1;"),
        [("t.M.m[1].value[2]", "int32 in the reader but string")],
    ),
    "recursive message terminates": (
        P3 + NODE.format(value="string"),
        P3 + NODE.format(value="int64"),
        [("t.Node.v[1]", "string in the reader but int64")],
    ),
    "root renamed": (
        P3 + "message A { int32 x = 1; }\n",
        P3 + "message B { int32 x = 1; }\n",
        [("t.A", "the root message is t.A in the reader but t.B in the writer")],
    ),
    "group read as message refused": (
        one_message("  optional G g = 1;", "proto2", "message G { optional int32 q = 1; }"),
        one_message("  optional group G = 1 { optional int32 q = 1; }", "proto2"),
        [("t.M.g[1]", "message t.G in the reader but group t.M.G")],
    ),
    "proto2 enum value removed": (
        P2 + CLOSED.format(extra=""),
        P2 + CLOSED.format(extra="E_GONE = 3; "),
        [("t.M.e[1]", "closed enum t.E drops the writer's values E_GONE = 3")],
    ),
    "proto3 enum value removed": (
        P3 + OPEN.format(extra=""),
        P3 + OPEN.format(extra="E_GONE = 3; "),
        [],
    ),
    "proto2 enum value added": (
        P2 + CLOSED.format(extra="E_NEW = 4; "),
        P2 + CLOSED.format(extra=""),
        [],
    ),
    "integer read as a closed enum": (
        P2 + CLOSED.format(extra=""),
        P2 + "message M {\n  optional int32 e = 1;\n}\n",
        [("t.M.e[1]", "closed enum t.E drops numbers it does not define")],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compatibility_rule(case: str) -> None:
    reader, writer, expected = CASES[case]
    found = can_read(reader, writer)
    assert [path for path, _ in found] == [path for path, _ in expected], found
    for (_, message), (_, fragment) in zip(found, expected, strict=True):
        assert fragment in message


def test_every_case_reads_itself() -> None:
    for reader, writer, _ in CASES.values():
        assert can_read(reader, reader) == []
        assert can_read(writer, writer) == []


# --- property: changes within a wire group are invisible, across groups reported ---------


@st.composite
def field_changes(draw: st.DrawFn) -> tuple[list[tuple[int, str]], int, str, int, str]:
    """Fields (number, type), one to retype within its group and one across groups."""
    numbers = draw(st.lists(st.integers(1, 500), min_size=2, max_size=6, unique=True))
    types = [draw(st.sampled_from(SCALARS)) for _ in numbers]
    same, other = draw(st.permutations(range(len(numbers))))[:2]
    group = next(g for g in WIRE_GROUPS if types[same] in g)
    within = draw(st.sampled_from(sorted(group)))
    across = draw(st.sampled_from([t for t in SCALARS if not wire_compatible(t, types[other])]))
    return list(zip(numbers, types, strict=True)), same, within, other, across


def render(fields: list[tuple[int, str]]) -> str:
    return one_message("\n".join(f"  {kind} f{number} = {number};" for number, kind in fields))


@settings(max_examples=25, deadline=None)
@given(field_changes())
def test_wire_group_changes_property(
    change: tuple[list[tuple[int, str]], int, str, int, str],
) -> None:
    fields, same, within, other, across = change
    changed = list(fields)
    changed[same] = (fields[same][0], within)
    changed[other] = (fields[other][0], across)
    original, variant = render(fields), render(changed)
    number = fields[other][0]
    assert can_read(original, original) == []
    assert can_read(variant, variant) == []
    for reader, writer in ((original, variant), (variant, original)):
        assert [path for path, _ in can_read(reader, writer)] == [f"t.M.f{number}[{number}]"]
