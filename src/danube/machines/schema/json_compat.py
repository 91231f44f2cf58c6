"""JSON Schema compatibility: can a reader schema accept every document a writer schema
allows? (`json_can_read`, the rules described in `danube.machines.schema.json_schema`.)

Every step of a comparison is paid for from a `Budget` (`danube.machines.schema.budget`): schemas
whose references and combinators multiply (an `anyOf` of two references to the level below,
thirty levels deep, describes 2**30 branches) exhaust it and are refused with the limit
named, instead of running for minutes; expansions into disjunctions are capped, widening
(which only adds documents, so the answer stays conservative)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from danube.machines.schema import budget as budgets
from danube.machines.schema.compatibility import Incompatibility
from danube.machines.schema.json_compat_keywords import KeywordRules
from danube.machines.schema.json_schema import (
    JsonSchema,
    _walk,
)
from danube.machines.schema.json_sides import (
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
    _describe,
    _essence,
    _finite,
    _governing,
    _pointer,
    _product,
    _show,
    _Side,
    _types,
)
from danube.machines.schema.limits import COMPATIBILITY_STEPS, SCHEMA_CPU_SECONDS
from danube.values.errors import quoted


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


class _Comparison(KeywordRules):
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
