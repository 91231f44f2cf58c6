"""The schema check every publish passes: the topic's binding and policy, the schema the
message names, its payload when asked (decisions in `danube.machines.schema.policy`).

A topic without a binding costs a cached lookup per publish and a store read per second
(the binding may change through another broker). Warnings are counted per topic and
problem and logged at most once per topic and problem every WARN_LOG_S, so a producer that
sends a million unschematised messages does not write a million log lines."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence

from danube.machines.schema.policy import (
    Problem,
    TopicSchemaConfig,
    inspects,
    producer_binding,
)
from danube.machines.wal import records
from danube.runtime.metrics import BrokerMetrics
from danube.runtime.schema_service import SchemaService

log = logging.getLogger("danube.runtime")

WARN_LOG_S = 10.0


class SchemaGate:
    def __init__(self, schemas: SchemaService, metrics: BrokerMetrics | None = None) -> None:
        self._schemas = schemas
        self._metrics = metrics
        self.warnings: Counter[tuple[str, Problem]] = Counter()
        """Messages accepted under `warn` that did not fit, by topic and problem."""
        self._logged: dict[tuple[str, Problem], float] = {}

    async def admit(self, topic: str, message: records.Record) -> None:
        """Returns when the message may be published to `topic` (one this broker serves);
        raises INVALID_ARGUMENT, naming the problem, when the topic's policy is enforce and
        the message does not fit, RESOURCE_EXHAUSTED when its payload is over a validation
        limit. It runs before the core, which decides before anything changes."""
        await self.admit_batch(topic, [message])

    async def admit_batch(self, topic: str, messages: Sequence[records.Record]) -> None:
        """`admit` for all of `messages` (one batch), decided by
        `danube.machines.requests.schema_gate.admit` (the simulator runs the same flow): payloads
        the binding asks to check go to one worker thread together, except a lone small one,
        which is tried on the event loop first under a budget of a few milliseconds."""
        await self._schemas.admit(topic, messages, self)

    def judged(self, topic: str, config: TopicSchemaConfig, problem: Problem | None) -> None:
        """`gate.Report`: one message judged (the metrics)."""
        self._count(topic, config, problem)

    def warned(self, topic: str, problem: Problem, detail: str) -> None:
        """`gate.Report`: a message accepted under `warn` that did not fit."""
        self._warn(topic, problem, detail)

    def _count(self, topic: str, config: TopicSchemaConfig, problem: Problem | None) -> None:
        if self._metrics is not None:
            value = problem.value if problem is not None else None
            self._metrics.schema_checked(topic, config.policy.value, value)

    async def inspects(self, topic: str) -> bool:
        """Whether `admit` may refuse or warn about a message of `topic`: a batch is split
        into messages for `admit` only then."""
        return inspects(await self._schemas.topic_config(topic))

    async def producer_binding(self, topic: str, subject: str) -> TopicSchemaConfig | None:
        """Before a producer naming `subject` is created (`policy.producer_binding`): the
        binding to store once the topic exists, or None; refusals raise."""
        registered = await self._schemas.subject_exists(subject)
        return producer_binding(await self._schemas.topic_config(topic), topic, subject, registered)

    async def bind(self, topic: str, subject: str, binding: TopicSchemaConfig) -> None:
        """Once the topic exists: the default binding is written only where none is; one
        made meanwhile is judged as the first was (another subject is refused)."""
        in_force = await self._schemas.bind_if_unbound(topic, binding)
        producer_binding(in_force, topic, subject, registered=True)

    def _warn(self, topic: str, problem: Problem, detail: str) -> None:
        key = (topic, problem)
        self.warnings[key] += 1
        now = time.monotonic()
        if now - self._logged.get(key, -WARN_LOG_S) >= WARN_LOG_S:
            self._logged[key] = now
            log.warning(
                "event=schema_validation_warning topic=%s reason=%s count=%d detail=%s",
                topic, problem.value, self.warnings[key], detail,
            )  # fmt: skip
