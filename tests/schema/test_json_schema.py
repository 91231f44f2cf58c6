"""JSON Schema: parsing (errors name the keyword's path, the fingerprint ignores layout),
payload validation messages, and the compatibility rules, one table row per rule, checked
both ways where it matters, with property tests for the two promises that make the rules
usable: a schema reads itself, and an empty answer means the reader accepts everything the
writer does."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.json_compat import json_can_read
from danube.machines.schema.json_schema import (
    JsonSchema,
    parse_json_schema,
    validate_payload,
)

DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"
DRAFT_4 = "http://json-schema.org/draft-04/schema#"


def parse(schema: Any) -> JsonSchema:
    return parse_json_schema(json.dumps(schema).encode())


def obj(properties: dict[str, Any], **keywords: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **keywords}


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
ADDRESS_INT = obj({"address": obj({"zip": INTEGER})})
ADDRESS_STR = obj({"address": obj({"zip": STRING})})
LIST_INT = {
    "definitions": {"node": obj({"value": INTEGER, "next": {"$ref": "#/definitions/node"}})},
    "$ref": "#/definitions/node",
}
LIST_NUM = {
    "definitions": {
        "node": obj({"value": {"type": "number"}, "next": {"$ref": "#/definitions/node"}})
    },
    "$ref": "#/definitions/node",
}

# (reader, writer, expected incompatibilities as (path, words in the message)); [] = compatible.
CASES: list[Any] = [
    pytest.param(
        obj({"a": STRING}, additionalProperties=False),
        obj({"a": STRING, "b": INTEGER}, additionalProperties=False),
        [("#/properties/b", "additionalProperties is false")],
        id="closed-reader-writer-adds-optional-property",
    ),
    pytest.param(
        obj({"a": STRING}, additionalProperties=False),
        obj({"a": STRING}),
        [("#/additionalProperties", "undeclared properties")],
        id="closed-reader-open-writer",
    ),
    pytest.param(
        obj({"a": STRING, "b": INTEGER}, additionalProperties=False),
        obj({"a": STRING}, additionalProperties=False),
        [],
        id="closed-writer-reader-adds-optional-property",
    ),
    pytest.param(
        obj({"a": STRING, "b": INTEGER}),
        obj({"a": STRING}),
        [("#/properties/b", "content model is open")],
        id="property-added-to-open-content-model",
    ),
    pytest.param(
        obj({"a": STRING, "b": {"description": "anything"}}),
        obj({"a": STRING}),
        [],
        id="property-accepting-anything-added-to-open-content-model",
    ),
    pytest.param(
        obj({"a": STRING}),
        obj({"a": STRING, "b": INTEGER}),
        [],
        id="open-reader-writer-adds-property",
    ),
    pytest.param(
        obj({"a": STRING}, required=["a"]),
        obj({"a": STRING}),
        [("#/required", "'a'")],
        id="field-made-required",
    ),
    pytest.param(
        obj({"a": STRING}),
        obj({"a": STRING}, required=["a"]),
        [],
        id="field-made-optional",
    ),
    pytest.param({"type": "number"}, INTEGER, [], id="integer-widened-to-number"),
    pytest.param(
        INTEGER, {"type": "number"}, [("#/type", "non-integer numbers")], id="number-to-integer"
    ),
    pytest.param({"type": ["string", "null"]}, STRING, [], id="type-list-widened"),
    pytest.param(
        STRING, {"type": ["string", "null"]}, [("#/type", "null")], id="type-list-narrowed"
    ),
    pytest.param(
        obj({}),
        {"properties": {}},
        [("#/type", "does not restrict the type")],
        id="writer-without-type",
    ),
    pytest.param(
        {"type": "string", "maxLength": 5},
        {"type": "string", "maxLength": 10},
        [("#/maxLength", "at most 5")],
        id="maxLength-narrowed",
    ),
    pytest.param(
        {"type": "string", "maxLength": 10},
        {"type": "string", "maxLength": 5},
        [],
        id="maxLength-widened",
    ),
    pytest.param(
        {"type": "string", "maxLength": 10},
        STRING,
        [("#/maxLength", "sets no limit")],
        id="maxLength-added",
    ),
    pytest.param(
        {"type": "string", "minLength": 2},
        {"type": "string", "minLength": 1},
        [("#/minLength", "at least 2")],
        id="minLength-raised",
    ),
    pytest.param(
        {"type": "string", "minLength": 1},
        {"type": "string", "minLength": 2},
        [],
        id="minLength-lowered",
    ),
    pytest.param(
        {"type": "string", "pattern": "^[a-z]+$"},
        {"type": "string", "pattern": "^[a-z]+$"},
        [],
        id="pattern-unchanged",
    ),
    pytest.param(
        {"type": "string", "pattern": "^[a-z]+$", "title": "reader"},
        {"type": "string", "pattern": "^[a-z]*$"},
        [("#/pattern", "compared only when equal")],
        id="pattern-changed",
    ),
    pytest.param(
        {"enum": ["a", "b"]},
        {"enum": ["a", "b", "c"]},
        [("#", '"c"')],
        id="enum-value-added-by-writer",
    ),
    pytest.param({"enum": ["a", "b", "c"]}, {"enum": ["a", "b"]}, [], id="enum-value-removed"),
    pytest.param(
        {"enum": ["a", "b"]}, STRING, [("#", "not limited to a list")], id="enum-added-to-string"
    ),
    pytest.param(STRING, {"enum": ["a", "b"]}, [], id="enum-read-as-string"),
    pytest.param({"const": "a"}, {"enum": ["a"]}, [], id="const-equals-single-enum"),
    pytest.param(
        {"const": "a"}, {"enum": ["a", "b"]}, [("#", '"b"')], id="const-narrower-than-enum"
    ),
    pytest.param(
        ADDRESS_INT,
        ADDRESS_STR,
        [("#/properties/address/properties/zip/type", "does not accept string")],
        id="nested-property-type-changed",
    ),
    pytest.param(
        {
            "definitions": {"zip": INTEGER},
            "type": "object",
            "properties": {"zip": {"$ref": "#/definitions/zip"}},
        },
        obj({"zip": STRING}),
        [("#/properties/zip/type", "does not accept string")],
        id="ref-to-definitions-in-reader",
    ),
    pytest.param(
        obj({"zip": {"type": "number"}}),
        {
            "$schema": DRAFT_2020,
            "$defs": {"zip": INTEGER},
            "type": "object",
            "properties": {"zip": {"$ref": "#/$defs/zip"}},
        },
        [],
        id="ref-to-defs-in-writer",
    ),
    pytest.param(LIST_NUM, LIST_INT, [], id="recursive-ref-widened"),
    pytest.param(
        LIST_INT,
        LIST_NUM,
        [("#/properties/value/type", "non-integer")],
        id="recursive-ref-narrowed",
    ),
    pytest.param(
        {"oneOf": [STRING, INTEGER, {"type": "array"}]},
        {"oneOf": [STRING, INTEGER]},
        [],
        id="oneOf-branch-added",
    ),
    pytest.param(
        {"oneOf": [STRING, INTEGER]},
        {"oneOf": [STRING, INTEGER, {"type": "array"}]},
        [("#/oneOf", "no branch")],
        id="oneOf-branch-removed",
    ),
    pytest.param(
        {"oneOf": [{"type": "number"}, INTEGER]},
        INTEGER,
        [("#/oneOf", "exactly one")],
        id="oneOf-overlapping-branches",
    ),
    pytest.param(
        {
            "oneOf": [
                obj({"kind": {"const": "a"}, "x": INTEGER}, required=["kind"]),
                obj({"kind": {"const": "b"}, "x": STRING}, required=["kind"]),
            ]
        },
        obj({"kind": {"const": "a"}, "x": INTEGER}, required=["kind"]),
        [],
        id="oneOf-discriminated-by-const",
    ),
    pytest.param({"anyOf": [STRING, INTEGER]}, INTEGER, [], id="anyOf-reads-plain-writer"),
    pytest.param(
        {"anyOf": [STRING, INTEGER]},
        {"type": "boolean"},
        [("#", "allows false"), ("#", "allows true")],
        id="anyOf-misses-finite-writer",
    ),
    pytest.param(
        {"anyOf": [STRING, INTEGER]},
        {"type": "array"},
        [("#/anyOf", "no branch")],
        id="anyOf-misses-writer",
    ),
    pytest.param(
        {"type": ["string", "integer"]}, {"anyOf": [STRING, INTEGER]}, [], id="writer-anyOf"
    ),
    pytest.param(
        STRING, {"anyOf": [STRING, INTEGER]}, [("#/type", "integer")], id="writer-anyOf-branch"
    ),
    pytest.param(
        {"allOf": [{"type": "object", "required": ["a"]}]},
        obj({"a": STRING}),
        [("#/allOf/0/required", "'a'")],
        id="reader-allOf",
    ),
    pytest.param(
        obj({"a": STRING}, required=["a"]),
        {"allOf": [obj({"a": STRING}), {"required": ["a"]}]},
        [],
        id="writer-allOf-conjunction",
    ),
    pytest.param(
        {"type": "number", "minimum": 0},
        {"type": "number", "minimum": -5},
        [("#/minimum", ">= -5")],
        id="minimum-raised",
    ),
    pytest.param(
        {"type": "number", "minimum": 0}, {"type": "number", "minimum": 5}, [], id="minimum-lowered"
    ),
    pytest.param(
        {"type": "integer", "minimum": 1},
        {"type": "integer", "exclusiveMinimum": 0},
        [],
        id="integer-exclusive-bound",
    ),
    pytest.param(
        {"type": "number", "minimum": 1},
        {"type": "number", "exclusiveMinimum": 0},
        [("#/minimum", "> 0")],
        id="number-exclusive-bound",
    ),
    pytest.param(
        {"type": "number", "exclusiveMaximum": 10},
        {"type": "number", "maximum": 10},
        [("#/exclusiveMaximum", "<= 10")],
        id="exclusiveMaximum-tightened",
    ),
    pytest.param(
        {"type": "number", "maximum": 10},
        {"type": "number"},
        [("#/maximum", "no upper bound")],
        id="maximum-added",
    ),
    pytest.param(
        {"$schema": DRAFT_4, "type": "number", "minimum": 0, "exclusiveMinimum": True},
        {"$schema": DRAFT_4, "type": "number", "minimum": 0},
        [("#/minimum", "> 0")],
        id="draft4-boolean-exclusive",
    ),
    pytest.param(
        {"type": "integer", "multipleOf": 2},
        {"type": "integer", "multipleOf": 4},
        [],
        id="multipleOf-divides",
    ),
    pytest.param(
        {"type": "integer", "multipleOf": 2},
        {"type": "integer", "multipleOf": 3},
        [("#/multipleOf", "multiples of 2")],
        id="multipleOf-does-not-divide",
    ),
    pytest.param({"type": "number", "multipleOf": 1}, INTEGER, [], id="multipleOf-one-integers"),
    pytest.param(
        {"type": "array", "items": STRING},
        {"type": "array", "items": INTEGER},
        [("#/items/type", "does not accept integer")],
        id="items-changed",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "number"}},
        {"type": "array", "items": INTEGER},
        [],
        id="items-widened",
    ),
    pytest.param(
        {"type": "array", "items": [STRING, INTEGER], "additionalItems": False},
        {"type": "array", "items": [STRING, {"type": "number"}]},
        [("#/items/1/type", "non-integer"), ("#/additionalItems", "at most 2 items")],
        id="tuple-items",
    ),
    pytest.param(
        {"type": "array", "items": [STRING], "additionalItems": INTEGER},
        {"type": "array", "items": STRING, "maxItems": 1},
        [],
        id="tuple-reader-writer-list-short",
    ),
    pytest.param(
        {"$schema": DRAFT_2020, "type": "array", "prefixItems": [STRING], "items": False},
        {"$schema": DRAFT_2020, "type": "array", "prefixItems": [STRING, STRING]},
        [("#/items", "at most 1 items")],
        id="prefixItems-2020",
    ),
    pytest.param(
        {"type": "array", "maxItems": 3},
        {"type": "array", "maxItems": 5},
        [("#/maxItems", "at most 3")],
        id="maxItems-narrowed",
    ),
    pytest.param(
        {"type": "array", "minItems": 1},
        {"type": "array"},
        [("#/minItems", "at least 1")],
        id="minItems-added",
    ),
    pytest.param(
        {"type": "array", "uniqueItems": True},
        {"type": "array"},
        [("#/uniqueItems", "unique")],
        id="uniqueItems-added",
    ),
    pytest.param(
        {"type": "array"}, {"type": "array", "uniqueItems": True}, [], id="uniqueItems-dropped"
    ),
    pytest.param(True, obj({"a": STRING}), [], id="reader-true"),
    pytest.param({}, obj({"a": STRING}), [], id="reader-empty-object"),
    pytest.param(False, obj({}), [("#", "accepts nothing")], id="reader-false"),
    pytest.param(obj({}), False, [], id="writer-false"),
    pytest.param(obj({"a": STRING}), obj({"a": False}), [], id="writer-forbids-property"),
    pytest.param(
        obj({"a": False}),
        obj({"a": STRING}),
        [("#/properties/a", "false")],
        id="reader-forbids-property",
    ),
    pytest.param({"not": STRING}, {"not": STRING}, [], id="not-equal"),
    pytest.param(
        {"not": {"type": "string", "description": "no text"}},
        {"not": STRING},
        [],
        id="not-equal-but-annotations",
    ),
    pytest.param({"not": STRING}, INTEGER, [], id="not-disjoint-by-type"),
    pytest.param(
        {"not": {"type": "string", "maxLength": 3}},
        {"type": "string", "minLength": 1},
        [("#/not", "compares only when equal")],
        id="not-not-comparable",
    ),
    pytest.param(
        obj({"a": STRING}, additionalProperties=STRING),
        obj({"a": STRING, "b": INTEGER}),
        [("#/properties/b/type", "does not accept integer"), ("#/additionalProperties/type", "")],
        id="additionalProperties-schema",
    ),
    pytest.param(
        obj({}, additionalProperties=STRING),
        obj({}, additionalProperties={"type": "string", "maxLength": 3}),
        [],
        id="additionalProperties-schema-widened",
    ),
    pytest.param(
        {"type": "object", "patternProperties": {"^x_": {"type": "number"}}},
        {"type": "object", "patternProperties": {"^x_": INTEGER}, "additionalProperties": False},
        [],
        id="patternProperties-same-patterns",
    ),
    pytest.param(
        {"type": "object", "patternProperties": {"^x_": INTEGER}},
        {"type": "object", "patternProperties": {"^y_": INTEGER}},
        [("#/patternProperties/^x_/type", "does not restrict the type")],
        id="patternProperties-different-patterns",
    ),
    pytest.param(
        {"type": "object", "propertyNames": {"maxLength": 3}},
        obj({"ab": STRING, "abc": STRING}, additionalProperties=False),
        [],
        id="propertyNames-closed-writer",
    ),
    pytest.param(
        {"type": "object", "propertyNames": {"maxLength": 3}},
        obj({}),
        [("#/propertyNames/maxLength", "sets no limit")],
        id="propertyNames-open-writer",
    ),
    pytest.param(
        {"type": "object", "dependencies": {"a": ["b"]}},
        obj({"a": STRING, "b": STRING}, required=["b"]),
        [],
        id="dependencies-satisfied-by-required",
    ),
    pytest.param(
        {"type": "object", "dependencies": {"a": ["b"]}},
        obj({"a": STRING, "b": STRING}),
        [("#/dependencies/a", "'b' whenever 'a'")],
        id="dependencies-added",
    ),
    pytest.param(
        {"if": obj({"a": INTEGER}), "then": {"required": ["a"]}},
        {"if": obj({"a": INTEGER}), "then": {"required": ["a"]}, "title": "writer"},
        [],
        id="if-then-equal",
    ),
    pytest.param(
        {"if": obj({"a": INTEGER}), "then": {"required": ["a"]}},
        obj({"a": INTEGER}),
        [("#/if", "equal 'if'")],
        id="if-then-not-comparable",
    ),
    pytest.param(
        {"$schema": DRAFT_2020, "type": "object", "unevaluatedProperties": False},
        {"$schema": DRAFT_2020, "type": "object", "properties": {"a": STRING}},
        [("#/unevaluatedProperties", "only when unchanged")],
        id="unevaluatedProperties-not-comparable",
    ),
]


@pytest.mark.parametrize(("reader", "writer", "expected"), CASES)
def test_compatibility_rules(reader: Any, writer: Any, expected: list[tuple[str, str]]) -> None:
    issues = json_can_read(parse(reader), parse(writer))
    assert [issue.path for issue in issues] == [path for path, _ in expected], issues
    for issue, (_, words) in zip(issues, expected, strict=True):
        assert words in issue.message, issue
        assert issue.message[0].islower()


def test_every_incompatibility_is_returned() -> None:
    reader = obj(
        {"a": INTEGER, "b": {"type": "string", "maxLength": 2}},
        required=["a", "b"],
        additionalProperties=False,
    )
    writer = obj({"a": {"type": "number"}, "b": STRING, "c": STRING})
    paths = {issue.path for issue in json_can_read(parse(reader), parse(writer))}
    assert paths == {
        "#/properties/a/type",
        "#/properties/b/maxLength",
        "#/properties/c",
        "#/required",
        "#/additionalProperties",
    }


def test_schema_reads_itself_even_when_rewritten() -> None:
    for schema in (LIST_INT, ADDRESS_INT, {"oneOf": [STRING, INTEGER]}):
        same = parse(schema)
        assert json_can_read(same, same) == []
        assert json_can_read(parse({**schema, "title": "r"}), parse({**schema, "title": "w"})) == []


def test_incompatibility_renders_path_and_message() -> None:
    (issue,) = json_can_read(parse(INTEGER), parse({"type": "number"}))
    assert str(issue) == f"#/type: {issue.message}"


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "words"),
    [
        pytest.param(b"\xff{}", "not valid UTF-8", id="utf8"),
        pytest.param(b'{"type": ', "not valid JSON", id="json"),
        pytest.param(b'{"minimum": NaN}', "NaN", id="nan"),
        pytest.param(b'{"minimum": 1e999}', "out of range", id="overflow"),
        pytest.param(b'{"type": "strin"}', "at $.type:", id="bad-type"),
        pytest.param(
            b'{"properties": {"a": {"maxLength": -1}}}',
            "at $.properties.a.maxLength:",
            id="nested-bad-keyword",
        ),
        pytest.param(b'{"pattern": "("}', "at $.pattern:", id="bad-regex"),
        pytest.param(b"42", "at $:", id="not-a-schema"),
        pytest.param(
            b'{"$schema": "http://json-schema.org/draft-03/schema#"}',
            "no supported draft",
            id="draft3",
        ),
        pytest.param(b'{"$schema": 7}', "$['$schema']", id="schema-not-string"),
        pytest.param(
            b'{"properties": {"a": {"$ref": "#/definitions/missing"}}}',
            "at $.properties.a['$ref']: reference '#/definitions/missing' points to nothing",
            id="dangling-ref",
        ),
        pytest.param(
            b'{"$ref": "https://example.com/other.json"}', "points outside", id="remote-ref"
        ),
        pytest.param(b'{"$ref": "#nowhere"}', "names no anchor", id="missing-anchor"),
        pytest.param(
            b'{"$schema": "http://json-schema.org/draft-04/schema#", "$ref": {}}',
            "at $['$ref']: a reference must be a string",
            id="draft4-ref-not-string",
        ),
        pytest.param(
            b'{"$id": "https://example.com/s.json", "$ref": "s.json#/definitions/a",'
            b' "definitions": {"a": {}}}',
            "points outside",
            id="draft7-ref-hides-id",
        ),
        pytest.param(b'{"$ref": "#"}', "at $['$ref']: this leads back", id="self-reference"),
        pytest.param(
            b'{"definitions": {"a": {"anyOf": [{"type": "string"}, {"$ref": "#/definitions/a"}]}}}',
            "at $.definitions.a.anyOf[1]['$ref']: this leads back",
            id="reference-loop",
        ),
        pytest.param(
            b'{"properties": {"a": ' * 300 + b"{}" + b"}}" * 300, "nested too deeply", id="deep"
        ),
    ],
)
def test_parse_errors_say_what_and_where(definition: bytes, words: str) -> None:
    with pytest.raises(SchemaParseError, match=re.escape(words)):
        parse_json_schema(definition)


def test_parse_uses_the_draft_named_by_schema() -> None:
    draft4 = parse({"$schema": DRAFT_4, "type": "integer"})
    assert validate_payload(draft4, b"1.0") is not None
    assert validate_payload(parse(INTEGER), b"1.0") is None
    assert validate_payload(parse({"$schema": DRAFT_2020, "prefixItems": [STRING]}), b"[1]")


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(
            {
                "$schema": DRAFT_2020,
                "$id": "https://example.com/s.json",
                "$ref": "https://example.com/s.json#/$defs/a",
                "$defs": {"a": STRING},
            },
            id="absolute-uri-of-this-schema",
        ),
        pytest.param(
            {
                "$id": "https://example.com/s.json",
                "allOf": [{"$ref": "s.json#/definitions/a"}],
                "definitions": {"a": STRING},
            },
            id="relative-uri-of-this-schema",
        ),
        pytest.param(
            {"$schema": DRAFT_2020, "$ref": "#text", "$defs": {"a": {"$anchor": "text", **STRING}}},
            id="anchor",
        ),
        pytest.param(
            {"$ref": "#/definitions/a~1b", "definitions": {"a/b": STRING}}, id="escaped-pointer"
        ),
    ],
)
def test_parse_resolves_local_references(schema: dict[str, Any]) -> None:
    parsed = parse(schema)
    assert validate_payload(parsed, b'"text"') is None
    assert validate_payload(parsed, b"1") == "$: 1 is not of type 'string'"


def test_fingerprint_ignores_key_order_and_whitespace() -> None:
    compact = parse_json_schema(b'{"type":"object","properties":{"a":{"type":"string"}}}')
    spread = parse_json_schema(
        b'{\n  "properties" : { "a" : { "type" : "string" } },\n  "type" : "object"\n}\n'
    )
    assert compact.fingerprint == spread.fingerprint
    canonical = '{"properties":{"a":{"type":"string"}},"type":"object"}'
    assert compact.canonical == spread.canonical == canonical
    assert compact == spread
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", compact.fingerprint)
    assert parse(obj({"a": INTEGER})).fingerprint != compact.fingerprint


# --- payload validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param(b'{"address": {"zip": 12345}}', None, id="valid"),
        pytest.param(
            b'{"address": {"zip": "abc"}}',
            "$.address.zip: 'abc' is not of type 'integer'",
            id="nested-field",
        ),
        pytest.param(
            b'{"address": {}}', "$.address: 'zip' is a required property", id="missing-field"
        ),
        pytest.param(
            b'{"address": [1]}', "$.address: [1] is not of type 'object'", id="wrong-type"
        ),
    ],
)
def test_validate_payload_names_the_failing_field(payload: bytes, message: str | None) -> None:
    schema = parse(obj({"address": obj({"zip": INTEGER}, required=["zip"])}))
    assert validate_payload(schema, payload) == message


def test_validate_payload_locates_array_items() -> None:
    schema = parse({"type": "array", "items": INTEGER})
    assert validate_payload(schema, b'[1, "two"]') == "$[1]: 'two' is not of type 'integer'"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        pytest.param(b"hello", "payload is not valid JSON", id="text"),
        pytest.param(b"\xfe\xff", "payload is not valid UTF-8", id="binary"),
        pytest.param(b"", "payload is not valid JSON", id="empty"),
        pytest.param(b"NaN", "payload is not valid JSON", id="nan"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "payload is not valid JSON", id="deep"),
    ],
)
def test_validate_payload_rejects_non_json(payload: bytes, words: str) -> None:
    message = validate_payload(parse({}), payload)
    assert message is not None and message.startswith(words)


def test_validate_payload_never_fetches_references() -> None:
    embedded = {"$id": "https://example.invalid/x", "$ref": "other.json"}
    schema = parse({"$schema": DRAFT_2020, "$defs": {"x": embedded}, "$ref": "#/$defs/x"})
    message = validate_payload(schema, b"1")
    assert message is not None and "cannot be resolved" in message


# --- property tests ----------------------------------------------------------------------------

NAMES = ("a", "b", "c")
WORDS = ("x", "y", "z")
SMALL = st.none() | st.integers(-3, 3)


def _bounded(kind: str, low: int | None, high: int | None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": kind}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return schema


def _string(limit: int | None) -> dict[str, Any]:
    return {"type": "string"} if limit is None else {"type": "string", "maxLength": limit}


LEAVES = st.one_of(
    st.builds(_string, st.none() | st.integers(0, 4)),
    st.builds(_bounded, st.sampled_from(["integer", "number"]), SMALL, SMALL),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3, unique=True).map(
        lambda words: {"enum": words}
    ),
)


@st.composite
def _objects(draw: st.DrawFn, children: st.SearchStrategy[Any]) -> dict[str, Any]:
    properties = draw(st.dictionaries(st.sampled_from(NAMES), children, max_size=3))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = draw(st.lists(st.sampled_from(sorted(properties) or ["a"]), unique=True))
    if properties and required:
        schema["required"] = required
    extra = draw(st.sampled_from([None, True, False]))
    if extra is not None:
        schema["additionalProperties"] = extra
    return schema


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: _objects(children) | children.map(lambda s: {"type": "array", "items": s}),
    max_leaves=6,
)

ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.sampled_from([0.5, -1.5, 2.0, 3.25])
    | st.sampled_from(WORDS)
    | st.text(alphabet="xyz", max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(NAMES), children, max_size=3)
    ),
    max_leaves=5,
)


def _candidates(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Documents shaped by a schema of the grammar, some just outside it, plus noise: the
    test keeps those the writer accepts."""
    kind = schema.get("type")
    if "enum" in schema:
        shaped: st.SearchStrategy[Any] = st.sampled_from([*schema["enum"], *WORDS])
    elif kind == "string":
        shaped = st.text(alphabet="xyz", max_size=schema.get("maxLength", 4) + 1)
    elif kind in ("integer", "number"):
        low, high = schema.get("minimum", -4) - 1, schema.get("maximum", 4) + 1
        shaped = st.integers(min(low, high), max(low, high))
        if kind == "number":
            shaped |= st.floats(min(low, high), max(low, high), allow_nan=False)
    elif kind == "array":
        shaped = st.lists(_candidates(schema["items"]), max_size=3)
    else:
        properties = schema["properties"]
        required = set(schema.get("required", []))
        shaped = st.fixed_dictionaries(
            {name: _candidates(properties[name]) for name in sorted(required)},
            optional={
                **{name: ANY_JSON for name in NAMES if name not in properties},
                **{name: _candidates(s) for name, s in properties.items() if name not in required},
                "d": ANY_JSON,
            },
        )
    return shaped | ANY_JSON


@st.composite
def _mutations(draw: st.DrawFn, schema: dict[str, Any]) -> Any:
    """A reader close to the writer (one or more small edits), so that many pairs are
    compatible and the soundness test has something to check."""
    if draw(st.integers(0, 7)) == 0:
        return draw(SCHEMAS)
    changed = copy.deepcopy(schema)
    kind = changed.get("type")
    if "enum" in changed:
        changed["enum"] = draw(
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=3, unique=True)
        )
    elif kind == "string":
        changed = _string(draw(st.none() | st.integers(0, 5)))
    elif kind in ("integer", "number"):
        changed = _bounded(draw(st.sampled_from(["integer", "number"])), draw(SMALL), draw(SMALL))
    elif kind == "array":
        changed["items"] = draw(_mutations(changed["items"]))
    else:
        properties = changed["properties"]
        for name in sorted(properties):
            if draw(st.booleans()):
                properties[name] = draw(_mutations(properties[name]))
        if draw(st.booleans()):
            properties.pop(draw(st.sampled_from(NAMES)), None)
        if draw(st.booleans()):
            properties[draw(st.sampled_from(NAMES))] = draw(LEAVES)
        required = [name for name in changed.get("required", []) if name in properties]
        if properties and draw(st.booleans()):
            required = draw(st.lists(st.sampled_from(sorted(properties)), unique=True))
        changed.pop("required", None)
        if required:
            changed["required"] = required
        extra = draw(st.sampled_from([None, True, False, changed.get("additionalProperties")]))
        changed.pop("additionalProperties", None)
        if extra is not None:
            changed["additionalProperties"] = extra
    return changed


def _wrapped(schema: Any) -> Any:
    """The same schema with every subschema wrapped in a one-branch `allOf`: equal in
    meaning, but no subschema is textually equal to its counterpart, so the comparison has
    to apply every rule instead of recognising an unchanged subschema."""
    if not isinstance(schema, dict):
        return schema
    inner = dict(schema)
    if "properties" in schema:
        inner["properties"] = {n: _wrapped(s) for n, s in schema["properties"].items()}
    if "items" in schema:
        inner["items"] = _wrapped(schema["items"])
    return {"allOf": [inner]}


PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(SCHEMAS)
def test_every_schema_reads_itself(schema: Any) -> None:
    plain, wrapped = parse(schema), parse(_wrapped(schema))
    assert json_can_read(plain, plain) == []
    assert json_can_read(plain, wrapped) == []
    assert json_can_read(wrapped, plain) == []


@PROPERTY_SETTINGS
@given(st.data())
def test_compatible_reader_accepts_all_writer_data(data: st.DataObject) -> None:
    writer_schema = data.draw(SCHEMAS, label="writer")
    reader_schema = data.draw(_mutations(writer_schema), label="reader")
    reader, writer = parse(reader_schema), parse(writer_schema)
    if json_can_read(reader, writer):
        return
    documents = data.draw(st.lists(_candidates(writer_schema), min_size=20, max_size=20))
    for document in documents:
        if writer.validator.is_valid(document):
            assert reader.validator.is_valid(document), document
