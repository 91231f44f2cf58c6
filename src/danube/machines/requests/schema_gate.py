"""The schema gate's decision, written once: which binding a publish is judged under (read
through the `BindingCache`, on the host's clock), which schema each message names (read and
parsed through `danube.machines.schema.flows`, kept NAMED_TTL_S), whether the payloads fit (CPU
work, `flows.Work`, except a lone small payload tried at once under a budget of a few
milliseconds) and the verdict (`danube.machines.schema.policy`).

The broker's `SchemaGate` drives these flows over etcd (`SchemaService._drive`), the
simulator's schema run over its simulated etcd (`sim/schema_front_end.py`): the cache's
time-to-live, its stale-on-failure rule and the order of the checks are the ones production
runs, so the simulator checks them. Drivers throw a failed store call into the flow as a
`DanubeError` (UNAVAILABLE) and work over a limit as RESOURCE_EXHAUSTED. Pure."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from danube.machines.node import paths
from danube.machines.requests.binding_cache import BindingCache
from danube.machines.schema import budget as budgets
from danube.machines.schema import flows, policy, records
from danube.machines.schema.flows import NAMED_TTL_S
from danube.machines.schema.formats import ParsedSchema, validate
from danube.machines.schema.limits import (
    BATCH_VALIDATION_STEPS,
    INLINE_PATTERN_SECONDS,
    INLINE_VALIDATION_BYTES,
    INLINE_VALIDATION_STEPS,
    VALIDATION_CPU_SECONDS,
    VALIDATION_STEPS,
)
from danube.machines.schema.policy import Problem, TopicSchemaConfig, ValidationPolicy, Verdict
from danube.machines.schema.registry import SchemaVersion
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic

Flow = Generator[Any, Any, Any]
Named = tuple[str, ParsedSchema]
"""The subject a message's schema belongs to, and the schema parsed."""
Binding = TopicSchemaConfig | str | None
"""What the binding cache holds: a binding, a damaged one's error text, or none."""
PARSED_CACHE = 256
DETAIL_CHARS = 300
"""A refusal's detail (a validator's message, which may quote the payload) is cut to this."""


class Message(Protocol):
    """What the gate reads of a message (`records.Record`, `pb.StreamMessage`)."""

    @property
    def schema_id(self) -> int | None: ...
    @property
    def schema_version(self) -> int | None: ...
    @property
    def payload(self) -> bytes: ...


class Report(Protocol):
    """Where the gate says what it decided (metrics, warning logs, a simulator's checker)."""

    def judged(self, topic: str, config: TopicSchemaConfig, problem: Problem | None) -> None:
        """One message judged under `config` (counted, refused ones too)."""

    def warned(self, topic: str, problem: Problem, detail: str) -> None:
        """A message accepted under `warn` that did not fit (or went unvalidated)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """Every message may be published: the binding they were judged under (None: the topic
    has none, or its policy inspects nothing) and each one's verdict."""

    config: TopicSchemaConfig | None
    verdicts: tuple[Verdict, ...]


class NamedCache:
    """Schemas messages named by (id, version), with when they were read: trusted for
    NAMED_TTL_S (a version never changes, but it can be deleted through another broker), the
    least recently used dropped beyond `capacity`."""

    def __init__(
        self,
        clock: Callable[[], float],
        ttl_s: float = NAMED_TTL_S,
        capacity: int = PARSED_CACHE,
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._entries: OrderedDict[tuple[int, int], tuple[float, Named]] = OrderedDict()

    def fresh(self, key: tuple[int, int]) -> Named | None:
        cached = self._entries.get(key)
        if cached is None or self._clock() - cached[0] >= self._ttl_s:
            return None
        self._entries.move_to_end(key)
        return cached[1]

    def read(self, key: tuple[int, int], named: Named) -> None:
        self._entries[key] = (self._clock(), named)
        self._entries.move_to_end(key)
        if len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def pop(self, key: tuple[int, int], default: Any = None) -> Any:
        """Forgets `key` (a deletion through this broker)."""
        return self._entries.pop(key, default)

    def clear(self) -> None:
        self._entries.clear()


def known(config: Binding) -> TopicSchemaConfig | None:
    """A cached binding; a damaged one (its text) is refused with a fresh error each time,
    so no traceback accumulates on one cached exception."""
    if isinstance(config, str):
        raise DanubeError(ErrorCode.INTERNAL, config)
    return config


def binding(cache: BindingCache[Binding], topic: str) -> Flow:
    """The topic's binding, trusted for the cache's TTL (read on every publish to a served
    topic). A store that does not answer leaves the last binding read in force for another
    TTL (publishes do not each wait for the store); a damaged one is refused (INTERNAL) from
    the cache until it is read again."""
    hit, cached = cache.fresh(topic)
    if hit:
        return known(cached)
    try:
        name = parse_topic(topic)
    except DanubeError:
        return None  # no topic has this name: nothing is bound to it
    try:
        found = yield flows.Read(paths.topic_schema_config(name))
    except DanubeError:
        kept, cached = cache.failed(topic)
        if not kept:
            raise
        return known(cached)
    config: Binding = None
    if found is not None:
        try:
            config = records.decoded(found.key, partial(TopicSchemaConfig.from_json, found.value))
        except records.DamagedRecord as damaged:
            config = damaged.message
    cache.read(topic, config)
    return known(config)


def schema_of(
    cache: NamedCache,
    parse: Callable[[SchemaVersion], ParsedSchema],
    schema_id: int,
    version: int | None,
) -> Flow:
    """The subject and parsed schema a message's (schema id, version) names (the latest
    version without one), None when the registry has no such schema."""
    if version is not None:
        cached = cache.fresh((schema_id, version))
        if cached is not None:
            return cached
    named = yield from flows.named(schema_id, version)
    if named is None:
        return None
    found: Named = (named[0].name, (yield flows.Work(partial(parse, named[1]))))
    if version is not None:
        cache.read((schema_id, version), found)
    return found


def admit(
    bindings: BindingCache[Binding],
    named_cache: NamedCache,
    parse: Callable[[SchemaVersion], ParsedSchema],
    topic: str,
    messages: Sequence[Message],
    report: Report,
) -> Flow:
    """Returns an `Admission` when every message may be published to `topic` (one this
    broker serves); raises INVALID_ARGUMENT, naming the problem, when the topic's policy is
    enforce and a message does not fit, RESOURCE_EXHAUSTED when a payload is over a
    validation limit. It runs before the core, which decides before anything changes."""
    config = yield from binding(bindings, topic)
    if not policy.inspects(config):
        return Admission(config, tuple(Verdict(True) for _ in messages))
    named: list[Named | None] = []
    for message in messages:
        found = None
        if message.schema_id is not None:
            found = yield from schema_of(
                named_cache, parse, message.schema_id, message.schema_version
            )
        named.append(found)
    checked = [
        index
        for index, found in enumerate(named)
        if found is not None and policy.checks_payload(config, found[0])
    ]
    problems: list[str | None] = []
    try:
        problems = yield from payload_problems(
            [(named[i][1], messages[i].payload) for i in checked]  # type: ignore[index]
        )
    except DanubeError as error:
        if error.code is not ErrorCode.RESOURCE_EXHAUSTED:
            raise
        if config.policy is ValidationPolicy.ENFORCE:
            report.judged(topic, config, Problem.PAYLOAD_INVALID)
            raise DanubeError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"message refused by the schema policy of {topic} (enforce): {error.message}",
            ) from None
        # warn: the payloads go unvalidated (said once), the rest is judged as ever.
        report.warned(topic, Problem.PAYLOAD_INVALID, f"not validated: {error.message}")
        checked = []
    by_index = dict(zip(checked, problems, strict=True))
    verdicts = []
    for index, message in enumerate(messages):
        subject = None if named[index] is None else named[index][0]  # type: ignore[index]
        verdict = policy.judge(config, message.schema_id, subject, by_index.get(index))
        report.judged(topic, config, verdict.problem)
        if not verdict.accept:
            raise DanubeError(
                ErrorCode.INVALID_ARGUMENT,
                f"message refused by the schema policy of {topic} (enforce): "
                f"{short(verdict.detail)}",
            )
        if verdict.problem is not None:
            report.warned(topic, verdict.problem, short(verdict.detail))
        verdicts.append(verdict)
    return Admission(config, tuple(verdicts))


def payload_problems(work: list[tuple[ParsedSchema, bytes]]) -> Flow:
    """What is wrong with each payload (None: valid), in the order of `work`: a lone small
    one is tried at once under a budget of a few milliseconds, the rest go to `flows.Work`
    together, one trip per schema."""
    if not work:
        return []
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
                return [validate(schema, payload)]
        except budgets.LimitExceeded:
            pass  # more than a few milliseconds: checked again as work
    groups: dict[int, list[int]] = {}
    for index, (schema, _) in enumerate(work):
        groups.setdefault(id(schema), []).append(index)
    found: dict[int, str | None] = {}
    for indexes in groups.values():
        schema = work[indexes[0]][0]
        payloads = [work[i][1] for i in indexes]
        answers = yield flows.Work(partial(validate_all, schema, payloads))
        found.update(zip(indexes, answers, strict=True))
    return [found[i] for i in range(len(work))]


def validate_all(schema: ParsedSchema, payloads: Sequence[bytes]) -> list[str | None]:
    """Each payload checked against `schema` (a batch is one trip), each under
    VALIDATION_STEPS and all under BATCH_VALIDATION_STEPS: what is wrong with each (None:
    valid); `LimitExceeded` naming the limit when one is reached."""
    runtime = budgets.runtime()
    left = BATCH_VALIDATION_STEPS
    found: list[str | None] = []
    for payload in payloads:
        steps = min(VALIDATION_STEPS, left)
        whole = steps == VALIDATION_STEPS
        limit = "validation steps" if whole else "batch validation steps"
        budget = runtime.budget(steps, "payload validation", limit, VALIDATION_CPU_SECONDS)
        with budgets.using(budget):
            found.append(validate(schema, payload))
        left -= budget.spent
    return found


def short(detail: str) -> str:
    if len(detail) <= DETAIL_CHARS:
        return detail
    return f"{detail[:DETAIL_CHARS]}… ({len(detail)} characters)"
