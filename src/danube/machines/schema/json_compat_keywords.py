"""The keyword rules of a JSON Schema compatibility check (`danube.machines.schema.json_compat`):
what `type`-specific keywords (strings, numbers, arrays, objects, their properties, names and
dependencies) a reader must allow of a writer. Apart from the comparison's driving logic
(combinators, unions, references) so that each file holds one kind of rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from danube.machines.schema.compatibility import Incompatibility
from danube.machines.schema.json_sides import (
    _NUMERIC,
    _STRING_SCHEMA,
    _array_shape,
    _as_integer_bound,
    _bound_text,
    _closed_names,
    _covers,
    _governing,
    _lower_bounds,
    _pointer,
    _show,
    _Side,
    _upper_bounds,
)
from danube.values.errors import quoted


class KeywordRules:
    """Mixed into `json_compat._Comparison`, whose state (`r`, `w`) and recursion (`check`,
    `_same`) these rules use."""

    r: _Side
    w: _Side

    if TYPE_CHECKING:

        def check(
            self, reader: Any, writer: tuple[Any, ...], path: str, depth: int
        ) -> list[Incompatibility]: ...

        def _same(self, reader: Any, writer: Any) -> bool: ...

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
