"""Avro datums given as JSON (`validate_json`, `encode_json_datum`, `decode_json_datum`): the
checks a Java consumer would make of the datum, before fastavro writes its binary encoding.
Re-exported by `danube.machines.schema.avro`."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping

import fastavro

from danube.machines.schema import budget as budgets
from danube.machines.schema.avro_model import (
    _FLOAT_MAX,
    _INT_BITS,
    UNLIMITED_STEPS,
    AvroSchema,
    _Array,
    _At,
    _depth,
    _deref,
    _describe,
    _Enum,
    _Fixed,
    _Invalid,
    _Named,
    _Node,
    _Record,
    _Ref,
    _type_name,
    _Union,
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
    from danube.machines.schema.avro_binary import validate_datum  # it builds on this module

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
