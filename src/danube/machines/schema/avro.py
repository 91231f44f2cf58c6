"""Avro schemas for the registry: parsing, fingerprints and JSON datums; the specification's
schema resolution as a compatibility check is in `avro_compat`, the binary payload check in
`avro_binary`.

The rules are those of the Avro 1.11 specification, walked over a normalised copy of the
schema that this module builds itself, because the bytes are read by consumers in every
language (Java above all), not only by fastavro: fastavro's parser lets through schemas the
specification forbids (duplicate field names, a union default of the wrong branch, invalid
names) and its decoder accepts datums a Java consumer refuses (an int wider than 32 bits, a
boolean byte of 2, a negative enum index). fastavro still parses every schema a second time,
supplies the Parsing Canonical Form and writes the binary encoding of JSON input.

The parsed form is `avro_model`'s and the JSON datum checks `avro_conform`'s; their public
names are re-exported here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from danube.machines.schema import budget as budgets
from danube.machines.schema.avro_conform import _Conformer
from danube.machines.schema.avro_conform import decode_json_datum as decode_json_datum
from danube.machines.schema.avro_conform import encode_json_datum as encode_json_datum
from danube.machines.schema.avro_conform import validate_json as validate_json
from danube.machines.schema.avro_model import (
    _FIELD_ORDERS,
    _NAME,
    PRIMITIVES,
    AvroSchema,
    _Array,
    _branch_key,
    _empty_records,
    _endless_records,
    _Enum,
    _error,
    _Field,
    _Fixed,
    _Invalid,
    _json_kind,
    _Map,
    _Named,
    _namespace_of,
    _Node,
    _qualify,
    _Record,
    _Ref,
    _short,
    _Union,
    _valid_full_name,
)
from danube.machines.schema.avro_model import UNLIMITED_STEPS as UNLIMITED_STEPS
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.limits import MAX_ENUM_SYMBOLS


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


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Python's JSON keeps the last of repeated keys; another parser may keep the first, so a
    schema saying two things is refused rather than read one way."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise SchemaParseError(f"the schema repeats the key '{key}' in one object")
        result[key] = value
    return result


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
