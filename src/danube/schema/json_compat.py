"""JSON Schema compatibility: can a reader schema accept every document a writer schema
allows? (`json_can_read`, the rules described in `danube.schema.json_schema`.)

Every step of a comparison is paid for from a `Budget` (`danube.schema.budget`): schemas
whose references and combinators multiply (an `anyOf` of two references to the level below,
thirty levels deep, describes 2**30 branches) exhaust it and are refused with the limit
named, instead of running for minutes; expansions into disjunctions are capped, widening
(which only adds documents, so the answer stays conservative)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from danube.core.errors import quoted
from danube.schema import budget as budgets
from danube.schema.compatibility import Incompatibility
from danube.schema.json_schema import (
    JsonSchema,
    _walk,
)
from danube.schema.json_sides import (
    _ALL_TYPES,
    _ARRAY_KEYWORDS,
    _DISJOINT_DEPTH,
    _EXPANDED,
    _HANDLED,
    _KEYWORD_GROUPS,
    _MAX_UNION,
    _NUMERIC,
    _OBJECT_KEYWORDS,
    _OPAQUE,
    _STRING_SCHEMA,
    _array_shape,
    _as_integer_bound,
    _bound_text,
    _closed_names,
    _covers,
    _describe,
    _essence,
    _finite,
    _governing,
    _lower_bounds,
    _pointer,
    _product,
    _show,
    _Side,
    _types,
    _upper_bounds,
)
from danube.schema.limits import COMPATIBILITY_STEPS, SCHEMA_CPU_SECONDS


def json_can_read(reader: JsonSchema, writer: JsonSchema) -> list[Incompatibility]:
    """Every reason a consumer holding `reader` might reject a document valid under
    `writer`; empty when it accepts them all. Paths follow the reader's structure (through
    references) as JSON pointers from `#`. Runs under the budget in force (a fresh
    COMPATIBILITY_STEPS one without): `LimitExceeded` when the schemas need more."""
    if reader == writer:
        return []
    budget = budgets.current() or budgets.runtime().budget(
        COMPATIBILITY_STEPS, "compatibility check", "compatibility steps", SCHEMA_CPU_SECONDS
    )
    with budgets.using(budget):
        try:
            return _Comparison(reader, writer, budget).check(
                reader.schema, (writer.schema,), "#", 0
            )
        except RecursionError:
            return [Incompatibility("#", "the schemas are nested too deeply to compare")]


class _Comparison:
    """The working state of one `json_can_read` call: memoised expansions and the pairs
    being compared (recursive schemas come back to them). It lives for one call only."""

    def __init__(self, reader: JsonSchema, writer: JsonSchema, budget: budgets.Budget) -> None:
        self._budget = budget
        self.r = _Side.of(reader)
        self.w = _Side.of(writer)
        self._same_draft = reader.draft is writer.draft
        self._expansions: dict[tuple[int, int], tuple[Any, list[tuple[Any, ...]]]] = {}
        self._texts: dict[int, tuple[Any, str]] = {}
        self._active: dict[tuple[int, tuple[int, ...]], int] = {}

    def check(
        self, reader: Any, writer: tuple[Any, ...], path: str, depth: int
    ) -> list[Incompatibility]:
        """Can `reader` read everything the conjunction `writer` allows? `depth` counts the
        steps into nested data: meeting the same pair again deeper down may assume the
        answer (the data is finite, so the assumption is proved by induction on it); the
        same pair again at the same depth is a loop that describes no data."""
        self._budget.spend()
        if len(writer) == 1 and self._same(reader, writer[0]):
            return []
        key = (id(reader), tuple(id(node) for node in writer))
        entered = self._active.get(key)
        if entered is not None:
            if entered < depth:
                return []
            return [Incompatibility(path, "the schema refers to itself in a loop")]
        self._active[key] = depth
        found: list[Incompatibility] = []
        try:
            for conjunction in self._dnf_all(self.w, writer):
                values = _finite(self.w, conjunction)
                if values is None:
                    found += self._read(reader, conjunction, path, depth)
                else:
                    values = [v for v in values if all(self.w.may_accept(n, v) for n in writer)]
                    found += self._read_values(reader, values, path)
        finally:
            del self._active[key]
        return list(dict.fromkeys(found))

    def _same(self, reader: Any, writer: Any) -> bool:
        """Equal text means equal meaning only under the same draft and when the references
        inside lead to equal text on both sides too."""
        if not self._same_draft:
            return False
        pending = [(reader, writer)]
        seen: set[tuple[int, int]] = set()
        while pending:
            left, right = pending.pop()
            self._budget.spend()
            if (id(left), id(right)) in seen:
                continue
            seen.add((id(left), id(right)))
            if self._text(left) != self._text(right):
                return False
            for _, node in _walk(left, self.r.id_key):
                self._budget.spend()
                if "$dynamicRef" in node or "$recursiveRef" in node:
                    return False
                ref = node.get("$ref")
                if isinstance(ref, str):
                    targets = self.r.target(ref), self.w.target(ref)
                    if targets[0] is None or targets[1] is None:
                        return False
                    pending.append(targets)
        return True

    def _text(self, node: Any) -> str:
        cached = self._texts.get(id(node))
        if cached is None:
            cached = (node, json.dumps(_essence(node), sort_keys=True, separators=(",", ":")))
            self._texts[id(node)] = cached
            self._budget.spend(len(cached[1]) // 256)  # kept: memory paid for as steps
        return cached[1]

    def _dnf(self, side: _Side, node: Any) -> list[tuple[Any, ...]]:
        """Memoised, so that a subschema always expands to the same objects (`check`
        recognises pairs by identity). A node met again while it is being expanded is a
        reference loop, and reads as "anything" there."""
        key = (id(side), id(node))
        cached = self._expansions.get(key)
        if cached is None:
            self._expansions[key] = (node, [()])
            cached = (node, self._expand(side, node))
            self._expansions[key] = cached
        return cached[1]

    def _dnf_all(self, side: _Side, nodes: Sequence[Any]) -> list[tuple[Any, ...]]:
        return _product([self._dnf(side, node) for node in nodes])

    def _expand(self, side: _Side, node: Any) -> list[tuple[Any, ...]]:
        """A schema as a union of conjunctions of plain schemas: references followed,
        `allOf` flattened, `anyOf`/`oneOf` distributed (`oneOf` read as `anyOf`). The result
        may only be wider than the schema (a reference loop or an embedded resource becomes
        "anything"), which is what both of its uses need: the writer, and a reader branch
        whose overlap with the writer is in question."""
        self._budget.spend()
        if node is False:
            return []
        if not isinstance(node, dict) or side.embedded(node):
            return [()]
        parts: list[list[tuple[Any, ...]]] = []
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = side.target(ref)
            expanded = [()] if target is None else self._dnf(side, target)
            if side.ref_alone:
                return expanded
            parts.append(expanded)
        parts.append([({k: v for k, v in node.items() if k not in _EXPANDED},)])
        if side.has(node, "allOf"):
            parts.extend(self._dnf(side, branch) for branch in node["allOf"])
        for keyword in ("anyOf", "oneOf"):
            if side.has(node, keyword):
                union = [d for b in node[keyword] for d in self._dnf(side, b)]
                parts.append(union if len(union) <= _MAX_UNION else [()])
        return _product(parts)

    def _read(
        self, reader: Any, writer: tuple[Any, ...], path: str, depth: int
    ) -> list[Incompatibility]:
        if reader is False:
            return [Incompatibility(path, "the reader accepts nothing here (false)")]
        if not isinstance(reader, dict):
            return []
        w_types = _types(self.w, writer)
        if not w_types:
            return []
        if self.r.embedded(reader):
            return [
                Incompatibility(
                    path, "an embedded schema with its own $id is compared only when unchanged"
                )
            ]
        found: list[Incompatibility] = []
        ref = reader.get("$ref")
        if isinstance(ref, str):
            target = self.r.target(ref)
            if target is None:
                found.append(Incompatibility(path, f"reference {quoted(ref)} cannot be resolved"))
            else:
                found += self.check(target, writer, path, depth)
            if self.r.ref_alone:
                return found
        r_types = _types(self.r, (reader,))
        common = w_types & r_types
        found += self._type_issues(reader, w_types, r_types, path)
        found += self._combinator_issues(reader, writer, path, depth)
        found += self._opaque_issues(reader, writer, common, path)
        if self.r.has(reader, "enum") or self.r.has(reader, "const"):
            allowed = [reader["const"]] if self.r.has(reader, "const") else reader["enum"]
            found.append(
                Incompatibility(
                    path,
                    f"the reader accepts only {_show(allowed)}, but the writer's values are "
                    "not limited to a list",
                )
            )
        if "string" in common:
            found += self._string_issues(reader, writer, path)
        if common & _NUMERIC:
            found += self._number_issues(reader, writer, w_types, path)
        if "array" in common:
            found += self._array_issues(reader, writer, path, depth)
        if "object" in common:
            found += self._object_issues(reader, writer, path, depth)
        return found

    def _read_values(self, reader: Any, values: list[Any], path: str) -> list[Incompatibility]:
        found = []
        for value in values:
            reason = self.r.rejection(reader, value)
            if reason is not None:
                found.append(
                    Incompatibility(
                        path,
                        f"the writer allows {_show(value)}, which the reader rejects: {reason}",
                    )
                )
        return found

    def _type_issues(
        self, reader: Any, w_types: frozenset[str], r_types: frozenset[str], path: str
    ) -> list[Incompatibility]:
        where = f"{path}/type" if self.r.has(reader, "type") else path
        missing = w_types - r_types
        found = []
        if missing and w_types == _ALL_TYPES:
            found.append(
                Incompatibility(
                    where,
                    "the writer does not restrict the type, but the reader accepts only "
                    + _describe(r_types),
                )
            )
        elif missing == {"fraction"} and "integer" in r_types:
            found.append(
                Incompatibility(
                    where, "the writer allows non-integer numbers, but the reader only integers"
                )
            )
        elif missing:
            found.append(
                Incompatibility(
                    where,
                    f"the reader does not accept {_describe(missing)}, which the writer allows",
                )
            )
        if (
            "integer" in w_types & r_types
            and "fraction" not in r_types
            and self.r.draft4
            and not self.w.draft4
        ):
            found.append(
                Incompatibility(
                    where,
                    "the reader (Draft 4) rejects integral numbers written as 1.0, which the "
                    "writer accepts as integers",
                )
            )
        return found

    def _combinator_issues(
        self, reader: dict[str, Any], writer: tuple[Any, ...], path: str, depth: int
    ) -> list[Incompatibility]:
        found: list[Incompatibility] = []
        if self.r.has(reader, "allOf"):
            for index, branch in enumerate(reader["allOf"]):
                found += self.check(branch, writer, f"{path}/allOf/{index}", depth)
        for keyword in ("anyOf", "oneOf"):
            if self.r.has(reader, keyword):
                found += self._union_issues(keyword, reader[keyword], writer, path, depth)
        if self.r.has(reader, "not"):
            negated = reader["not"]
            same = any(
                self._same(negated, node["not"]) for node in writer if self.w.has(node, "not")
            )
            if not same and not self._disjoint(negated, writer, _DISJOINT_DEPTH):
                found.append(
                    Incompatibility(
                        f"{path}/not",
                        "the reader rejects what its 'not' schema matches, and the writer's "
                        "data cannot be shown to avoid it ('not' compares only when equal)",
                    )
                )
        return found

    def _union_issues(
        self,
        keyword: str,
        branches: list[Any],
        writer: tuple[Any, ...],
        path: str,
        depth: int,
    ) -> list[Incompatibility]:
        """`anyOf`: some branch must read the writer's data (each writer branch is a separate
        conjunction by now). `oneOf` also needs every other branch to be provably disjoint
        from that data, or a document could match two branches and be rejected."""
        where = f"{path}/{keyword}"
        outcomes = [
            self.check(branch, writer, f"{where}/{index}", depth)
            for index, branch in enumerate(branches)
        ]
        readable = [index for index, outcome in enumerate(outcomes) if not outcome]
        if not readable:
            reasons = "; ".join(
                f"branch {index}: {outcome[0]}" for index, outcome in enumerate(outcomes)
            )
            return [
                Incompatibility(
                    where,
                    f"no branch of the reader's {keyword} accepts the writer's data ({reasons})",
                )
            ]
        if keyword == "anyOf":
            return []
        chosen = readable[0]
        overlapping = [
            str(index)
            for index, branch in enumerate(branches)
            if index != chosen and not self._disjoint(branch, writer, _DISJOINT_DEPTH)
        ]
        if not overlapping:
            return []
        return [
            Incompatibility(
                where,
                f"writer data that the reader's oneOf branch {chosen} accepts may also match "
                f"branch {', '.join(overlapping)}, and oneOf needs exactly one match",
            )
        ]

    def _disjoint(self, reader: Any, writer: tuple[Any, ...], budget: int) -> bool:
        """Whether no document satisfies both `reader` (widened) and `writer`."""
        return all(
            self._disjoint_conjunctions(conjunction, writer, budget)
            for conjunction in self._dnf(self.r, reader)
        )

    def _disjoint_conjunctions(
        self, reader: tuple[Any, ...], writer: tuple[Any, ...], budget: int
    ) -> bool:
        """Proved by types, by listing the values of a finite side, or by a property both
        require whose schemas are disjoint (the usual "kind" discriminator)."""
        self._budget.spend()
        common = _types(self.r, reader) & _types(self.w, writer)
        if not common:
            return True
        values = _finite(self.w, writer)
        if values is not None:
            return all(any(not self.r.may_accept(n, v) for n in reader) for v in values)
        values = _finite(self.r, reader)
        if values is not None:
            return all(any(not self.w.may_accept(n, v) for n in writer) for v in values)
        if common != {"object"} or budget == 0:
            return False
        r_required = {name for node in reader for name in self.r.names(node, "required")}
        w_required = {name for node in writer for name in self.w.names(node, "required")}
        for name in sorted(r_required & w_required):
            r_options = self._dnf_all(self.r, _governing(self.r, reader, name))
            w_options = self._dnf_all(self.w, _governing(self.w, writer, name))
            if all(
                self._disjoint_conjunctions(r, w, budget - 1) for r in r_options for w in w_options
            ):
                return True
        return False

    def _opaque_issues(
        self, reader: dict[str, Any], writer: tuple[Any, ...], common: frozenset[str], path: str
    ) -> list[Incompatibility]:
        """Reader keywords without a rule of their own: compatible only when the writer has
        the same keyword (and companions) with equal values. The ones whose meaning depends
        on the whole evaluation (`unevaluated*`, dynamic references) need the whole subschema
        unchanged, which `check` has already ruled out when we get here."""
        found = []
        for keyword in sorted(reader.keys() & (self.r.keywords - _HANDLED)):
            if (keyword in _ARRAY_KEYWORDS and "array" not in common) or (
                keyword in _OBJECT_KEYWORDS and "object" not in common
            ):
                continue
            where = f"{path}/{_pointer(keyword)}"
            if keyword in _OPAQUE:
                found.append(
                    Incompatibility(
                        where, f"a reader using {quoted(keyword)} is compared only when unchanged"
                    )
                )
                continue
            group = _KEYWORD_GROUPS.get(keyword, (keyword,))
            if not any(
                all(self._same_keyword(reader, node, name) for name in group)
                for node in writer
                if self.w.has(node, keyword)
            ):
                found.append(
                    Incompatibility(
                        where,
                        f"the reader's {quoted(keyword)} is compared only with an equal "
                        f"{quoted(keyword)} "
                        "in the writer",
                    )
                )
        return found

    def _same_keyword(self, reader: dict[str, Any], writer: dict[str, Any], name: str) -> bool:
        if name not in reader or name not in writer:
            return name not in reader and name not in writer
        return self._same(reader[name], writer[name])

    def _string_issues(
        self, reader: dict[str, Any], writer: tuple[Any, ...], path: str
    ) -> list[Incompatibility]:
        r, w = self.r, self.w
        found = []
        if r.has(reader, "maxLength"):
            limits = w.values(writer, "maxLength")
            if not limits or min(limits) > reader["maxLength"]:
                allowed = f"allows up to {_show(min(limits))}" if limits else "sets no limit"
                found.append(
                    Incompatibility(
                        f"{path}/maxLength",
                        f"the reader allows at most {_show(reader['maxLength'])} characters, "
                        f"but the writer {allowed}",
                    )
                )
        if r.has(reader, "minLength"):
            floor = max([0, *w.values(writer, "minLength")])
            if floor < reader["minLength"]:
                found.append(
                    Incompatibility(
                        f"{path}/minLength",
                        f"the reader requires at least {_show(reader['minLength'])} characters, "
                        f"but the writer allows {_show(floor)}",
                    )
                )
        if r.has(reader, "pattern"):
            patterns = w.values(writer, "pattern")
            if reader["pattern"] not in patterns:
                written = f"uses {_show(patterns[0])}" if patterns else "has no pattern"
                found.append(
                    Incompatibility(
                        f"{path}/pattern",
                        f"the reader requires pattern {_show(reader['pattern'])}, but the writer "
                        f"{written} (patterns are compared only when equal)",
                    )
                )
        return found

    def _number_issues(
        self, reader: dict[str, Any], writer: tuple[Any, ...], w_types: frozenset[str], path: str
    ) -> list[Incompatibility]:
        integral = w_types & _NUMERIC == {"integer"}
        found = []
        for lower in (True, False):
            collect = _lower_bounds if lower else _upper_bounds
            w_bounds = [bound for node in writer for bound in collect(self.w, node)]
            if integral:
                w_bounds = [_as_integer_bound(bound, lower) for bound in w_bounds]
            tightest = None
            if w_bounds:
                tightest = (
                    max(w_bounds, key=lambda b: (b.value, b.exclusive))
                    if lower
                    else min(w_bounds, key=lambda b: (b.value, not b.exclusive))
                )
            for bound in collect(self.r, reader):
                if tightest is not None and _covers(tightest, bound, lower):
                    continue
                written = (
                    f"allows numbers {_bound_text(tightest, lower)}"
                    if tightest is not None
                    else f"sets no {'lower' if lower else 'upper'} bound"
                )
                found.append(
                    Incompatibility(
                        f"{path}/{bound.keyword}",
                        f"the reader requires numbers {_bound_text(bound, lower)}, but the writer "
                        + written,
                    )
                )
        if self.r.has(reader, "multipleOf"):
            step = reader["multipleOf"]
            steps = self.w.values(writer, "multipleOf")
            if not _divides(step, steps, integral):
                written = f"uses {', '.join(map(_show, steps))}" if steps else "has no multipleOf"
                found.append(
                    Incompatibility(
                        f"{path}/multipleOf",
                        f"the reader requires multiples of {_show(step)}, but the writer {written}",
                    )
                )
        return found

    def _array_issues(
        self, reader: dict[str, Any], writer: tuple[Any, ...], path: str, depth: int
    ) -> list[Incompatibility]:
        r, w = self.r, self.w
        r_prefix, r_rest, r_prefix_keyword, r_rest_keyword = _array_shape(r, reader)
        shapes = [_array_shape(w, node) for node in writer]
        caps = w.values(writer, "maxItems") + [len(p) for p, rest, *_ in shapes if rest is False]
        w_max = min(caps) if caps else None
        w_min = max([0, *w.values(writer, "minItems")])
        found: list[Incompatibility] = []
        if r.has(reader, "maxItems") and (w_max is None or w_max > reader["maxItems"]):
            allowed = f"allows up to {_show(w_max)}" if w_max is not None else "sets no limit"
            found.append(
                Incompatibility(
                    f"{path}/maxItems",
                    f"the reader allows at most {_show(reader['maxItems'])} items, but the "
                    f"writer {allowed}",
                )
            )
        if r.has(reader, "minItems") and w_min < reader["minItems"]:
            found.append(
                Incompatibility(
                    f"{path}/minItems",
                    f"the reader requires at least {_show(reader['minItems'])} items, but the "
                    f"writer allows {_show(w_min)}",
                )
            )
        if (
            r.has(reader, "uniqueItems")
            and reader["uniqueItems"] is True
            and True not in w.values(writer, "uniqueItems")
            and (w_max is None or w_max > 1)
        ):
            found.append(
                Incompatibility(
                    f"{path}/uniqueItems",
                    "the reader requires unique items, but the writer allows repeated ones",
                )
            )
        length = max([len(r_prefix), *(len(prefix) for prefix, *_ in shapes)])
        where_rest = f"{path}/{r_rest_keyword}"
        for index in range(length):
            if w_max is not None and index >= w_max:
                return found
            w_nodes = tuple(p[index] if index < len(p) else rest for p, rest, *_ in shapes)
            if False in w_nodes:
                return found
            if index < len(r_prefix):
                found += self.check(
                    r_prefix[index], w_nodes, f"{path}/{r_prefix_keyword}/{index}", depth + 1
                )
            else:
                found += self._rest_issues(r_rest, len(r_prefix), w_nodes, where_rest, depth)
        if w_max is None or w_max > length:
            w_nodes = tuple(rest for _, rest, *_ in shapes)
            if False not in w_nodes:
                found += self._rest_issues(r_rest, len(r_prefix), w_nodes, where_rest, depth)
        return list(dict.fromkeys(found))

    def _rest_issues(
        self, reader: Any, prefix: int, writer: tuple[Any, ...], where: str, depth: int
    ) -> list[Incompatibility]:
        if reader is False:
            return [
                Incompatibility(
                    where,
                    f"the reader allows at most {prefix} items, but the writer's arrays may be "
                    "longer",
                )
            ]
        return self.check(reader, writer, where, depth + 1)

    def _object_issues(
        self, reader: dict[str, Any], writer: tuple[Any, ...], path: str, depth: int
    ) -> list[Incompatibility]:
        r, w = self.r, self.w
        r_declared = r.mapping(reader, "properties")
        w_declared = {name for node in writer for name in w.mapping(node, "properties")}
        w_required = {name for node in writer for name in w.names(node, "required")}
        r_required = r.names(reader, "required")
        closed = _closed_names(w, writer)
        found: list[Incompatibility] = []
        for name in sorted(set(r_declared) | w_declared | set(r_required)):
            w_nodes = tuple(_governing(w, writer, name))
            if False not in w_nodes:
                found += self._property_issues(
                    reader, name, w_nodes, name in w_declared, path, depth
                )
        for name in r_required:
            if name not in w_required:
                found.append(
                    Incompatibility(
                        f"{path}/required",
                        f"the reader requires property {quoted(name)}, "
                        "which the writer does not require",
                    )
                )
        if closed is None:
            found += self._undeclared_issues(reader, writer, path, depth)
        if r.has(reader, "maxProperties"):
            caps = w.values(writer, "maxProperties")
            if closed is not None:
                caps.append(sum(False not in _governing(w, writer, name) for name in closed))
            if not caps or min(caps) > reader["maxProperties"]:
                allowed = f"allows up to {_show(min(caps))}" if caps else "sets no limit"
                found.append(
                    Incompatibility(
                        f"{path}/maxProperties",
                        f"the reader allows at most {_show(reader['maxProperties'])} properties, "
                        f"but the writer {allowed}",
                    )
                )
        if r.has(reader, "minProperties"):
            floor = max([len(w_required), *w.values(writer, "minProperties")])
            if floor < reader["minProperties"]:
                found.append(
                    Incompatibility(
                        f"{path}/minProperties",
                        f"the reader requires at least {_show(reader['minProperties'])} "
                        f"properties, but the writer allows {floor}",
                    )
                )
        if r.has(reader, "propertyNames"):
            found += self._property_name_issues(
                reader["propertyNames"], writer, closed, path, depth
            )
        found += self._dependency_issues(reader, writer, w_required, path, depth)
        return found

    def _property_issues(
        self,
        reader: dict[str, Any],
        name: str,
        writer: tuple[Any, ...],
        declared_by_writer: bool,
        path: str,
        depth: int,
    ) -> list[Incompatibility]:
        where = f"{path}/properties/{_pointer(name)}"
        declared = self.r.mapping(reader, "properties")
        found: list[Incompatibility] = []
        for node in _governing(self.r, (reader,), name):
            if node is True:
                continue
            if node is False:
                reason = (
                    "the reader forbids it (its schema is false)"
                    if name in declared
                    else "the reader does not declare it and its additionalProperties is false"
                )
                found.append(
                    Incompatibility(
                        where, f"the writer allows property {quoted(name)}, but {reason}"
                    )
                )
                continue
            issues = self.check(node, writer, where, depth + 1)
            if issues and not declared_by_writer and all(n is True for n in writer):
                found.append(
                    Incompatibility(
                        where,
                        f"the reader declares property {quoted(name)}, which the writer does not "
                        "declare while its content model is open (additionalProperties is not "
                        "false): the writer's data may carry it with any value, and the "
                        "reader's schema for it does not accept every value",
                    )
                )
            else:
                found += issues
        return found

    def _undeclared_issues(
        self, reader: dict[str, Any], writer: tuple[Any, ...], path: str, depth: int
    ) -> list[Incompatibility]:
        """Properties neither side declares, governed by `patternProperties` and
        `additionalProperties`. With the same patterns on both sides each pattern compares
        with its namesake; otherwise regular languages would have to be compared, so every
        reader rule must read every writer rule."""
        r, w = self.r, self.w
        r_patterns = r.mapping(reader, "patternProperties")
        r_rules: list[tuple[str | None, Any, str]] = [
            (pattern, node, f"{path}/patternProperties/{_pointer(pattern)}")
            for pattern, node in r_patterns.items()
        ]
        r_rules.append(
            (
                None,
                reader.get("additionalProperties", True)
                if r.has(reader, "additionalProperties")
                else True,
                f"{path}/additionalProperties",
            )
        )
        w_patterns: dict[str, list[Any]] = {}
        for node in writer:
            for pattern, schema in w.mapping(node, "patternProperties").items():
                w_patterns.setdefault(pattern, []).append(schema)
        w_rules: list[tuple[str | None, tuple[Any, ...]]] = [
            (pattern, tuple(nodes)) for pattern, nodes in w_patterns.items()
        ]
        w_extra = tuple(w.values(writer, "additionalProperties"))
        if False not in w_extra:
            w_rules.append((None, w_extra))
        paired = set(r_patterns) == set(w_patterns)
        found: list[Incompatibility] = []
        for r_pattern, r_node, where in r_rules:
            for w_pattern, w_nodes in w_rules:
                if r_node is True or False in w_nodes or (paired and r_pattern != w_pattern):
                    continue
                if r_node is False:
                    allowed = (
                        "undeclared properties"
                        if w_pattern is None
                        else f"properties matching {_show(w_pattern)}"
                    )
                    found.append(
                        Incompatibility(
                            where,
                            f"the writer allows {allowed}, which the reader rejects "
                            f"({'additionalProperties' if r_pattern is None else 'its pattern'} "
                            "is false)",
                        )
                    )
                else:
                    found += self.check(r_node, w_nodes, where, depth + 1)
        return found

    def _property_name_issues(
        self,
        names: Any,
        writer: tuple[Any, ...],
        closed: set[str] | None,
        path: str,
        depth: int,
    ) -> list[Incompatibility]:
        where = f"{path}/propertyNames"
        if closed is None:
            w_nodes = (*self.w.values(writer, "propertyNames"), _STRING_SCHEMA)
            return self.check(names, w_nodes, where, depth + 1)
        found = []
        for name in sorted(closed):
            if False in _governing(self.w, writer, name):
                continue
            reason = self.r.rejection(names, name)
            if reason is not None:
                found.append(
                    Incompatibility(
                        where,
                        f"the writer allows property name {quoted(name)}, "
                        "which the reader rejects: " + reason,
                    )
                )
        return found

    def _dependency_issues(
        self,
        reader: dict[str, Any],
        writer: tuple[Any, ...],
        w_required: set[str],
        path: str,
        depth: int,
    ) -> list[Incompatibility]:
        """A property the reader makes depend on others (or on a schema) is fine when the
        writer cannot send it, when the writer always sends the others, when the writer has
        the same dependency, or (for a schema) when all the writer's data satisfies it."""
        found: list[Incompatibility] = []
        for keyword in ("dependencies", "dependentRequired", "dependentSchemas"):
            for name, need in self.r.mapping(reader, keyword).items():
                if False in _governing(self.w, writer, name):
                    continue
                where = f"{path}/{keyword}/{_pointer(name)}"
                w_needs = [
                    node[name]
                    for other in ("dependencies", "dependentRequired", "dependentSchemas")
                    for node in self.w.values(writer, other)
                    if isinstance(node, dict) and name in node
                ]
                if isinstance(need, list):
                    covered = w_required.union(*(n for n in w_needs if isinstance(n, list)))
                    found += [
                        Incompatibility(
                            where,
                            f"the reader requires {quoted(other)} whenever {quoted(name)} is "
                            "present, but "
                            "the writer does not",
                        )
                        for other in need
                        if other not in covered
                    ]
                elif not any(self._same(need, n) for n in w_needs if not isinstance(n, list)):
                    found += self.check(need, writer, where, depth)
        return found


def _divides(step: Any, steps: list[Any], integral: bool) -> bool:
    """Whether the writer's `multipleOf` values guarantee the reader's. jsonschema divides
    floats approximately, so a float step is trusted only when the writer has the very same
    one; integer steps divide exactly. Step 1 holds for any integer-only writer."""
    if integral and step == 1:
        return True
    for other in steps:
        if isinstance(other, float) == isinstance(step, float) and other == step:
            return True
        if isinstance(other, int) and isinstance(step, int) and other % step == 0:
            return True
    return False
