"""The two schemas of a JSON Schema comparison as `danube.machines.schema.json_compat` sees them:
which keywords it models, a side's draft and references (`_Side`), and the small judgments it
builds on (types, finite value lists, numeric bounds, disjunction products)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import referencing.exceptions
from jsonschema import Draft4Validator
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator

from danube.machines.schema.json_schema import (
    _REF_ALONE,
    _SCHEMA_LISTS,
    _SCHEMA_MAPS,
    _SCHEMA_VALUES,
    JsonSchema,
    _anchors,
    _base_uri,
    _id_key,
    _is_resource,
    _resolve,
)
from danube.machines.schema.patterns import search

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "$comment",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
    }
)

_TYPE_PARTS: dict[str, frozenset[str]] = {
    "null": frozenset({"null"}),
    "boolean": frozenset({"boolean"}),
    "object": frozenset({"object"}),
    "array": frozenset({"array"}),
    "string": frozenset({"string"}),
    "integer": frozenset({"integer"}),
    "number": frozenset({"integer", "fraction"}),
}
_ALL_TYPES = frozenset().union(*_TYPE_PARTS.values())
_NUMERIC = _TYPE_PARTS["number"]
_FINITE_TYPES = frozenset({"null", "boolean"})
_NAMED_TYPES = ("null", "boolean", "object", "array", "string")

_EXPANDED = frozenset({"$ref", "allOf", "anyOf", "oneOf"})
_HANDLED = frozenset(
    {
        "$ref",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "type",
        "enum",
        "const",
        "properties",
        "patternProperties",
        "additionalProperties",
        "required",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    }
)
_OPAQUE = frozenset({"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})
_KEYWORD_GROUPS: dict[str, tuple[str, ...]] = {
    "contains": ("contains", "minContains", "maxContains"),
    "if": ("if", "then", "else"),
}
_ARRAY_KEYWORDS = frozenset({"contains", "unevaluatedItems"})
_OBJECT_KEYWORDS = frozenset({"unevaluatedProperties"})
_STRING_SCHEMA: dict[str, Any] = {"type": "string"}

_MAX_DISJUNCTS = 64
_MAX_UNION = 1024
"""Branches an `anyOf`/`oneOf` may expand to (its own and those of the schemas it refers
to); past it the union reads as "anything" (widening), so schemas whose references double
at every level cost a bounded expansion instead of 2**depth."""
_DISJOINT_DEPTH = 4


def _essence(node: Any) -> Any:
    """A schema without its annotations, which no validation depends on: two schemas that
    differ only in descriptions compare as equal."""
    if not isinstance(node, dict):
        return node
    result = {key: value for key, value in node.items() if key not in _ANNOTATIONS}
    for keyword in _SCHEMA_MAPS:
        if isinstance(result.get(keyword), dict):
            result[keyword] = {name: _essence(child) for name, child in result[keyword].items()}
    for keyword in _SCHEMA_VALUES:
        if isinstance(result.get(keyword), dict):
            result[keyword] = _essence(result[keyword])
    for keyword in _SCHEMA_LISTS:
        if isinstance(result.get(keyword), list):
            result[keyword] = [_essence(child) for child in result[keyword]]
    return result


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class _Side:
    """One schema as the comparison sees it: the keywords its draft enforces (one the draft
    does not know constrains nothing) and how its local references resolve."""

    root: Any
    validator: Validator
    keywords: frozenset[str]
    draft4: bool
    ref_alone: bool
    base: str
    id_key: str
    anchors: Mapping[str, Any]

    @classmethod
    def of(cls, schema: JsonSchema) -> _Side:
        draft = schema.draft
        id_key = _id_key(draft)
        return cls(
            root=schema.schema,
            validator=schema.validator,
            keywords=frozenset(draft.VALIDATORS) - {"format"},
            draft4=draft is Draft4Validator,
            ref_alone=draft in _REF_ALONE,
            base=_base_uri(schema.schema, draft),
            id_key=id_key,
            anchors=_anchors(schema.schema, id_key),
        )

    def has(self, node: Any, keyword: str) -> bool:
        return isinstance(node, dict) and keyword in node and keyword in self.keywords

    def values(self, nodes: Sequence[Any], keyword: str) -> list[Any]:
        return [node[keyword] for node in nodes if self.has(node, keyword)]

    def mapping(self, node: Any, keyword: str) -> dict[str, Any]:
        found = node.get(keyword) if self.has(node, keyword) else None
        return found if isinstance(found, dict) else {}

    def names(self, node: Any, keyword: str) -> list[str]:
        found = node.get(keyword) if self.has(node, keyword) else None
        return [name for name in found if isinstance(name, str)] if isinstance(found, list) else []

    def target(self, ref: str) -> Any | None:
        try:
            return _resolve(self.root, self.base, self.anchors, ref)
        except LookupError:
            return None

    def embedded(self, node: Any) -> bool:
        return isinstance(node, dict) and node is not self.root and _is_resource(node, self.id_key)

    def may_accept(self, node: Any, value: Any) -> bool:
        """Writer-side test, so an unresolvable reference counts as accepting (widening)."""
        try:
            return bool(self.validator.evolve(schema=node).is_valid(value))
        except referencing.exceptions.Unresolvable:
            return True

    def rejection(self, node: Any, value: Any) -> str | None:
        """Reader-side test, so an unresolvable reference counts as rejecting."""
        try:
            error = best_match(self.validator.evolve(schema=node).iter_errors(value))
        except referencing.exceptions.Unresolvable as exc:
            return f"a reference cannot be resolved ({exc})"
        if error is None:
            return None
        return f"{error.json_path}: {error.message}" if error.absolute_path else error.message


class _Bound(NamedTuple):
    value: Fraction
    exclusive: bool
    keyword: str
    written: Any


def _types(side: _Side, nodes: Sequence[Any]) -> frozenset[str]:
    """The JSON types a conjunction allows, with numbers split into integers and the rest
    ("fraction") so that integer-versus-number is plain set inclusion."""
    allowed = _ALL_TYPES
    for node in nodes:
        if side.has(node, "type"):
            named = node["type"] if isinstance(node["type"], list) else [node["type"]]
            allowed &= frozenset().union(*(_TYPE_PARTS.get(name, frozenset()) for name in named))
    return allowed


def _finite(side: _Side, nodes: Sequence[Any]) -> list[Any] | None:
    """All the values a conjunction admits, when there are few enough to list (an enum, a
    const, or only null and booleans): such a writer is compared exactly by validating each
    value against the reader."""
    candidates: list[Any] | None = None
    for node in nodes:
        if side.has(node, "const"):
            candidates = [node["const"]]
            break
        if side.has(node, "enum"):
            candidates = list(node["enum"])
            break
    if candidates is None:
        if not _types(side, nodes) <= _FINITE_TYPES:
            return None
        candidates = [None, False, True]
    return [value for value in candidates if all(side.may_accept(n, value) for n in nodes)]


def _governing(side: _Side, nodes: Sequence[Any], name: str) -> list[Any]:
    """The schemas a property called `name` must satisfy in a conjunction: its declaration
    and matching patterns, or else `additionalProperties`."""
    found: list[Any] = []
    for node in nodes:
        declared = side.mapping(node, "properties")
        matched = [
            schema
            for pattern, schema in side.mapping(node, "patternProperties").items()
            if search(pattern, name)
        ]
        if name in declared:
            found.append(declared[name])
        found.extend(matched)
        if name not in declared and not matched and side.has(node, "additionalProperties"):
            found.append(node["additionalProperties"])
    return found


def _closed_names(side: _Side, nodes: Sequence[Any]) -> set[str] | None:
    """The only property names a conjunction allows, when some member closes its content
    model without patterns; None when the model is open."""
    closed: set[str] | None = None
    for node in nodes:
        if (
            side.has(node, "additionalProperties")
            and node["additionalProperties"] is False
            and not side.mapping(node, "patternProperties")
        ):
            names = set(side.mapping(node, "properties"))
            closed = names if closed is None else closed & names
    return closed


def _array_shape(side: _Side, node: Any) -> tuple[list[Any], Any, str, str]:
    """(schemas of the leading items, schema of the others, and the keywords naming them),
    which the drafts spell differently: `items`/`additionalItems` up to 2019-09,
    `prefixItems`/`items` in 2020-12."""
    if "prefixItems" in side.keywords:
        return node.get("prefixItems", []), node.get("items", True), "prefixItems", "items"
    items = node.get("items", True)
    if isinstance(items, list):
        return items, node.get("additionalItems", True), "items", "additionalItems"
    return [], items, "items", "items"


def _lower_bounds(side: _Side, node: Any) -> list[_Bound]:
    bounds = []
    if side.has(node, "minimum"):
        exclusive = side.draft4 and node.get("exclusiveMinimum") is True
        bounds.append(_Bound(Fraction(node["minimum"]), exclusive, "minimum", node["minimum"]))
    if not side.draft4 and side.has(node, "exclusiveMinimum"):
        written = node["exclusiveMinimum"]
        bounds.append(_Bound(Fraction(written), True, "exclusiveMinimum", written))
    return bounds


def _upper_bounds(side: _Side, node: Any) -> list[_Bound]:
    bounds = []
    if side.has(node, "maximum"):
        exclusive = side.draft4 and node.get("exclusiveMaximum") is True
        bounds.append(_Bound(Fraction(node["maximum"]), exclusive, "maximum", node["maximum"]))
    if not side.draft4 and side.has(node, "exclusiveMaximum"):
        written = node["exclusiveMaximum"]
        bounds.append(_Bound(Fraction(written), True, "exclusiveMaximum", written))
    return bounds


def _as_integer_bound(bound: _Bound, lower: bool) -> _Bound:
    """The same bound as an inclusive integer, for a writer that allows only integers:
    `> 0` then satisfies a reader's `>= 1`."""
    if lower:
        value = math.floor(bound.value) + 1 if bound.exclusive else math.ceil(bound.value)
    else:
        value = math.ceil(bound.value) - 1 if bound.exclusive else math.floor(bound.value)
    return _Bound(Fraction(value), False, bound.keyword, value)


def _covers(writer: _Bound, reader: _Bound, lower: bool) -> bool:
    """Whether every number within the writer's bound is within the reader's."""
    if writer.value != reader.value:
        return writer.value > reader.value if lower else writer.value < reader.value
    return writer.exclusive or not reader.exclusive


def _bound_text(bound: _Bound, lower: bool) -> str:
    sign = (">" if lower else "<") + ("" if bound.exclusive else "=")
    return f"{sign} {_show(bound.written)}"


def _describe(parts: frozenset[str]) -> str:
    names = [name for name in _NAMED_TYPES if name in parts]
    if parts >= _NUMERIC:
        names.append("number")
    elif "integer" in parts:
        names.append("integer")
    elif "fraction" in parts:
        names.append("non-integer number")
    return ", ".join(names) if names else "nothing"


def _product(parts: Sequence[list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """Conjunction of disjunctions, as disjunctions of conjunctions. A part that would grow
    the result past the limit is left out, which only widens it."""
    result: list[tuple[Any, ...]] = [()]
    for part in parts:
        if len(result) * len(part) > _MAX_DISJUNCTS:
            continue
        result = [left + right for left in result for right in part]
    return result
