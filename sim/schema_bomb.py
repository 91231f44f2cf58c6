"""A client of the schema run that sends the comparison bomb of issue 20: a JSON Schema of 31
levels of `anyOf` over two references to the level below (2**31 branches), then its next
version with another leaf type. The comparison must end at the step limit with
RESOURCE_EXHAUSTED naming it, on every seed: the budget counts steps, not time, so the
simulator runs it as the broker does (spec/schema-registry.md "Limits"). It is sent in the
drain, once the run's faults are drawn, so the seeds' fault sequences stay as they were."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from danube.machines.schema.registry import Registration
from danube.values.errors import DanubeError, ErrorCode

if TYPE_CHECKING:
    from sim.schema_run import SchemaSimulation

SUBJECT = "bomb"
DEPTH = 31
LIMIT = "(limit: compatibility steps)"
RETRY_US = 200_000


def doubling(leaf: str, depth: int = DEPTH) -> bytes:
    definitions: dict[str, Any] = {"a0": {"type": leaf}}
    for n in range(1, depth + 1):
        ref = {"$ref": f"#/definitions/a{n - 1}"}
        definitions[f"a{n}"] = {"anyOf": [ref, dict(ref)]}
    return json.dumps({"definitions": definitions, "$ref": f"#/definitions/a{depth}"}).encode()


class Bomber:
    """Registers the bomb's first version (BACKWARD, the default mode), then the second,
    asking again after a timeout or UNAVAILABLE; `done` once the second is refused."""

    def __init__(self, sim: SchemaSimulation) -> None:
        self.sim = sim
        self.name = "bomber"
        self.done = False
        self.refusal: DanubeError | None = None

    def start(self) -> None:
        self._register(doubling("string"), self._first)

    def _register(self, definition: bytes, then: Any) -> None:
        self.sim.calls.call(
            self.name,
            lambda answer: self.sim.front_end().register(
                SUBJECT, "json_schema", definition, answer
            ),
            then,
        )

    def _first(self, result: Any) -> None:
        if isinstance(result, Registration):
            self._send_second()
        elif self._retry(result):
            self.sim.world.at(RETRY_US, self.start)

    def _send_second(self) -> None:
        self._register(doubling("integer"), self._second)

    def _second(self, result: Any) -> None:
        if self._retry(result):
            self.sim.world.at(RETRY_US, self._send_second)
            return
        if self.done:
            return
        self.done = True
        if (
            isinstance(result, DanubeError)
            and result.code is ErrorCode.RESOURCE_EXHAUSTED
            and LIMIT in result.message
        ):
            self.refusal = result
            self.sim.world.log(f"{self.name}: refused as it must be: {result.message}")
        else:
            self.sim.checker.violation(
                "limits", f"the comparison bomb's second version was answered {result!r}"
            )

    def _retry(self, result: Any) -> bool:
        """A timeout or UNAVAILABLE is asked again; any other refusal is final."""
        if isinstance(result, TimeoutError) or (
            isinstance(result, DanubeError) and result.code is ErrorCode.UNAVAILABLE
        ):
            self.sim.world.log(f"{self.name} asks again after {result!r}")
            return True
        if isinstance(result, DanubeError) and result.code is not ErrorCode.RESOURCE_EXHAUSTED:
            self.done = True
            self.sim.checker.violation("limits", f"{self.name}: {result}")
        return False
