"""The validator payloads and compatibility checks run: jsonschema's own, with every keyword
paying a step from the budget in force (`danube.machines.schema.budget`) and regular expressions
searched under a time limit (`danube.machines.schema.patterns`) instead of the standard `re`.

jsonschema applies keywords recursively and offers no limit of its own: an `anyOf` of two
references to the level below, eighteen levels deep, applies 2**18 schemas to one value, and
a pattern like `^(a+)+$` backtracks for seconds. With one step per keyword applied, both
end at the budget with the limit named."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from jsonschema import validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from danube.machines.schema import budget as budgets
from danube.machines.schema.limits import JSON_KEYWORD_STEPS
from danube.machines.schema.patterns import search
from danube.values.errors import quoted

Keyword = Callable[[Any, Any, Any, dict[str, Any]], Any]


def _counted(keyword: Keyword) -> Keyword:
    def apply(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Any:
        budget = budgets.current()
        if budget is not None:
            budget.spend(JSON_KEYWORD_STEPS)
        return keyword(validator, value, instance, schema)

    return apply


def _pattern(validator: Any, pattern: Any, instance: Any, _: dict[str, Any]) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield ValidationError(f"{quoted(instance)} does not match {quoted(pattern)}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, _: dict[str, Any]
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if search(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _extras(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The properties neither `properties` nor `patternProperties` cover."""
    declared = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        name
        for name in instance
        if name not in declared and not any(search(pattern, name) for pattern in patterns)
    ]


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[Any]:
    """jsonschema's `additionalProperties`, with the time-limited search."""
    if not validator.is_type(instance, "object"):
        return
    extras = _extras(instance, schema)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            names = sorted(extras, key=str)
            verb = "was" if len(names) == 1 else "were"
            listed = ", ".join(repr(name) for name in names)
            yield ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)"
            )


_REPLACED: dict[str, Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


@functools.cache
def budgeted(draft: type[Validator]) -> type[Validator]:
    """`draft` with every keyword counted and the regex keywords time-limited."""
    hooks = {
        name: _counted(_REPLACED.get(name, keyword)) for name, keyword in draft.VALIDATORS.items()
    }
    made: type[Validator] = validators.extend(draft, hooks)
    return made
