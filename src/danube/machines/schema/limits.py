"""The budgets of schema work, in one place (spec/schema-registry.md, "Limits", lists them
with what a client sees). Each name in quotes is the `limit` a refusal names."""

from __future__ import annotations

COMPATIBILITY_STEPS = 20_000
"""'compatibility steps': one comparison of two schemas (one version pair). The project's
test schemas all take under 3,000; a schema whose references multiply takes billions. A step
costs 10-40 microseconds, so the limit is under a second of CPU."""

VALIDATION_STEPS = 200_000
"""'validation steps': one payload checked against its schema. A step is a few microseconds
of CPU: an Avro value read is one, a JSON Schema keyword applied to a value
JSON_KEYWORD_STEPS (jsonschema is slower, and a failing `anyOf` keeps the errors of every
branch, garbage whose collection pauses every thread), so the limit is well under a second
of CPU: an Avro payload of more than 200,000 values, or a JSON one needing more than 25,000
keyword applications, is refused on a validating topic."""

JSON_KEYWORD_STEPS = 8

BATCH_VALIDATION_STEPS = 1_000_000
"""'batch validation steps': all the payloads of one batch together."""

INLINE_VALIDATION_STEPS = 400
"""A payload is first checked on the event loop with this many steps (a few milliseconds at
most); one that needs more is checked again in a worker thread under VALIDATION_STEPS."""

INLINE_VALIDATION_BYTES = 16 * 1024
"""A larger payload goes to a worker thread at once (decoding it alone takes time)."""

MAX_VALIDATED_BYTES = 1024 * 1024
"""'validated payload bytes': the largest payload a topic that validates payloads accepts."""

PATTERN_SECONDS = 0.05
"""'pattern seconds': one regular-expression search of a JSON Schema `pattern` or
`patternProperties` (ECMA-262 patterns may backtrack exponentially)."""

MAX_PATTERN_SIZE = 20_000
"""'pattern size': a regular expression with its counted repetitions unrolled (`regex`
compiles `(a{1000}){1000}` into a million items, for seconds); checked at registration."""

INLINE_PATTERN_SECONDS = 0.002
"""The same on the event loop: a search that needs longer moves the check to a worker."""

SCHEMA_CPU_SECONDS = 5.0
"""'schema CPU seconds': CPU time of one comparison (or parse) in a broker worker thread,
whatever the steps say (the thread's own CPU clock)."""

MAX_ENUM_SYMBOLS = 10_000
"""'enum symbols': symbols of one Avro enum."""

SCHEMA_WORK_CPU_SECONDS = 10.0
"""'schema CPU seconds' of all the schema work of one request in a worker thread (a
transitive check compares with every version, each pair under its own budget)."""

VALIDATION_CPU_SECONDS = 1.0
"""'schema CPU seconds' of one payload validation in a worker thread."""
