"""JSON Schema: parsing, payload validation and the compatibility rules.

A definition is checked against the meta-schema of the draft its `$schema` names (Draft 7
when it names none, as Danube documents). Only references inside the schema are allowed:
the registry never fetches anything, so what a schema means cannot change behind its
fingerprint, and validation stays free of I/O.

Compatibility (`json_can_read`) asks whether every document valid under the writer is valid
under the reader, by comparing the two schemas keyword by keyword, in the spirit of
Confluent Schema Registry's JSON Schema rules. It is conservative: it may report an
incompatibility the data would never hit, never the reverse. Two devices keep it so. The
writer side is only ever widened: a writer keyword the rules do not model is dropped, which
can only add documents. The reader side is never guessed: a reader keyword the rules cannot
compare is reported as an incompatibility saying so, unless the writer has the same one."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

import referencing
import referencing.exceptions
from jsonschema import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
)
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from danube.machines.schema import budget as budgets
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.json_keywords import budgeted
from danube.machines.schema.limits import VALIDATION_CPU_SECONDS, VALIDATION_STEPS
from danube.machines.schema.patterns import prepare
from danube.values.errors import quoted

_DRAFTS: tuple[type[Validator], ...] = (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
)
_REF_ALONE = (Draft4Validator, Draft6Validator, Draft7Validator)
_META_SCHEMA_URIS = frozenset(
    str(draft.META_SCHEMA.get("$id", draft.META_SCHEMA.get("id"))).removesuffix("#")
    for draft in _DRAFTS
)

_SCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "definitions",
    "$defs",
    "dependentSchemas",
    "dependencies",
)
_SCHEMA_VALUES = (
    "additionalProperties",
    "additionalItems",
    "items",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_JSON_PATH_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class JsonSchema:
    """A parsed JSON Schema. Equality is by canonical text, so uploads that differ only in
    key order or whitespace are one schema; the validator is built once because payload
    validation runs for every message."""

    schema: Any = field(compare=False)
    canonical: str
    fingerprint: str
    validator: Validator = field(compare=False, repr=False)
    """The draft's validator with every keyword counted (`json_keywords.budgeted`)."""
    draft: type[Validator] = field(compare=False, repr=False, default=Draft7Validator)
    """The draft the schema is written in, which decides what its keywords mean."""


def parse_json_schema(definition: bytes) -> JsonSchema:
    """Reject a definition the registry could not validate payloads with, so a bad schema
    fails at registration with a path to the keyword instead of at the first message."""
    try:
        schema = _decode(definition)
    except ValueError as exc:
        raise SchemaParseError(f"JSON Schema is {exc}") from None
    draft = _draft_of(schema)
    try:
        draft.check_schema(schema)
    except SchemaError as exc:
        raise SchemaParseError(f"invalid JSON Schema at {exc.json_path}: {exc.message}") from None
    except RecursionError:
        raise SchemaParseError("JSON Schema is nested too deeply") from None
    _check_references(schema, draft)
    _prepare_patterns(schema, draft)
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return JsonSchema(
        schema=schema,
        canonical=canonical,
        fingerprint="sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        validator=budgeted(draft)(schema, registry=referencing.Registry()),
        draft=draft,
    )


def validate_payload(schema: JsonSchema, payload: bytes) -> str | None:
    """One message for a rejected payload (the most relevant error, as `best_match` picks
    it), located by JSON path so the producer sees which field to fix. Runs under the
    budget in force (a fresh VALIDATION_STEPS one without); `LimitExceeded` when the
    payload or its checking is over a limit."""
    budget = budgets.current() or budgets.runtime().budget(
        VALIDATION_STEPS, "payload validation", "validation steps", VALIDATION_CPU_SECONDS
    )
    with budgets.using(budget):
        budget.spend(1 + len(payload) // 256)
        try:
            instance = _decode(payload)
        except ValueError as exc:
            return f"payload is {exc}"
        try:
            error = best_match(schema.validator.iter_errors(instance))
        except referencing.exceptions.Unresolvable as exc:
            return f"the schema has a reference that cannot be resolved: {exc}"
        except RecursionError:
            return "payload is nested too deeply to validate"
    return None if error is None else f"{error.json_path}: {error.message}"


def _decode(data: bytes) -> Any:
    """Strict JSON: besides what `json` rejects, NaN, Infinity and numbers out of the
    double range are refused, since strict parsers on other clients would not read them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8: byte {exc.start}: {exc.reason}") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not valid JSON: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"not valid JSON: the number {text} is out of range")
    return value


def _draft_of(schema: Any) -> type[Validator]:
    """`validator_for` with Draft 7 as the default, as Danube documents, except that a
    `$schema` naming no supported draft is an error: `validator_for` would quietly treat it
    as Draft 7, and the author meant something else."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return Draft7Validator
    uri = schema["$schema"]
    if not isinstance(uri, str) or uri.removesuffix("#") not in _META_SCHEMA_URIS:
        raise SchemaParseError(
            f"invalid JSON Schema at $['$schema']: {quoted(uri)} names no supported draft "
            "(Draft 4, 6, 7, 2019-09 or 2020-12)"
        )
    return validator_for(schema, default=Draft7Validator)


def _id_key(draft: type[Validator]) -> str:
    return "id" if draft is Draft4Validator else "$id"


def _check_references(schema: Any, draft: type[Validator]) -> None:
    """Every reference must resolve within the schema, and no chain of references and
    applicators may lead back to where it started without descending into the data: the
    validator would recurse forever on such a schema."""
    id_key = _id_key(draft)
    base = _base_uri(schema, draft)
    anchors = _anchors(schema, id_key)
    for location, node in _walk(schema, id_key):
        if "$ref" not in node:
            continue
        where = _json_path((*location, "$ref"))
        if not isinstance(node["$ref"], str):
            raise SchemaParseError(f"invalid JSON Schema at {where}: a reference must be a string")
        try:
            _resolve(schema, base, anchors, node["$ref"])
        except LookupError as exc:
            raise SchemaParseError(f"invalid JSON Schema at {where}: {exc}") from None
    located = {id(node): location for location, node in _walk(schema, id_key)}
    finished: set[int] = set()
    for location, start in _walk(schema, id_key):
        if id(start) in finished:
            continue
        open_nodes = {id(start)}
        pending = [(start, _same_document_steps(schema, base, anchors, start, location))]
        while pending:
            node, steps = pending[-1]
            step = next(steps, None)
            if step is None:
                open_nodes.discard(id(node))
                finished.add(id(node))
                pending.pop()
                continue
            where, child = step
            if id(child) in open_nodes:
                raise SchemaParseError(
                    f"invalid JSON Schema at {_json_path(where)}: this leads back to a schema "
                    "that is still being applied to the same data, so validation never ends"
                )
            if id(child) not in finished:
                open_nodes.add(id(child))
                here = located.get(id(child), where)
                pending.append((child, _same_document_steps(schema, base, anchors, child, here)))


def _prepare_patterns(schema: Any, draft: type[Validator]) -> None:
    """Every `pattern` and `patternProperties` name checked for size and compiled now, in
    the registration's worker, rather than by the first payload (`patterns.prepare`)."""
    for _, node in _walk(schema, _id_key(draft)):
        if isinstance(node.get("pattern"), str):
            prepare(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            for pattern in node["patternProperties"]:
                prepare(pattern)


def _same_document_steps(
    root: Any,
    base: str,
    anchors: Mapping[str, Any],
    node: dict[str, Any],
    location: tuple[str | int, ...],
) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """The subschemas applied to the same document as `node` (not to a part of it)."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        try:
            target = _resolve(root, base, anchors, ref)
        except LookupError:
            target = None
        if isinstance(target, dict):
            yield (*location, "$ref"), target
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = node.get(keyword)
        if isinstance(branches, list):
            for index, branch in enumerate(branches):
                if isinstance(branch, dict):
                    yield (*location, keyword, index), branch
    for keyword in ("not", "if", "then", "else"):
        if isinstance(node.get(keyword), dict):
            yield (*location, keyword), node[keyword]
    for keyword in ("dependencies", "dependentSchemas"):
        dependencies = node.get(keyword)
        if isinstance(dependencies, dict):
            for name, dependency in dependencies.items():
                if isinstance(dependency, dict):
                    yield (*location, keyword, name), dependency


def _base_uri(schema: Any, draft: type[Validator]) -> str:
    """The URI the root's `$id` gives references; none when Draft 4 to 7 hide that `$id`
    behind a sibling `$ref` (there a `$ref` overrides everything beside it)."""
    if not isinstance(schema, dict) or (draft in _REF_ALONE and "$ref" in schema):
        return ""
    found = schema.get(_id_key(draft))
    return urldefrag(found).url if isinstance(found, str) else ""


def _is_resource(node: dict[str, Any], id_key: str) -> bool:
    found = node.get(id_key)
    return isinstance(found, str) and not found.startswith("#")


def _walk(node: Any, id_key: str) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every subschema from `node` down, in document order, with its location. Embedded
    resources (a nested non-fragment `$id`) resolve references against their own base, so
    they are left to the validator and not entered."""
    pending: list[tuple[tuple[str | int, ...], Any]] = [((), node)]
    while pending:
        location, current = pending.pop()
        if not isinstance(current, dict) or (location and _is_resource(current, id_key)):
            continue
        yield location, current
        children = [((*location, *steps), child) for steps, child in _children(current)]
        pending.extend(reversed(children))


def _children(node: dict[str, Any]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    for keyword in _SCHEMA_MAPS:
        value = node.get(keyword)
        if isinstance(value, dict):
            for name, child in value.items():
                if isinstance(child, dict | bool):
                    yield (keyword, name), child
    for keyword in _SCHEMA_VALUES:
        child = node.get(keyword)
        if isinstance(child, dict | bool):
            yield (keyword,), child
    for keyword in _SCHEMA_LISTS:
        value = node.get(keyword)
        if isinstance(value, list):
            for index, child in enumerate(value):
                if isinstance(child, dict | bool):
                    yield (keyword, index), child


def _anchors(schema: Any, id_key: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for _, node in _walk(schema, id_key):
        for keyword in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(keyword), str):
                found.setdefault(node[keyword], node)
        legacy = node.get(id_key)
        if isinstance(legacy, str) and legacy.startswith("#"):
            found.setdefault(legacy[1:], node)
    return found


def _resolve(root: Any, base: str, anchors: Mapping[str, Any], ref: str) -> Any:
    """The subschema a local reference names; LookupError (with the reason) otherwise."""
    if ref.startswith("#"):
        fragment = ref[1:]
    else:
        document, fragment = urldefrag(urljoin(base, ref))
        if not base or document != base:
            raise LookupError(
                f"reference {quoted(ref)} points outside this schema; only references within it "
                "('#/definitions/...', '#/$defs/...') are supported"
            )
    fragment = unquote(fragment)
    if fragment and not fragment.startswith("/"):
        if fragment not in anchors:
            raise LookupError(f"reference {quoted(ref)} names no anchor of this schema")
        return anchors[fragment]
    target = root
    for token in fragment.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        else:
            raise LookupError(f"reference {quoted(ref)} points to nothing in this schema")
    if not isinstance(target, dict | bool):
        raise LookupError(f"reference {quoted(ref)} points to a value that is not a schema")
    return target


def _json_path(location: Sequence[str | int]) -> str:
    """The same notation as jsonschema's `json_path`, so parse errors read like its own."""
    text = "$"
    for step in location:
        if isinstance(step, int):
            text += f"[{step}]"
        elif _JSON_PATH_NAME.match(step):
            text += f".{step}"
        else:
            text += "['" + step.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return text
