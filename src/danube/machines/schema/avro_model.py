"""The parsed form of an Avro schema (`danube.machines.schema.avro` builds it): its nodes, names,
the structural facts the checks share (empty and endless records, dereferencing, descriptions) and
the path of a datum being checked. Shared by the parser, the JSON datum conformer, the binary
payload check (`avro_binary`) and schema resolution (`avro_compat`)."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from danube.machines.schema.errors import SchemaParseError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})

# (writer, reader) pairs the specification lets a reader promote.
_PROMOTIONS = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FIELD_ORDERS = frozenset({"ascending", "descending", "ignore"})
_INT_BITS = {"int": 32, "long": 64}
UNLIMITED_STEPS = 1 << 62
_FLOAT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


@dataclass(frozen=True, slots=True, eq=False)
class _Ref:
    """A use of a named type by its full name; the definition lives in the schema's table, so
    recursive types stay finite trees."""

    name: str


@dataclass(frozen=True, slots=True, eq=False)
class _Field:
    name: str
    type: _Node
    aliases: tuple[str, ...]
    has_default: bool
    default: object


@dataclass(frozen=True, slots=True, eq=False)
class _Record:
    name: str
    aliases: frozenset[str]
    fields: tuple[_Field, ...]


@dataclass(frozen=True, slots=True, eq=False)
class _Enum:
    name: str
    aliases: frozenset[str]
    symbols: tuple[str, ...]
    default: str | None


@dataclass(frozen=True, slots=True, eq=False)
class _Fixed:
    name: str
    aliases: frozenset[str]
    size: int


@dataclass(frozen=True, slots=True, eq=False)
class _Array:
    items: _Node


@dataclass(frozen=True, slots=True, eq=False)
class _Map:
    values: _Node


@dataclass(frozen=True, slots=True, eq=False)
class _Union:
    branches: tuple[_Node, ...]


_Named: TypeAlias = _Record | _Enum | _Fixed
# A primitive is its name; logical types are dropped, as schema resolution ignores them.
_Node: TypeAlias = str | _Ref | _Record | _Enum | _Fixed | _Array | _Map | _Union


@dataclass(frozen=True, slots=True)
class AvroSchema:
    """A parsed Avro schema. Two schemas are equal when their Parsing Canonical Forms are:
    the canonical form keeps exactly what decides the bytes written (types, full names, field
    order, symbols, sizes) and drops docs, aliases, defaults and logical types. The
    fingerprint adds back the defaults and aliases (they change what a reader fills in and
    which names it matches) and the logical types (a decimal's scale changes what the bytes
    mean), so a schema that changes only them is a new version, as in Confluent's registry;
    reformatting, reordering JSON attributes or editing docs keeps it.
    `parsed` is fastavro's parsed form, for fastavro's reader and writer."""

    canonical: str
    fingerprint: str
    parsed: str | list[Any] | dict[str, Any] = field(compare=False, repr=False)
    _tree: _Node = field(compare=False, repr=False)
    _named: Mapping[str, _Named] = field(compare=False, repr=False)
    # Records every value of which is encoded in zero bytes, which a decoder must not loop on.
    _empty: frozenset[str] = field(compare=False, repr=False)


def _error(path: str, problem: str) -> SchemaParseError:
    return SchemaParseError(f"{path}: {problem}" if path else problem)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


def _qualify(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _namespace_of(full_name: str) -> str:
    return full_name.rpartition(".")[0]


def _short(full_name: str) -> str:
    return full_name.rpartition(".")[2]


def _valid_full_name(name: str) -> bool:
    return all(_NAME.match(part) for part in name.split("."))


def _branch_key(node: _Node) -> tuple[str, str]:
    """What a union may hold only once: each unnamed type, and each name."""
    if isinstance(node, str):
        return ("type", node)
    if isinstance(node, _Ref | _Record | _Enum | _Fixed):
        return ("name", node.name)
    return ("type", "array" if isinstance(node, _Array) else "map")


def _empty_records(named: Mapping[str, _Named]) -> frozenset[str]:
    """The records whose every value is encoded in zero bytes (fields all null, fixed of size
    0 or such records), found as a greatest fixed point, since records may refer to one
    another in cycles."""
    records = {name: node for name, node in named.items() if isinstance(node, _Record)}
    empty = set(records)
    changed = True
    while changed:
        changed = False
        for name, record in records.items():
            if name in empty and not all(_is_empty(f.type, named, empty) for f in record.fields):
                empty.discard(name)
                changed = True
    return frozenset(empty)


def _endless_records(named: Mapping[str, _Named]) -> list[str]:
    """The records no finite value exists of (a field of the record's own type with no way
    out), in definition order: the least fixed point of "has a finite value", since a
    record has one when all its fields do, a union when any branch does, and arrays and
    maps always (the empty one)."""
    records = {name: node for name, node in named.items() if isinstance(node, _Record)}
    finite: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, record in records.items():
            if name not in finite and all(_has_end(f.type, named, finite) for f in record.fields):
                finite.add(name)
                changed = True
    return [name for name in records if name not in finite]


def _has_end(node: _Node, named: Mapping[str, _Named], finite: Set[str]) -> bool:
    node = _deref(node, named)
    if isinstance(node, _Record):
        return node.name in finite
    if isinstance(node, _Union):
        return any(_has_end(branch, named, finite) for branch in node.branches)
    return True


def _is_empty(node: _Node, named: Mapping[str, _Named], empty: Set[str]) -> bool:
    node = _deref(node, named)
    if isinstance(node, _Fixed):
        return node.size == 0
    if isinstance(node, _Record):
        return node.name in empty
    return node == "null"


def _deref(node: _Node, named: Mapping[str, _Named]) -> _Node:
    return named[node.name] if isinstance(node, _Ref) else node


def _describe(node: _Node, named: Mapping[str, _Named]) -> str:
    node = _deref(node, named)
    if isinstance(node, str):
        return node
    if isinstance(node, _Record | _Enum | _Fixed):
        kind = {_Record: "record", _Enum: "enum", _Fixed: "fixed"}[type(node)]
        return f"{kind} '{node.name}'"
    if isinstance(node, _Array):
        return f"array of {_describe(node.items, named)}"
    if isinstance(node, _Map):
        return f"map of {_describe(node.values, named)}"
    return "union [" + ", ".join(_describe(branch, named) for branch in node.branches) + "]"


@dataclass(frozen=True, slots=True)
class _At:
    """A place in a datum, built only as deep as the walk goes and spelt out only for an
    error: a record field (a name), an array item or map entry (an index), or a map value
    (its key)."""

    parent: _At | None
    step: str | int
    is_key: bool = False


def _spell(at: _At | None) -> str:
    steps: list[str] = []
    while at is not None:
        if isinstance(at.step, int):
            steps.append(f"[{at.step}]")
        elif at.is_key:
            steps.append(f"[{json.dumps(at.step)}]")
        else:
            steps.append(f".{at.step}")
        at = at.parent
    return "".join(reversed(steps)).removeprefix(".")


def _depth(at: _At | None) -> int:
    depth = 0
    while at is not None:
        depth, at = depth + 1, at.parent
    return depth


class _Invalid(Exception):
    """A datum that does not fit its schema, and where."""

    def __init__(self, at: _At | None, problem: str) -> None:
        super().__init__(problem)
        self.at = at
        self.problem = problem

    def message(self) -> str:
        return f"field '{_spell(self.at)}': {self.problem}" if self.at else self.problem


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__
