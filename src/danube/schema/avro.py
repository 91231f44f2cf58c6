"""Avro schemas for the registry: parsing, fingerprints and JSON datums; the specification's
schema resolution as a compatibility check is in `avro_compat`, the binary payload check in
`avro_binary`.

The rules are those of the Avro 1.11 specification, walked over a normalised copy of the
schema that this module builds itself, because the bytes are read by consumers in every
language (Java above all), not only by fastavro: fastavro's parser lets through schemas the
specification forbids (duplicate field names, a union default of the wrong branch, invalid
names) and its decoder accepts datums a Java consumer refuses (an int wider than 32 bits, a
boolean byte of 2, a negative enum index). fastavro still parses every schema a second time,
supplies the Parsing Canonical Form and writes the binary encoding of JSON input."""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

import fastavro
from fastavro.schema import to_parsing_canonical_form

from danube.schema import budget as budgets
from danube.schema.errors import SchemaParseError
from danube.schema.limits import MAX_ENUM_SYMBOLS

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


def _resolution_extras(named: Mapping[str, _Named]) -> str:
    """What a reader uses beyond the canonical form — defaults and aliases of every named
    type and field — as compact, key-sorted JSON."""
    extras: list[object] = []
    for name in sorted(named):
        node = named[name]
        entry: dict[str, object] = {"name": name, "aliases": sorted(node.aliases)}
        if isinstance(node, _Record):
            entry["fields"] = [
                [f.name, sorted(f.aliases), f.has_default, f.default if f.has_default else None]
                for f in node.fields
            ]
        elif isinstance(node, _Enum):
            entry["default"] = node.default
        extras.append(entry)
    return json.dumps(extras, sort_keys=True, separators=(",", ":"), default=repr)


def _logical_types(document: object) -> str:
    """Every logical-type annotation with its place in the document, as compact JSON."""
    found: list[object] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if "logicalType" in node:
                kept = {k: node[k] for k in ("logicalType", "precision", "scale") if k in node}
                found.append([path, kept])
            for key in sorted(node):
                if key not in ("doc", "default"):
                    walk(node[key], f"{path}/{key}")
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{path}/{index}")

    walk(document, "")
    return json.dumps(found, sort_keys=True, separators=(",", ":"), default=repr)


def parse_avro(definition: bytes) -> AvroSchema:
    """Parse the UTF-8 JSON text of an Avro schema. Named types must be defined before use and
    are resolved in the enclosing namespace, as the specification says; a field default is
    checked against its type (of a union, against the first branch, per Avro 1.11)."""
    try:
        text = definition.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaParseError(
            f"the schema is not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None
    try:
        document = json.loads(text, object_pairs_hook=_refuse_repeated_keys)
        parser = _Parser()
        tree = parser.parse(document)
    except json.JSONDecodeError as exc:
        raise SchemaParseError(
            f"the schema is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except RecursionError:
        raise SchemaParseError("the schema nests too deeply to parse") from None
    try:
        parsed = fastavro.parse_schema(document)
        canonical = to_parsing_canonical_form(document)
    except Exception as exc:  # fastavro raises what it likes, and every one is a bad schema
        raise SchemaParseError(f"fastavro cannot use the schema: {exc}") from None
    identity = "\0".join((canonical, _resolution_extras(parser.named), _logical_types(document)))
    return AvroSchema(
        canonical=canonical,
        fingerprint="sha256:" + hashlib.sha256(identity.encode("utf-8")).hexdigest(),
        parsed=parsed,
        _tree=tree,
        _named=MappingProxyType(parser.named),
        _empty=_empty_records(parser.named),
    )


def validate_json(schema: AvroSchema, value: object) -> str | None:
    """Whether `value` (decoded from JSON) is a datum of `schema`: None if so, else a message
    naming the field. JSON has no bytes, so bytes and fixed values are strings whose code
    points 0–255 are the bytes (the convention of Avro defaults); a union value is untagged
    and belongs to the first branch it fits; a missing field takes its default; a field the
    record does not have is an error (a misspelt name would otherwise be dropped silently)."""
    try:
        _Conformer(schema._named, first_branch_only=False).value(schema._tree, value, None)
    except _Invalid as exc:
        return exc.message()
    except RecursionError:
        return "the value nests too deeply to check"
    return None


def encode_json_datum(schema: AvroSchema, value: object) -> bytes:
    """The binary datum for a JSON value, for producers whose input is JSON; raises ValueError
    with `validate_json`'s message when the value is not a datum of the schema. The branch
    of each union written is the one the value was checked against."""
    try:
        prepared = _Conformer(schema._named, first_branch_only=False).value(
            schema._tree, value, None
        )
    except _Invalid as exc:
        raise ValueError(exc.message()) from None
    except RecursionError:
        raise ValueError("the value nests too deeply to check") from None
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema.parsed, prepared)
    return buffer.getvalue()


def decode_json_datum(schema: AvroSchema, payload: bytes) -> object:
    """A binary datum of `schema` as a value for people to read (`danube-cli consume`);
    raises ValueError with `validate_datum`'s message when `payload` is not one. Bytes and
    fixed values are strings of code points 0–255 and unions are untagged, as
    `encode_json_datum` takes them, so without logical types the output can be given back
    to it. A logical type is shown in its usual text form (a timestamp in ISO 8601, a
    decimal in digits), which `encode_json_datum` does not take; a NaN or infinite double
    stays a float, which `json.dumps` writes as `NaN`/`Infinity`, not strict JSON."""
    from danube.schema.avro_binary import validate_datum  # it builds on this module

    # What a consumer reads was accepted once: no validation limits here.
    with budgets.using(budgets.Budget(UNLIMITED_STEPS, "payload decoding", "none")):
        problem = validate_datum(schema, payload)
    if problem is not None:
        raise ValueError(problem)
    return _jsonable(fastavro.schemaless_reader(io.BytesIO(payload), schema.parsed, None))


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Python's JSON keeps the last of repeated keys; another parser may keep the first, so a
    schema saying two things is refused rather than read one way."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise SchemaParseError(f"the schema repeats the key '{key}' in one object")
        result[key] = value
    return result


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


class _Parser:
    """One walk over a schema's JSON that checks what the specification requires and builds
    the normalised tree: full names everywhere, aliases qualified, later uses of a named type
    as references. Paths in errors are JSON Pointers into the document."""

    def __init__(self) -> None:
        self.named: dict[str, _Named] = {}
        # Names usable from here on: those defined, and records whose fields are being read.
        self._declared: set[str] = set()
        self._defaults: list[tuple[str, _Field]] = []

    def parse(self, document: object) -> _Node:
        tree = self._schema(document, "", "")
        endless = _endless_records(self.named)
        if endless:
            raise _error(
                "",
                f"record '{endless[0]}' can never end: every value of it holds another "
                "value of a record that must go on for ever (give the recursive field a "
                'union with "null", an array or a map)',
            )
        # Defaults are checked once every record is complete: a default may hold a value of
        # the very record whose fields were still being read when it was met.
        defaults = _Conformer(self.named, first_branch_only=True)
        for path, declared in self._defaults:
            try:
                defaults.value(declared.type, declared.default, None)
            except _Invalid as exc:
                raise _error(
                    path,
                    f"the default of field '{declared.name}' does not fit its type: "
                    f"{exc.message()}",
                ) from None
        return tree

    def _schema(self, node: object, path: str, namespace: str) -> _Node:
        if isinstance(node, str):
            return self._reference(node, path, namespace)
        if isinstance(node, list):
            return self._union(node, path, namespace)
        if not isinstance(node, dict):
            raise _error(
                path, f"a schema is a type name, an object or a union array, not {_json_kind(node)}"
            )
        if "type" not in node:
            raise _error(path, "a schema object needs a 'type'")
        kind = node["type"]
        if not isinstance(kind, str):
            raise _error(
                f"{path}/type",
                "an object's 'type' must be the name of a primitive type or of record, enum, "
                f"fixed, array or map, not {_json_kind(kind)}",
            )
        if kind in PRIMITIVES:
            return kind
        if kind == "record":
            return self._record(node, path, namespace)
        if kind == "enum":
            return self._enum(node, path, namespace)
        if kind == "fixed":
            return self._fixed(node, path, namespace)
        if kind == "array":
            return _Array(
                self._schema(self._required(node, "items", path), f"{path}/items", namespace)
            )
        if kind == "map":
            values = self._required(node, "values", path)
            return _Map(self._schema(values, f"{path}/values", namespace))
        raise _error(
            f"{path}/type",
            f"unknown type '{kind}': an object's 'type' is a primitive type or record, enum, "
            "fixed, array or map (a named type is used by its name alone)",
        )

    @staticmethod
    def _required(node: dict[str, Any], key: str, path: str) -> Any:
        if key not in node:
            raise _error(path, f"a schema of type {node['type']} needs '{key}'")
        return node[key]

    def _reference(self, name: str, path: str, namespace: str) -> _Node:
        if name in PRIMITIVES:
            return name
        full_name = _qualify(name, namespace)
        if full_name not in self._declared:
            raise _error(
                path,
                f"unknown type '{name}': not a primitive type, and no named type "
                f"'{full_name}' is defined before this point",
            )
        return _Ref(full_name)

    def _union(self, branches: list[Any], path: str, namespace: str) -> _Union:
        seen: dict[tuple[str, str], int] = {}
        parsed: list[_Node] = []
        for index, branch in enumerate(branches):
            where = f"{path}/{index}"
            if isinstance(branch, list):
                raise _error(where, "a union cannot contain another union")
            node = self._schema(branch, where, namespace)
            key = _branch_key(node)
            if key in seen:
                raise _error(
                    where,
                    f"the union already has a branch of type {key[1]} (at {seen[key]}); a "
                    "union holds one of each unnamed type and each name",
                )
            seen[key] = index
            parsed.append(node)
        return _Union(tuple(parsed))

    def _name(self, node: dict[str, Any], path: str, namespace: str) -> tuple[str, frozenset[str]]:
        """Declare a named type; gives its full name and its aliases, qualified."""
        name = node.get("name")
        if not isinstance(name, str):
            raise _error(path, f"a {node['type']} needs a 'name' string")
        if "namespace" in node and "." not in name:
            own = node["namespace"]
            if not isinstance(own, str) or (own and not _valid_full_name(own)):
                raise _error(f"{path}/namespace", "a namespace is a dot-separated list of names")
            namespace = own
        full_name = _qualify(name, namespace)
        if not _valid_full_name(full_name):
            raise _error(
                f"{path}/name",
                f"'{name}' is not a valid name: each dot-separated part starts with a letter "
                "or _ and holds only letters, digits and _",
            )
        if _short(full_name) in PRIMITIVES:
            raise _error(f"{path}/name", f"a named type cannot be called '{_short(full_name)}'")
        if full_name in self._declared:
            raise _error(f"{path}/name", f"the type '{full_name}' is defined twice")
        aliases = node.get("aliases", [])
        if not isinstance(aliases, list) or not all(
            isinstance(alias, str) and _valid_full_name(alias) for alias in aliases
        ):
            raise _error(f"{path}/aliases", "'aliases' must be an array of names")
        self._declared.add(full_name)
        own_namespace = _namespace_of(full_name)
        return full_name, frozenset(_qualify(alias, own_namespace) for alias in aliases)

    def _record(self, node: dict[str, Any], path: str, namespace: str) -> _Record:
        full_name, aliases = self._name(node, path, namespace)
        declared = node.get("fields")
        if not isinstance(declared, list):
            raise _error(path, f"record '{full_name}' needs a 'fields' array")
        fields: list[_Field] = []
        names: set[str] = set()
        for index, raw in enumerate(declared):
            where = f"{path}/fields/{index}"
            if not isinstance(raw, dict):
                raise _error(where, "a field is an object with a 'name' and a 'type'")
            name = raw.get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                raise _error(
                    where,
                    "a field needs a 'name' that starts with a letter or _ and holds only "
                    "letters, digits and _",
                )
            if name in names:
                raise _error(f"{where}/name", f"record '{full_name}' has two fields '{name}'")
            names.add(name)
            if "type" not in raw:
                raise _error(where, f"field '{name}' has no 'type'")
            field_aliases = raw.get("aliases", [])
            if not isinstance(field_aliases, list) or not all(
                isinstance(alias, str) and _NAME.match(alias) for alias in field_aliases
            ):
                raise _error(f"{where}/aliases", "a field's 'aliases' must be an array of names")
            if "order" in raw and raw["order"] not in _FIELD_ORDERS:
                raise _error(f"{where}/order", "'order' is one of ascending, descending and ignore")
            parsed = _Field(
                name=name,
                type=self._schema(raw["type"], f"{where}/type", _namespace_of(full_name)),
                aliases=tuple(field_aliases),
                has_default="default" in raw,
                default=raw.get("default"),
            )
            if parsed.has_default:
                self._defaults.append((f"{where}/default", parsed))
            fields.append(parsed)
        record = _Record(full_name, aliases, tuple(fields))
        self.named[full_name] = record
        return record

    def _enum(self, node: dict[str, Any], path: str, namespace: str) -> _Enum:
        full_name, aliases = self._name(node, path, namespace)
        symbols = node.get("symbols")
        if not isinstance(symbols, list):
            raise _error(path, f"enum '{full_name}' needs a 'symbols' array")
        if len(symbols) > MAX_ENUM_SYMBOLS:
            raise budgets.LimitExceeded(
                "enum symbols",
                f"enum '{full_name}' at {path or '/'} has {len(symbols)} symbols, an enum may "
                f"have {MAX_ENUM_SYMBOLS}",
            )
        seen: set[str] = set()
        for index, symbol in enumerate(symbols):
            if not isinstance(symbol, str) or not _NAME.match(symbol):
                raise _error(
                    f"{path}/symbols/{index}",
                    "a symbol starts with a letter or _ and holds only letters, digits and _",
                )
            if symbol in seen:
                raise _error(f"{path}/symbols/{index}", f"the symbol '{symbol}' is listed twice")
            seen.add(symbol)
        default = node.get("default")
        if "default" in node and default not in symbols:
            raise _error(
                f"{path}/default", f"the default of enum '{full_name}' must be one of its symbols"
            )
        enum = _Enum(full_name, aliases, tuple(symbols), default)
        self.named[full_name] = enum
        return enum

    def _fixed(self, node: dict[str, Any], path: str, namespace: str) -> _Fixed:
        full_name, aliases = self._name(node, path, namespace)
        size = node.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _error(path, f"fixed '{full_name}' needs a 'size' that is a whole number ≥ 0")
        fixed = _Fixed(full_name, aliases, size)
        self.named[full_name] = fixed
        return fixed


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


class _Conformer:
    """Checks a Python value against a schema and turns it into what fastavro's writer takes:
    bytes for bytes and fixed (given as strings of code points 0–255), floats for float and
    double, defaults filled in, and each union value tagged with the branch it was checked
    against (fastavro's tuple notation), so that branch is the one written. With
    `first_branch_only`, a union value must fit the first branch: the rule for defaults."""

    def __init__(self, named: Mapping[str, _Named], first_branch_only: bool) -> None:
        self._named = named
        self._first_branch_only = first_branch_only
        self._defaults = self if first_branch_only else _Conformer(named, first_branch_only=True)

    def value(self, node: _Node, value: object, at: _At | None) -> object:
        node = _deref(node, self._named)
        if isinstance(node, str):
            return self._primitive(node, value, at)
        if isinstance(node, _Record):
            return self._record(node, value, at)
        if isinstance(node, _Union):
            return self._union(node, value, at)
        if isinstance(node, _Enum):
            if not isinstance(value, str) or value not in node.symbols:
                shown = f"'{value}'" if isinstance(value, str) else _type_name(value)
                raise _Invalid(
                    at,
                    f"expected a symbol of enum '{node.name}' ({', '.join(node.symbols)}), "
                    f"got {shown}",
                )
            return value
        if isinstance(node, _Fixed):
            data = self._bytes(value, at, f"fixed '{node.name}'")
            if len(data) != node.size:
                raise _Invalid(at, f"fixed '{node.name}' holds {node.size} bytes, got {len(data)}")
            return data
        if isinstance(node, _Array):
            if not isinstance(value, list):
                raise _Invalid(at, f"expected an array, got {_type_name(value)}")
            return [self.value(node.items, item, _At(at, i)) for i, item in enumerate(value)]
        if not isinstance(value, dict):
            raise _Invalid(at, f"expected a map, got {_type_name(value)}")
        for key in value:
            if not isinstance(key, str):
                raise _Invalid(at, f"map keys are strings, got {_type_name(key)}")
        return {
            key: self.value(node.values, item, _At(at, key, is_key=True))
            for key, item in value.items()
        }

    def _primitive(self, kind: str, value: object, at: _At | None) -> object:
        expected = f"expected {kind}, got {_type_name(value)}"
        if kind == "null":
            if value is not None:
                raise _Invalid(at, expected)
            return None
        if kind == "boolean":
            if not isinstance(value, bool):
                raise _Invalid(at, expected)
            return value
        if kind in _INT_BITS:
            if not isinstance(value, int) or isinstance(value, bool):
                raise _Invalid(at, expected)
            bound = 1 << (_INT_BITS[kind] - 1)
            if not -bound <= value < bound:
                raise _Invalid(at, f"{value} is out of the range of {kind}")
            return value
        if kind in ("float", "double"):
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise _Invalid(at, expected)
            number = float(value)
            if kind == "float" and math.isfinite(number) and abs(number) > _FLOAT_MAX:
                raise _Invalid(at, f"{value} is out of the range of float")
            return number
        if kind == "bytes":
            return self._bytes(value, at, "bytes")
        if not isinstance(value, str):
            raise _Invalid(at, expected)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Invalid(
                at, "the string holds a lone surrogate, which UTF-8 cannot encode"
            ) from None
        return value

    @staticmethod
    def _bytes(value: object, at: _At | None, kind: str) -> bytes:
        if isinstance(value, bytes):
            return value
        if not isinstance(value, str):
            raise _Invalid(at, f"expected {kind} (a string), got {_type_name(value)}")
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            raise _Invalid(
                at,
                f"{kind} is written as a string of code points U+0000–U+00FF, one per byte; "
                "this one has a character above U+00FF",
            ) from None

    def _record(self, node: _Record, value: object, at: _At | None) -> dict[str, object]:
        if not isinstance(value, dict):
            raise _Invalid(at, f"expected record '{node.name}', got {_type_name(value)}")
        declared = {f.name for f in node.fields}
        for key in value:
            if key not in declared:
                raise _Invalid(_At(at, str(key)), f"record '{node.name}' has no such field")
        prepared: dict[str, object] = {}
        for declared_field in node.fields:
            where = _At(at, declared_field.name)
            if declared_field.name in value:
                prepared[declared_field.name] = self.value(
                    declared_field.type, value[declared_field.name], where
                )
            elif declared_field.has_default:
                prepared[declared_field.name] = self._defaults.value(
                    declared_field.type, declared_field.default, where
                )
            else:
                raise _Invalid(where, "missing, and the field has no default")
        return prepared

    def _union(self, node: _Union, value: object, at: _At | None) -> tuple[str, object]:
        branches = node.branches[:1] if self._first_branch_only else node.branches
        failures: list[_Invalid] = []
        for branch in branches:
            try:
                return (_tag(branch), self.value(branch, value, at))
            except _Invalid as exc:
                failures.append(exc)
        # The failure that got furthest into the value says most about what was meant.
        deepest = max(failures, key=lambda failure: _depth(failure.at), default=None)
        if deepest is not None and _depth(deepest.at) > _depth(at):
            raise deepest
        if self._first_branch_only and node.branches:
            raise _Invalid(
                at,
                f"expected {_describe(node.branches[0], self._named)} (a union's default "
                f"belongs to its first branch), got {_type_name(value)}",
            )
        choices = " or ".join(_describe(branch, self._named) for branch in node.branches)
        raise _Invalid(
            at, f"expected {choices or 'nothing (an empty union)'}, got {_type_name(value)}"
        )


def _tag(branch: _Node) -> str:
    """The name fastavro's tuple notation gives a union branch."""
    if isinstance(branch, str):
        return branch
    if isinstance(branch, _Ref | _Record | _Enum | _Fixed):
        return branch.name
    return "array" if isinstance(branch, _Array) else "map"
