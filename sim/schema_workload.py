"""What the schema run's producers write: Avro record schemas that evolve one step at a
time, some steps compatible under a mode and some not, and datums of each schema.

The steps are the textbook cases of Avro schema resolution, so every mode meets both
outcomes: adding or removing a field with or without a default, promoting and demoting a
number, making a field optional, changing a field's type outright."""

from __future__ import annotations

import json
import random
import struct
from typing import Any

NUMBERS = ("int", "long", "float", "double")
KINDS = (*NUMBERS, "string")
STEPS = (
    "add_with_default",
    "add_without_default",
    "remove_with_default",
    "remove_without_default",
    "promote",
    "demote",
    "make_optional",
    "retype",
)
_PROMOTE = {"int": "long", "long": "double", "float": "double"}
_DEMOTE = {"long": "int", "double": "float"}
_DEFAULTS: dict[str, Any] = {"int": 0, "long": 0, "float": 0.0, "double": 0.0, "string": ""}
MAX_FIELDS = 8


def initial(rng: random.Random) -> dict[str, Any]:
    fields = [{"name": "id", "type": "long"}]
    for index in range(rng.randint(1, 3)):
        fields.append(_field(rng, f"f{index}", with_default=rng.random() < 0.5))
    return {"type": "record", "name": "Order", "namespace": "sim", "fields": fields}


def evolve(rng: random.Random, schema: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One step from `schema` (never touching `id`, so a record keeps a field); the name of
    the step, for the trace."""
    fields = [dict(f) for f in schema["fields"]]
    others = [f for f in fields if f["name"] != "id"]
    step = rng.choice(STEPS)
    if step.startswith("add") or not others:
        if len(fields) >= MAX_FIELDS:
            step = "remove_with_default"
        else:
            step = step if step.startswith("add") else "add_with_default"
            used = {f["name"] for f in fields}
            name = next(f"f{i}" for i in range(MAX_FIELDS * 4) if f"f{i}" not in used)
            fields.append(_field(rng, name, with_default=step == "add_with_default"))
            return step, {**schema, "fields": fields}
    target = rng.choice(others)
    kind = target["type"]
    if step.startswith("remove"):
        fields.remove(target)
    elif step == "promote" and isinstance(kind, str) and kind in _PROMOTE:
        _retype(target, _PROMOTE[kind])
    elif step == "demote" and isinstance(kind, str) and kind in _DEMOTE:
        _retype(target, _DEMOTE[kind])
    elif step == "make_optional" and isinstance(kind, str):
        target["type"] = ["null", kind]
        target["default"] = None
    else:
        step = "retype"
        current = kind if isinstance(kind, str) else kind[1]
        _retype(target, rng.choice([k for k in KINDS if k != current]))
    return step, {**schema, "fields": fields}


def encoded(schema: dict[str, Any]) -> bytes:
    return json.dumps(schema, sort_keys=True).encode()


def datum(rng: random.Random, schema: dict[str, Any]) -> dict[str, Any]:
    return {f["name"]: _value(rng, f["type"]) for f in schema["fields"]}


def _field(rng: random.Random, name: str, *, with_default: bool) -> dict[str, Any]:
    kind = rng.choice(KINDS)
    if rng.random() < 0.25:
        return {"name": name, "type": ["null", kind], "default": None}
    field: dict[str, Any] = {"name": name, "type": kind}
    if with_default:
        field["default"] = _DEFAULTS[kind]
    return field


def _retype(field: dict[str, Any], kind: str) -> None:
    """A new type keeps a default if the field had one (of the new type, so it is valid)."""
    had_default = "default" in field
    field["type"] = kind
    field.pop("default", None)
    if had_default:
        field["default"] = _DEFAULTS[kind]


def _value(rng: random.Random, kind: Any) -> Any:
    if isinstance(kind, list):
        return None if rng.random() < 0.3 else _value(rng, kind[1])
    if kind == "int":
        return rng.randint(-(2**31), 2**31 - 1)
    if kind == "long":
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == "float":
        return struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]
    if kind == "double":
        return rng.uniform(-1e12, 1e12)
    return "".join(rng.choice("abcdefgh") for _ in range(rng.randint(0, 12)))
