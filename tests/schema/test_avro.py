"""Avro schemas (danube.machines.schema.avro): parsing and its errors, fingerprints, the Schema
Resolution rules of the Avro 1.11 specification as `avro_can_read`, and the payload checks.
Property tests hold the compatibility check to fastavro's reader: whatever it calls readable,
fastavro reads."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from itertools import count
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from danube.machines.schema.avro import (
    AvroSchema,
    decode_json_datum,
    encode_json_datum,
    parse_avro,
    validate_json,
)
from danube.machines.schema.avro_binary import validate_datum
from danube.machines.schema.avro_compat import avro_can_read
from danube.machines.schema.errors import SchemaParseError

PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
PROMOTIONS = [
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
]


def avro(definition: Any) -> AvroSchema:
    return parse_avro(json.dumps(definition).encode())


def record(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def enum(name: str, *symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": name, "symbols": list(symbols), **extra}


def problems(reader: Any, writer: Any) -> list[tuple[str, str]]:
    return [(issue.path, issue.message) for issue in avro_can_read(avro(reader), avro(writer))]


def binary(schema: AvroSchema, datum: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema.parsed, datum)
    return buffer.getvalue()


# --- Schema resolution: primitives -------------------------------------------------------


@pytest.mark.parametrize("kind", PRIMITIVES)
def test_every_primitive_reads_itself(kind: str) -> None:
    assert problems(kind, kind) == []


@pytest.mark.parametrize(("writer", "reader"), PROMOTIONS)
def test_a_writer_primitive_is_promoted_as_the_specification_lists(
    writer: str, reader: str
) -> None:
    assert problems(reader, writer) == []


@pytest.mark.parametrize(
    ("writer", "reader"),
    [(reader, writer) for writer, reader in PROMOTIONS if (reader, writer) not in PROMOTIONS]
    + [("boolean", "int"), ("int", "boolean"), ("null", "string"), ("int", "string")],
)
def test_a_promotion_does_not_run_backwards_nor_between_unrelated_types(
    writer: str, reader: str
) -> None:
    assert problems(reader, writer) == [("", f"writer type {writer} cannot be read as {reader}")]


def test_a_logical_type_resolves_as_its_underlying_type() -> None:
    date = {"type": "int", "logicalType": "date"}
    assert problems({"type": "long", "logicalType": "timestamp-millis"}, date) == []
    assert problems("int", date) == []


# --- Records --------------------------------------------------------------------------------

V1 = record("User", field("id", "long"), field("name", "string"))


def test_a_field_added_with_a_default_is_filled_in_by_the_reader() -> None:
    v2 = record("User", *V1["fields"], field("email", ["null", "string"], default=None))
    assert problems(v2, V1) == []


def test_a_field_added_without_a_default_cannot_be_read_from_old_data() -> None:
    v2 = record("User", *V1["fields"], field("email", "string"))
    assert problems(v2, V1) == [
        ("/fields/email", "reader field 'email' has no default and the writer has no such field")
    ]


def test_a_field_the_reader_dropped_is_skipped() -> None:
    assert problems(record("User", field("id", "long")), V1) == []


def test_a_renamed_field_is_found_through_the_readers_alias() -> None:
    renamed = record("User", field("id", "long"), field("full_name", "string"))
    assert problems(renamed, V1) == [
        (
            "/fields/full_name",
            "reader field 'full_name' has no default and the writer has no such field",
        )
    ]
    aliased = record("User", field("id", "long"), field("full_name", "string", aliases=["name"]))
    assert problems(aliased, V1) == []


def test_fields_are_matched_by_name_not_position() -> None:
    assert problems(record("User", field("name", "string"), field("id", "long")), V1) == []


def test_every_problem_of_a_record_is_reported() -> None:
    reader = record("User", field("id", "int"), field("email", "string"), field("age", "int"))
    assert problems(reader, V1) == [
        ("/fields/id", "writer type long cannot be read as int"),
        ("/fields/email", "reader field 'email' has no default and the writer has no such field"),
        ("/fields/age", "reader field 'age' has no default and the writer has no such field"),
    ]


def test_a_renamed_record_is_refused_unless_the_reader_lists_the_old_name() -> None:
    renamed = record("Account", *V1["fields"])
    assert problems(renamed, V1) == [
        (
            "",
            "writer record 'User' cannot be read as record 'Account': the names differ and "
            "'User' is not an alias of the reader's",
        )
    ]
    assert problems(record("Account", *V1["fields"], aliases=["User"]), V1) == []


def test_names_match_unqualified_and_aliases_qualify_in_the_readers_namespace() -> None:
    writer = record("R", field("a", "int"), namespace="old.ns")
    assert problems(record("R", field("a", "int"), namespace="new.ns"), writer) == []
    aliased = record("x.New", field("a", "int"), aliases=["Old"])
    assert problems(aliased, record("x.Old", field("a", "int"))) == []
    assert problems(aliased, record("y.Old", field("a", "int"))) != []
    qualified = record("x.New", field("a", "int"), aliases=["y.Old"])
    assert problems(qualified, record("y.Old", field("a", "int"))) == []


def test_a_nested_problem_is_located_by_its_path() -> None:
    def person(zip_type: str) -> dict[str, Any]:
        address = record("Address", field("street", "string"), field("zip", zip_type))
        return record("Person", field("name", "string"), field("address", address))

    assert problems(person("int"), person("string")) == [
        ("/fields/address/fields/zip", "writer type string cannot be read as int")
    ]


def test_a_type_used_in_two_places_is_reported_in_both() -> None:
    def person(zip_type: str) -> dict[str, Any]:
        address = record("Address", field("zip", zip_type))
        return record("Person", field("home", address), field("work", "Address"))

    assert problems(person("int"), person("string")) == [
        ("/fields/home/fields/zip", "writer type string cannot be read as int"),
        ("/fields/work/fields/zip", "writer type string cannot be read as int"),
    ]


# --- Recursive types ------------------------------------------------------------------------


def linked_list(value_type: str) -> dict[str, Any]:
    return record("Node", field("value", value_type), field("next", ["null", "Node"]))


def test_a_recursive_type_reads_itself_and_promotes_through_the_recursion() -> None:
    assert problems(linked_list("long"), linked_list("long")) == []
    assert problems(linked_list("long"), linked_list("int")) == []


def test_a_recursive_type_with_a_mismatch_terminates_with_one_finding() -> None:
    assert problems(linked_list("int"), linked_list("string")) == [
        ("/fields/value", "writer type string cannot be read as int")
    ]


def test_mutually_recursive_types_terminate() -> None:
    def tree(leaf: str) -> dict[str, Any]:
        forest = record("Forest", field("trees", {"type": "array", "items": "Tree"}))
        return record("Tree", field("leaf", leaf), field("children", ["null", forest]))

    assert problems(tree("double"), tree("float")) == []
    assert problems(tree("float"), tree("double")) == [
        ("/fields/leaf", "writer type double cannot be read as float")
    ]


# --- Enums and fixed ------------------------------------------------------------------------


def test_a_reader_enum_may_add_symbols() -> None:
    assert problems(enum("Suit", "SPADES", "HEARTS", "CLUBS"), enum("Suit", "SPADES")) == []


def test_a_writer_symbol_the_reader_lacks_needs_a_reader_default() -> None:
    writer = enum("Suit", "SPADES", "HEARTS", "DIAMONDS")
    assert problems(enum("Suit", "SPADES", "HEARTS"), writer) == [
        (
            "",
            "writer symbols 'DIAMONDS' of enum 'Suit' are not in the reader's symbols, and the "
            "reader's enum has no default",
        )
    ]
    assert problems(enum("Suit", "SPADES", "HEARTS", default="SPADES"), writer) == []


def test_an_enum_is_matched_by_name_or_alias() -> None:
    assert problems(enum("Colour", "RED"), enum("Suit", "RED"))[0][1].startswith(
        "writer enum 'Suit' cannot be read as enum 'Colour'"
    )
    assert problems(enum("Colour", "RED", aliases=["Suit"]), enum("Suit", "RED")) == []


def test_fixed_must_keep_its_name_and_size() -> None:
    md5 = {"type": "fixed", "name": "Hash", "size": 16}
    assert problems(md5, md5) == []
    assert problems({**md5, "size": 32}, md5) == [
        ("", "writer fixed 'Hash' has size 16, the reader's has size 32")
    ]
    assert problems({**md5, "name": "Digest"}, md5) != []
    assert problems({**md5, "name": "Digest", "aliases": ["Hash"]}, md5) == []


# --- Arrays and maps ------------------------------------------------------------------------


def test_array_items_and_map_values_resolve_recursively() -> None:
    assert problems({"type": "array", "items": "long"}, {"type": "array", "items": "int"}) == []
    assert problems({"type": "array", "items": "int"}, {"type": "array", "items": "long"}) == [
        ("/items", "writer type long cannot be read as int")
    ]
    assert problems({"type": "map", "values": "int"}, {"type": "map", "values": "string"}) == [
        ("/values", "writer type string cannot be read as int")
    ]
    assert problems({"type": "array", "items": "int"}, {"type": "map", "values": "int"}) == [
        ("", "writer type map of int cannot be read as array of int")
    ]


def test_a_record_inside_an_array_is_located() -> None:
    def order(quantity: str) -> dict[str, Any]:
        line = record("Line", field("sku", "string"), field("quantity", quantity))
        return record("Order", field("lines", {"type": "array", "items": line}))

    assert problems(order("int"), order("long")) == [
        ("/fields/lines/items/fields/quantity", "writer type long cannot be read as int")
    ]


# --- Unions ---------------------------------------------------------------------------------


def test_every_branch_of_a_writer_union_must_be_readable() -> None:
    assert problems(["null", "int"], ["null", "string", "int"]) == [
        (
            "/union[1]",
            "writer type string cannot be read by any branch of the reader's union [null, int]",
        )
    ]
    assert problems("double", ["int", "long", "float"]) == []


def test_a_reader_union_reads_a_writer_type_one_of_its_branches_reads() -> None:
    assert problems(["null", "long"], "int") == []
    assert problems(["null", "string"], "int") == [
        ("", "writer type int cannot be read by any branch of the reader's union [null, string]")
    ]


def test_null_added_to_a_union_is_compatible_one_way_only() -> None:
    assert problems(["null", "string"], "string") == []
    assert problems("string", ["null", "string"]) == [
        ("/union[0]", "writer type null cannot be read as string")
    ]


def test_a_problem_inside_a_union_branch_is_reported_from_the_matching_branch() -> None:
    def person(zip_type: str) -> dict[str, Any]:
        address = record("Address", field("zip", zip_type))
        return record("Person", field("address", ["null", address]))

    assert problems(person("int"), person("string")) == [
        ("/fields/address/union[1]/fields/zip", "writer type string cannot be read as int")
    ]


# --- Fingerprints ---------------------------------------------------------------------------


def test_the_fingerprint_ignores_layout_attribute_order_and_docs() -> None:
    compact = b'{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}'
    spread = b"""{
        "fields": [ {"type": "int", "doc": "the a", "name": "a"} ],
        "doc": "a record",
        "name": "R",
        "type": "record"
    }"""
    one, other = parse_avro(compact), parse_avro(spread)
    assert one.fingerprint == other.fingerprint
    assert one == other and hash(one) == hash(other)
    assert one.fingerprint.startswith("sha256:") and len(one.fingerprint) == 7 + 64
    assert one.canonical == '{"name":"R","type":"record","fields":[{"name":"a","type":"int"}]}'


def test_the_fingerprint_follows_full_names() -> None:
    plain = avro(record("R", field("a", "int"), namespace="n"))
    qualified = avro(record("n.R", field("a", "int")))
    assert plain.fingerprint == qualified.fingerprint


@pytest.mark.parametrize(
    "changed",
    [
        record("R", field("a", "long")),
        record("R", field("b", "int")),
        record("S", field("a", "int")),
        record("R", field("a", "int"), field("c", "int")),
    ],
)
def test_the_fingerprint_changes_with_the_written_format(changed: dict[str, Any]) -> None:
    assert avro(changed).fingerprint != avro(record("R", field("a", "int"))).fingerprint


def test_the_fingerprint_changes_with_a_logical_type() -> None:
    """A decimal's scale changes what its bytes mean: another version, not the same one."""

    def decimal(scale: int) -> dict[str, Any]:
        kind = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": scale}
        return record("R", field("a", kind))

    two, four, plain = avro(decimal(2)), avro(decimal(4)), avro(record("R", field("a", "bytes")))
    assert two.canonical == four.canonical == plain.canonical
    assert len({two.fingerprint, four.fingerprint, plain.fingerprint}) == 3


def test_the_fingerprint_changes_with_a_default_or_an_alias() -> None:
    """Same written format, but readers fill in or match differently: a new version."""
    plain = avro(record("R", field("a", "int")))
    defaulted = avro(record("R", {"name": "a", "type": "int", "default": 7}))
    aliased = avro(record("R", {"name": "a", "type": "int", "aliases": ["old_a"]}))
    assert plain.canonical == defaulted.canonical == aliased.canonical
    assert len({plain.fingerprint, defaulted.fingerprint, aliased.fingerprint}) == 3


# --- Parse errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        (b'"\xff"', "the schema is not UTF-8 text: invalid start byte at byte 1"),
        (b'{"type": "record",', "the schema is not valid JSON: Expecting property name"),
        (b'"foo"', "unknown type 'foo': not a primitive type, and no named type 'foo'"),
        (b'{"type": "foo"}', "/type: unknown type 'foo'"),
        (b"42", "a schema is a type name, an object or a union array, not a number"),
        (b"{}", "a schema object needs a 'type'"),
        (b'{"type": "int", "type": "long"}', "repeats the key 'type'"),
        (b'{"type": {"type": "int"}}', "/type: an object's 'type' must be the name"),
        (b'{"type": "array"}', "a schema of type array needs 'items'"),
        (b'{"type": "record", "name": "R"}', "record 'R' needs a 'fields' array"),
        (b'{"type": "record", "fields": []}', "a record needs a 'name' string"),
        (b'{"type": "record", "name": "1R", "fields": []}', "/name: '1R' is not a valid name"),
        (b'{"type": "record", "name": "int", "fields": []}', "cannot be called 'int'"),
        (b'{"type": "fixed", "name": "F", "size": -1}', "a whole number"),
        (b'{"type": "enum", "name": "E", "symbols": ["A", "A"]}', "/symbols/1: the symbol 'A'"),
        (b'{"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}', "/default:"),
        (b'["int", ["null"]]', "/1: a union cannot contain another union"),
        (b'["int", "string", "int"]', "/2: the union already has a branch of type int"),
        (
            b'{"type":"record","name":"R","fields":[{"name":"a","type":"int"},'
            b'{"name":"a","type":"int"}]}',
            "/fields/1/name: record 'R' has two fields 'a'",
        ),
        (
            b'{"type":"record","name":"R","fields":[{"name":"a","type":"Missing"}]}',
            "/fields/0/type: unknown type 'Missing'",
        ),
        (
            b'{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":"1"}]}',
            "/fields/0/default: the default of field 'a' does not fit its type: expected int, "
            "got str",
        ),
        (
            b'{"type":"record","name":"R","fields":[{"name":"a","type":["null","int"],'
            b'"default":3}]}',
            "expected null (a union's default belongs to its first branch), got int",
        ),
        (
            b'{"type":"record","name":"R","fields":[{"name":"a","type":"bytes",'
            b'"default":"\\u0100"}]}',
            "a character above U+00FF",
        ),
        (
            b'{"type":"record","name":"R","fields":[{"name":"r","type":"R"}]},'
            b'{"type":"record","name":"R","fields":[]}',
            "the schema is not valid JSON: Extra data",
        ),
        (
            b'[{"type":"record","name":"R","fields":[]},{"type":"enum","name":"R","symbols":[]}]',
            "/1/name: the type 'R' is defined twice",
        ),
        (
            b'{"type":"bytes","logicalType":"decimal","precision":2,"scale":5}',
            "fastavro cannot use the schema: decimal scale",
        ),
    ],
)
def test_a_bad_definition_is_refused_saying_what_and_where(definition: bytes, message: str) -> None:
    with pytest.raises(SchemaParseError) as raised:
        parse_avro(definition)
    assert message in str(raised.value)


def test_named_types_inherit_the_enclosing_namespace() -> None:
    outer = record(
        "Outer",
        field("inner", record("Inner", field("x", "int"))),
        field("again", "Inner"),
        field("other", enum("Colour", "RED", namespace="elsewhere")),
        namespace="com.example",
    )
    canonical = avro(outer).canonical
    assert '"name":"com.example.Inner"' in canonical
    assert '"name":"elsewhere.Colour"' in canonical
    assert '"type":"com.example.Inner"' in canonical


def test_a_default_may_hold_a_record_and_fills_missing_fields_from_its_own_defaults() -> None:
    point = record("Point", field("x", "int"), field("y", "int", default=0))
    schema = avro(record("Shape", field("origin", point, default={"x": 1})))
    assert encode_json_datum(schema, {}) == binary(schema, {"origin": {"x": 1, "y": 0}})


# --- validate_datum -------------------------------------------------------------------------

PERSON = record(
    "Person",
    field("name", "string"),
    field("active", "boolean"),
    field("age", "int"),
    field("suit", enum("Suit", "SPADES", "HEARTS")),
    field("address", ["null", record("Address", field("zip", "int"))]),
    field("tags", {"type": "map", "values": "long"}),
    field("scores", {"type": "array", "items": "double"}),
    field("hash", {"type": "fixed", "name": "Hash", "size": 2}),
)
ALICE = {
    "name": "alice",
    "active": True,
    "age": 30,
    "suit": "HEARTS",
    "address": {"zip": 1234},
    "tags": {"a": 1, "b": 2},
    "scores": [1.5, 2.5],
    "hash": b"\x01\x02",
}


def test_a_datum_fastavro_wrote_is_valid() -> None:
    schema = avro(PERSON)
    assert validate_datum(schema, binary(schema, ALICE)) is None
    assert validate_datum(schema, binary(schema, {**ALICE, "address": None, "tags": {}})) is None


def test_trailing_and_missing_bytes_are_reported() -> None:
    schema = avro(PERSON)
    payload = binary(schema, ALICE)
    assert validate_datum(schema, payload + b"\x00") == (
        f"the datum ends at byte {len(payload)}, but the payload goes on for 1 more "
        "(trailing bytes)"
    )
    assert validate_datum(schema, payload[:-1]) == (
        f"field 'hash': the payload ends inside fixed 'Hash': 2 bytes needed at byte "
        f"{len(payload) - 2}, 1 left"
    )
    assert validate_datum(avro("int"), b"") == "the payload ends inside an int at byte 0"


def person_bytes(**overrides: bytes) -> bytes:
    """PERSON's encoding of ALICE with some fields' bytes replaced, to hand-craft bad data."""
    parts = {
        "name": b"\x0aalice",
        "active": b"\x01",
        "age": b"\x3c",
        "suit": b"\x02",
        "address": b"\x02\xa4\x13",
        "tags": b"\x00",
        "scores": b"\x00",
        "hash": b"\x01\x02",
    }
    parts.update(overrides)
    return b"".join(parts.values())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"active": b"\x02"}, "field 'active': a boolean is the byte 0 or 1, not 2"),
        ({"age": b"\x80\x80\x80\x80\x10"}, "field 'age': an int does not fit in 32 bits"),
        ({"age": b"\x80\x80\x80\x80\x80\x01"}, "field 'age': an int runs over 5 bytes"),
        ({"suit": b"\x04"}, "field 'suit': enum index 2 is out of range: enum 'Suit' has 2"),
        ({"suit": b"\x01"}, "field 'suit': enum index -1 is out of range"),
        ({"address": b"\x04"}, "field 'address': union index 2 is out of range"),
        ({"address": b"\x02\xff\xff\xff\xff\x7f"}, "field 'address.zip': an int does not fit"),
        ({"name": b"\x04\xff\xfe"}, "field 'name': the string is not UTF-8: invalid start byte"),
        ({"name": b"\x03"}, "field 'name': the length of a string is negative (-2)"),
        ({"name": b"\x7e"}, "field 'name': the payload ends inside a string: 63 bytes needed"),
        ({"tags": b"\x02\x02\xff\x02\x00"}, "field 'tags[0]': the string is not UTF-8"),
        (
            {"tags": b"\x02\x02k\x80", "scores": b"", "hash": b""},
            "field 'tags[\"k\"]': the payload ends inside a long",
        ),
        ({"scores": b"\xfe\xff\xff\xff\x0f"}, "field 'scores': a block claims 2147483647 items"),
        (
            {"scores": b"\x01\x02" + b"\x00" * 8 + b"\x00"},
            "field 'scores': a block's byte size says it ends",
        ),
    ],
)
def test_a_malformed_datum_is_refused_naming_the_field(
    overrides: dict[str, bytes], message: str
) -> None:
    schema = avro(PERSON)
    assert validate_datum(schema, person_bytes()) is None
    found = validate_datum(schema, person_bytes(**overrides))
    assert found is not None and found.startswith(message), found


def test_a_block_with_a_byte_size_is_read() -> None:
    schema = avro(PERSON)
    one_double = b"\x01\x10" + b"\x00" * 8 + b"\x00"
    assert validate_datum(schema, person_bytes(scores=one_double)) is None


def test_a_huge_count_of_empty_items_is_not_walked() -> None:
    # 2**62 - 1 items, then the end of the array: a loop over them would never finish.
    nothing = avro({"type": "array", "items": record("Nothing")})
    assert validate_datum(nothing, b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f\x00") is None


def test_a_long_linked_list_does_not_exhaust_the_stack() -> None:
    schema = avro(linked_list("int"))
    assert validate_datum(schema, b"\x02\x02" * 20_000 + b"\x02\x00") is None
    assert validate_datum(schema, b"\x02\x02" * 20_000) is not None


# --- validate_json and encode_json_datum ----------------------------------------------------

JSON_ALICE = {**ALICE, "hash": "\u0001\u0002"}


def test_a_json_value_is_valid_and_encodes_as_fastavro_does() -> None:
    schema = avro(PERSON)
    assert validate_json(schema, JSON_ALICE) is None
    payload = encode_json_datum(schema, JSON_ALICE)
    assert payload == binary(schema, ALICE)
    assert fastavro.schemaless_reader(io.BytesIO(payload), schema.parsed, None) == ALICE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"age": "30"}, "field 'age': expected int, got str"),
        ({"age": True}, "field 'age': expected int, got bool"),
        ({"age": 2**31}, "field 'age': 2147483648 is out of the range of int"),
        ({"address": {"zip": "x"}}, "field 'address.zip': expected int, got str"),
        ({"address": {"zp": 1}}, "field 'address.zp': record 'Address' has no such field"),
        ({"address": {}}, "field 'address.zip': missing, and the field has no default"),
        ({"address": 5}, "field 'address': expected null or record 'Address', got int"),
        ({"suit": "CLUBS"}, "field 'suit': expected a symbol of enum 'Suit' (SPADES, HEARTS)"),
        ({"scores": [1.0, "x"]}, "field 'scores[1]': expected double, got str"),
        ({"tags": {"k": 1.5}}, "field 'tags[\"k\"]': expected long, got float"),
        ({"hash": "\u0001"}, "field 'hash': fixed 'Hash' holds 2 bytes, got 1"),
        ({"hash": "\u0101\u0002"}, "field 'hash': fixed 'Hash' is written as a string"),
        ({"name": "\ud800"}, "field 'name': the string holds a lone surrogate"),
    ],
)
def test_a_bad_json_value_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    schema = avro(PERSON)
    value = {**JSON_ALICE, **change}
    found = validate_json(schema, value)
    assert found is not None and found.startswith(message), found
    with pytest.raises(ValueError, match=r"^field '"):
        encode_json_datum(schema, value)


def test_a_missing_field_takes_its_default_when_encoded() -> None:
    schema = avro(record("R", field("a", "int"), field("b", ["null", "string"], default=None)))
    assert validate_json(schema, {"a": 1}) is None
    assert encode_json_datum(schema, {"a": 1}) == binary(schema, {"a": 1, "b": None})


def test_a_union_value_is_written_as_the_first_branch_it_fits() -> None:
    schema = avro(["null", "float", "string"])
    assert encode_json_datum(schema, 1) == b"\x02" + b"\x00\x00\x80\x3f"
    assert encode_json_datum(schema, "x") == b"\x04\x02x"
    assert validate_json(schema, [1]) == "expected null or float or string, got list"


def test_a_top_level_value_error_has_no_field() -> None:
    assert validate_json(avro("int"), "1") == "expected int, got str"
    assert validate_json(avro({"type": "array", "items": "int"}), [1, None]) == (
        "field '[1]': expected int, got None"
    )


# --- Properties -----------------------------------------------------------------------------

PRIMITIVE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32),
    "double": st.floats(),
    # UTF-8 only: the specification lets a reader read bytes as a string, which works only
    # for bytes that are text, so arbitrary bytes would fail for a reason the rules allow.
    "bytes": st.text(max_size=4).map(str.encode),
    "string": st.text(max_size=4),
}
PRIMITIVE_DEFAULTS = {
    "null": None,
    "boolean": False,
    "int": 0,
    "long": 0,
    "float": 0.0,
    "double": 0.0,
    "bytes": "",
    "string": "",
}
SYMBOLS = ["A", "B", "C", "D"]


def draw_schema(draw: st.DrawFn, depth: int, names: Iterator[int]) -> Any:
    """A random schema of the grammar; every named type gets a fresh name, as a schema may
    define each only once."""
    kinds = ["primitive", "record", "array", "map", "enum", "nullable"]
    kind = draw(st.sampled_from(kinds[:1] if depth == 0 else kinds))
    if kind == "primitive":
        return draw(st.sampled_from(PRIMITIVES))
    if kind == "record":
        width = draw(st.integers(0, 4))
        fields = []
        for index in range(width):
            type_ = draw_schema(draw, depth - 1, names)
            nullable = isinstance(type_, list)
            fields.append(field(f"f{index}", type_, **({"default": None} if nullable else {})))
        return record(f"R{next(names)}", *fields)
    if kind == "array":
        return {"type": "array", "items": draw_schema(draw, depth - 1, names)}
    if kind == "map":
        return {"type": "map", "values": draw_schema(draw, depth - 1, names)}
    if kind == "enum":
        symbols = draw(st.lists(st.sampled_from(SYMBOLS), min_size=1, unique=True))
        return enum(f"E{next(names)}", *symbols)
    inner = draw_schema(draw, depth - 1, names)
    return inner if isinstance(inner, list) or inner == "null" else ["null", inner]


@st.composite
def schemas(draw: st.DrawFn) -> Any:
    return draw_schema(draw, 3, count())


@st.composite
def records(draw: st.DrawFn) -> Any:
    names = count()
    width = draw(st.integers(0, 4))
    return record("R", *(field(f"f{i}", draw_schema(draw, 2, names)) for i in range(width)))


def values(schema: Any) -> st.SearchStrategy[Any]:
    """Datums of a schema drawn from the grammar (which defines every named type inline)."""
    if isinstance(schema, str):
        return PRIMITIVE_VALUES[schema]
    if isinstance(schema, list):
        return st.one_of(*(values(branch) for branch in schema))
    kind = schema["type"]
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values(f["type"]) for f in schema["fields"]})
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(values(schema["items"]), max_size=3)
    return st.dictionaries(st.text(max_size=3), values(schema["values"]), max_size=3)


def evolve(draw: st.DrawFn, schema: Any, may_wrap: bool = True) -> Any:
    """A schema a few evolution steps from `schema`, names kept: promotions and other type
    changes, fields added (with or without a default), dropped or renamed with an alias,
    symbols added or removed, a reader default, null added to or taken from a union."""
    if isinstance(schema, list):
        inner = evolve(draw, schema[1], may_wrap=False)
        if inner == "null":
            return inner
        return draw(st.sampled_from([["null", inner], ["null", inner], inner]))
    if isinstance(schema, str):
        wider = [reader for writer, reader in PROMOTIONS if writer == schema]
        evolved = draw(st.sampled_from([schema, schema, *wider, *PRIMITIVES]))
    elif schema["type"] == "record":
        evolved = {**schema, "fields": evolve_fields(draw, schema["fields"])}
    elif schema["type"] == "enum":
        symbols = draw(st.lists(st.sampled_from(SYMBOLS), min_size=1, unique=True))
        default = draw(st.one_of(st.none(), st.sampled_from(symbols)))
        extra = {} if default is None else {"default": default}
        evolved = enum(schema["name"], *symbols, **extra)
    elif schema["type"] == "array":
        evolved = {"type": "array", "items": evolve(draw, schema["items"])}
    else:
        evolved = {"type": "map", "values": evolve(draw, schema["values"])}
    if may_wrap and evolved != "null" and draw(st.integers(0, 4)) == 0:
        return ["null", evolved]
    return evolved


def evolve_fields(draw: st.DrawFn, fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
    evolved = []
    for old in fields:
        action = draw(st.sampled_from(["keep", "keep", "evolve", "drop", "rename"]))
        if action == "drop":
            continue
        type_ = old["type"] if action == "keep" else evolve(draw, old["type"])
        new = field(old["name"], type_)
        if action == "rename":
            new = field(f"{old['name']}_renamed", type_, aliases=[old["name"]])
        if isinstance(type_, list):
            new["default"] = None
        evolved.append(new)
    for index in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(PRIMITIVES))
        with_default = draw(st.booleans())
        extra = {"default": PRIMITIVE_DEFAULTS[kind]} if with_default else {}
        evolved.append(field(f"added{index}", kind, **extra))
    return evolved


def read_back(payload: bytes, writer: AvroSchema, reader: AvroSchema) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(payload), writer.parsed, reader.parsed)


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(schemas())
def test_every_schema_reads_itself(definition: Any) -> None:
    schema = avro(definition)
    assert avro_can_read(schema, schema) == []


@PROPERTY
@given(st.data())
def test_what_is_called_readable_fastavro_reads(data: st.DataObject) -> None:
    writer_json = data.draw(schemas())
    reader_json = evolve(data.draw, writer_json)
    writer, reader = avro(writer_json), avro(reader_json)
    for old, new, old_json in ((writer, reader, writer_json), (reader, writer, reader_json)):
        if avro_can_read(new, old):
            continue
        for datum in data.draw(st.lists(values(old_json), min_size=1, max_size=3)):
            read_back(binary(old, datum), old, new)


@PROPERTY
@given(st.data())
def test_a_field_added_with_a_default_reads_the_old_schema(data: st.DataObject) -> None:
    old_json = data.draw(records())
    kind = data.draw(st.sampled_from(PRIMITIVES))
    added = field("added", kind, default=PRIMITIVE_DEFAULTS[kind])
    new_json = {**old_json, "fields": [*old_json["fields"], added]}
    old, new = avro(old_json), avro(new_json)
    assert avro_can_read(new, old) == []
    datum = data.draw(values(old_json))
    assert "added" in read_back(binary(old, datum), old, new)


@PROPERTY
@given(st.data())
def test_the_checks_agree_with_fastavros_writer(data: st.DataObject) -> None:
    definition = data.draw(schemas())
    schema = avro(definition)
    datum = data.draw(values(definition))
    payload = binary(schema, datum)
    assert validate_datum(schema, payload) is None
    assert validate_json(schema, datum) is None
    assert encode_json_datum(schema, datum) == payload


@PROPERTY
@given(st.data())
def test_a_decoded_datum_is_json_that_encodes_to_the_same_value(data: st.DataObject) -> None:
    """What `danube-cli consume` prints can be given back to `danube-cli produce`."""
    definition = data.draw(schemas())
    schema = avro(definition)
    shown = decode_json_datum(schema, binary(schema, data.draw(values(definition))))
    printed = json.dumps(shown)
    again = decode_json_datum(schema, encode_json_datum(schema, json.loads(printed)))
    assert json.dumps(again) == printed  # as text: a NaN equals nothing, its text equals itself


def test_a_decoded_datum_shows_bytes_as_code_points_and_logical_types_as_text() -> None:
    schema = avro(
        record(
            "Shown",
            field("raw", "bytes"),
            field("at", {"type": "long", "logicalType": "timestamp-millis"}),
            field("day", {"type": "int", "logicalType": "date"}),
        )
    )
    payload = encode_json_datum(schema, {"raw": "\u00ff\u0000", "at": 0, "day": 1})
    assert decode_json_datum(schema, payload) == {
        "raw": "\u00ff\u0000",
        "at": "1970-01-01T00:00:00+00:00",
        "day": "1970-01-02",
    }


def test_decoding_a_payload_that_is_no_datum_says_where() -> None:
    schema = avro(record("Order", field("id", "long"), field("name", "string")))
    with pytest.raises(ValueError, match="field 'name'"):
        decode_json_datum(schema, b"\x02\x10ab")


def has_empty_items(schema: Any) -> bool:
    """Whether an array's items take no bytes, which fastavro would loop over count times."""
    if isinstance(schema, list):
        return any(has_empty_items(branch) for branch in schema)
    if isinstance(schema, str):
        return False
    if schema["type"] == "array":
        items = schema["items"]
        empty = items == "null" or (isinstance(items, dict) and items.get("fields") == [])
        return empty or has_empty_items(items)
    if schema["type"] == "map":
        return has_empty_items(schema["values"])
    return schema["type"] == "record" and any(has_empty_items(f["type"]) for f in schema["fields"])


@PROPERTY
@given(schemas(), st.binary(max_size=24))
def test_bytes_validate_datum_accepts_fastavro_decodes_whole(
    definition: Any, payload: bytes
) -> None:
    assume(not has_empty_items(definition))
    schema = avro(definition)
    if validate_datum(schema, payload) is None:
        buffer = io.BytesIO(payload)
        fastavro.schemaless_reader(buffer, schema.parsed, None)
        assert buffer.tell() == len(payload)
