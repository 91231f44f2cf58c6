"""The schema check every publish passes: the topic's binding and policy, the schema the
message names, its payload when asked (decisions in `danube.schema.policy`).

A topic without a binding costs a cached lookup per publish and a store read per second
(the binding may change through another broker). Warnings are counted per topic and
problem and logged at most once per topic and problem every WARN_LOG_S, so a producer that
sends a million unschematised messages does not write a million log lines."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence

from danube.broker.metrics import BrokerMetrics
from danube.broker.schema_service import SchemaService
from danube.core.errors import DanubeError, ErrorCode
from danube.schema import budget as budgets
from danube.schema.formats import ParsedSchema, validate
from danube.schema.limits import (
    INLINE_PATTERN_SECONDS,
    INLINE_VALIDATION_BYTES,
    INLINE_VALIDATION_STEPS,
)
from danube.schema.policy import (
    Problem,
    TopicSchemaConfig,
    ValidationPolicy,
    checks_payload,
    inspects,
    judge,
    producer_binding,
)
from danube.wal import records

log = logging.getLogger("danube.broker")

WARN_LOG_S = 10.0
DETAIL_CHARS = 300
"""A refusal's detail (a validator's message, which may quote the payload) is cut to this."""


def _short(detail: str) -> str:
    if len(detail) <= DETAIL_CHARS:
        return detail
    return f"{detail[:DETAIL_CHARS]}… ({len(detail)} characters)"


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
        """`admit` for all of `messages` (one batch): payloads the binding asks to check go
        to one worker thread together, except a lone small one, which is tried on the event
        loop first under a budget of a few milliseconds."""
        config = await self._schemas.topic_config(topic)
        if not inspects(config):
            return
        named: list[tuple[str, ParsedSchema] | None] = []
        for message in messages:
            found = None
            if message.schema_id is not None:
                found = await self._schemas.schema_of(message.schema_id, message.schema_version)
            named.append(found)
        checked = [
            index
            for index, found in enumerate(named)
            if found is not None and checks_payload(config, found[0])
        ]
        problems: dict[int, str | None] = {}
        try:
            problems = await self._payload_problems(
                [(named[i][1], messages[i].payload) for i in checked]  # type: ignore[index]
            )
        except DanubeError as error:
            if error.code is not ErrorCode.RESOURCE_EXHAUSTED:
                raise
            if config.policy is ValidationPolicy.ENFORCE:
                self._count(topic, config, Problem.PAYLOAD_INVALID)
                raise DanubeError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"message refused by the schema policy of {topic} (enforce): {error.message}",
                ) from None
            # warn: the payloads go unvalidated (said once), the rest is judged as ever.
            self._warn(topic, Problem.PAYLOAD_INVALID, f"not validated: {error.message}")
            checked = []
        by_index = dict(zip(checked, problems.values(), strict=True))
        for index, message in enumerate(messages):
            subject = None if named[index] is None else named[index][0]  # type: ignore[index]
            verdict = judge(config, message.schema_id, subject, by_index.get(index))
            self._count(topic, config, verdict.problem)
            if not verdict.accept:
                raise DanubeError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"message refused by the schema policy of {topic} (enforce): "
                    f"{_short(verdict.detail)}",
                )
            if verdict.problem is not None:
                self._warn(topic, verdict.problem, _short(verdict.detail))

    async def _payload_problems(
        self, work: list[tuple[ParsedSchema, bytes]]
    ) -> dict[int, str | None]:
        """What is wrong with each payload (None: valid), by position in `work`."""
        if not work:
            return {}
        if len(work) == 1 and len(work[0][1]) <= INLINE_VALIDATION_BYTES:
            schema, payload = work[0]
            budget = budgets.Budget(
                INLINE_VALIDATION_STEPS,
                "payload validation on the event loop",
                "inline validation steps",
                pattern_seconds=INLINE_PATTERN_SECONDS,
            )
            try:
                with budgets.using(budget):
                    return {0: validate(schema, payload)}
            except budgets.LimitExceeded:
                pass  # more than a few milliseconds: checked again in a worker thread
        groups: dict[int, list[int]] = {}
        for index, (schema, _) in enumerate(work):
            groups.setdefault(id(schema), []).append(index)
        found: dict[int, str | None] = {}
        for indexes in groups.values():
            schema = work[indexes[0]][0]
            answers = await self._schemas.validate(schema, [work[i][1] for i in indexes])
            found.update(zip(indexes, answers, strict=True))
        return dict(sorted(found.items()))

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
