"""The invariants of the schema run (spec/schema-registry.md), judged with knowledge the
broker does not have: what each producer meant to send, and fastavro's own schema
resolution as the oracle of what a consumer can read.

- *Registrations are what they said*: every version a producer was told it registered is
  stored under that number with that schema (by fingerprint) and that subject's id; versions
  run 1, 2, ... with no gap and no two alike; the id index and counter agree.
- *Modes keep their promise*: every valid message written with version W is read by every
  version the subject's mode promises can read W (backward: the next one; forward: the one
  before; full: both; transitive: all later, all earlier, all others), decoding with fastavro
  from W to that reader's schema.
- *Progress*: every subject gets its first version and mode (a registry that refuses what
  it should take would otherwise make a quiet, empty run).
- *Policies do what they say*: a message that fits is accepted without a warning; one that
  does not (no schema id, an unknown version, another subject's schema, a damaged payload
  where payloads are checked) is accepted under `none`, accepted with a warning under
  `warn`, refused under `enforce`; a damaged payload where payloads are not checked passes.
  Each message is judged by the binding the broker judged it under (an operator rebinds
  topics during the run).
- *Bindings are fresh*: that binding is one the broker read from the store less than the
  binding cache's TTL before the publish began (or before it was decided), or one it kept
  because a later read failed (stale-on-failure renews it for another TTL); the checker
  follows each front end's binding reads to know.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import fastavro

from danube.machines.node import paths
from danube.machines.requests.binding_cache import TTL_S
from danube.machines.schema import records
from danube.machines.schema.avro import parse_avro
from danube.machines.schema.compatibility import CompatibilityMode
from danube.machines.schema.policy import TopicSchemaConfig, ValidationPolicy, Verdict
from danube.machines.schema.registry import Subject
from danube.metadata.model import KeyValue
from danube.metadata.state import MetadataState
from danube.proto import danube as pb
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic
from sim.checker import Violation
from sim.world import US_PER_S, World

TTL_US = int(TTL_S * US_PER_S)

PAYLOAD_DEFECTS = ("truncated", "trailing")
DEFECTS = ("missing_id", "unknown_version", "other_subject", *PAYLOAD_DEFECTS)
MAX_REPORTED = 5
"""Violations of one invariant reported per run (the first ones tell the story)."""


@dataclass(frozen=True, slots=True)
class Told:
    producer: str
    subject: str
    schema_id: int
    version: int
    definition: bytes


def expected_outcome(config: TopicSchemaConfig | None, defect: str | None) -> str:
    if config is None or config.policy is ValidationPolicy.NONE or defect is None:
        return "accepted"
    if defect in PAYLOAD_DEFECTS and not config.payload_validation:
        return "accepted"
    return "warned" if config.policy is ValidationPolicy.WARN else "refused"


def promised_readers(mode: CompatibilityMode, versions: list[int], writer: int) -> list[int]:
    at = versions.index(writer)
    later, earlier = versions[at + 1 :], versions[:at]
    readers: list[int] = []
    if mode.backward:
        readers += later if mode.transitive else later[:1]
    if mode.forward:
        readers += earlier if mode.transitive else earlier[-1:]
    return readers


class SchemaChecker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.violations: list[Violation] = []
        self._reported: Counter[str] = Counter()
        self.told: list[Told] = []
        self.bindings: dict[str, TopicSchemaConfig | None] = {}
        """The binding in force, by topic."""
        self._topic_of: dict[str, str] = {}
        """Binding key -> topic."""
        self._cached: dict[tuple[str, str], list[tuple[int, TopicSchemaConfig | None]]] = {}
        """By (front end, topic): when its binding cache took or renewed a binding, and
        which (the reads it was answered, or a failed read while one was cached)."""
        self.outcomes: Counter[str] = Counter()
        self._valid: list[tuple[str, int, bytes]] = []
        """(subject, version, payload) of every accepted message that fits."""
        self.promises_checked = 0

    def violation(self, invariant: str, detail: str) -> None:
        self._reported[invariant] += 1
        if self._reported[invariant] <= MAX_REPORTED:
            self.violations.append(Violation(invariant, detail, self.world.now))
            self.world.log(f"VIOLATION {invariant}: {detail}")

    def registered(self, told: Told) -> None:
        self.told.append(told)

    def bound(self, topic: str, config: TopicSchemaConfig | None) -> None:
        """`topic`'s binding in the store is now `config` (set up, or an operator's)."""
        self.bindings[topic] = config
        self._topic_of[paths.topic_schema_config(parse_topic(topic))] = topic

    def store_read(self, front_end: str, key: str, answer: Any) -> None:
        topic = self._topic_of.get(key)
        if topic is None:
            return
        taken = self._cached.setdefault((front_end, topic), [])
        if isinstance(answer, BaseException):
            if not taken:
                return  # nothing cached: the failure stands
            config = taken[-1][1]
        elif isinstance(answer, KeyValue):
            config = TopicSchemaConfig.from_json(answer.value)
        else:
            config = None
        taken.append((self.world.now, config))
        del taken[:-64]

    def crashed(self, front_end: str) -> None:
        for key in [key for key in self._cached if key[0] == front_end]:
            del self._cached[key]

    def fresh(
        self, front_end: str, topic: str, config: TopicSchemaConfig | None, began: int
    ) -> None:
        """A publish that began at `began` was judged now under `config`: the front end's
        cache took that binding less than TTL_S before some moment of the publish."""
        for at, taken in reversed(self._cached.get((front_end, topic), [])):
            if taken == config and began - TTL_US <= at <= self.world.now:
                return
        self.violation(
            "binding freshness",
            f"{front_end} judged a publish to {topic} (begun at {began} us) under {config}, "
            f"which it did not read within {TTL_S} s",
        )

    def admitted(
        self,
        topic: str,
        subject: str,
        defect: str | None,
        message: pb.StreamMessage,
        outcome: Verdict | DanubeError,
        judged: tuple[str, TopicSchemaConfig | None, int] | None = None,
    ) -> None:
        """One message's publish, decided at the broker (see `admitted_batch`)."""
        verdicts = outcome if isinstance(outcome, DanubeError) else (outcome,)
        self.admitted_batch(topic, subject, [(defect, message)], verdicts, judged)

    def admitted_batch(
        self,
        topic: str,
        subject: str,
        sent: list[tuple[str | None, pb.StreamMessage]],
        outcome: tuple[Verdict, ...] | DanubeError,
        judged: tuple[str, TopicSchemaConfig | None, int] | None = None,
    ) -> None:
        """At the broker, when it decided a publish of `sent` (defect, message) pairs (its
        answer may still be lost on the way back); `judged`: which front end decided, under
        which binding, and when the publish began (None: judged under the binding in force).
        A batch is refused as one when any of its messages must be (the gate judges every
        message before the core stores any); else each message gets its own verdict."""
        if isinstance(outcome, DanubeError) and outcome.code is ErrorCode.UNAVAILABLE:
            self.outcomes["unavailable"] += 1
            return
        if isinstance(outcome, DanubeError) and outcome.code is not ErrorCode.INVALID_ARGUMENT:
            self.violation("policy", f"{topic}: a publish was answered {outcome}")
            return
        config = self.bindings[topic]
        if judged is not None:
            front_end, config, began = judged
            self.fresh(front_end, topic, config, began)
        wanted = [expected_outcome(config, defect) for defect, _ in sent]
        if len(sent) > 1:
            self.outcomes["in_batches"] += len(sent)
        defects = [defect for defect, _ in sent]
        if isinstance(outcome, DanubeError):
            self.outcomes["refused"] += 1
            if "refused" not in wanted:
                self.violation(
                    "policy",
                    f"{topic} ({config}): a publish of {len(sent)} message(s) with defects "
                    f"{defects} was refused, expected {wanted} ({outcome})",
                )
            return
        if len(outcome) != len(sent):
            self.violation("policy", f"{topic}: {len(sent)} messages, {len(outcome)} verdicts")
            return
        for (defect, message), verdict, expected in zip(sent, outcome, wanted, strict=True):
            actual = "accepted" if verdict.problem is None else "warned"
            self.outcomes[actual] += 1
            if actual != expected:
                self.violation(
                    "policy",
                    f"{topic} ({config}): a message with defect {defect} was "
                    f"{actual}, expected {expected} ({verdict}; one of {len(sent)} in its "
                    "publish)",
                )
            if defect is None:
                assert message.schema_version is not None
                self._valid.append((subject, message.schema_version, message.payload))

    def final(self, state: MetadataState, subjects: list[str], ready: set[str]) -> None:
        """`ready`: the subjects whose first version and mode were set (the run retried
        until the end, through a calm drain phase, so any other was never going to be)."""
        for name in subjects:
            if name not in ready:
                self.violation("progress", f"{name} never got its first version and mode")
        stored: dict[str, Subject] = {}
        for name in subjects:
            found = state.get(records.subject_key(name))
            if found is not None:
                stored[name] = records.subject_from_json(found.value)
        self._check_registrations(state, stored)
        self._check_promises(stored)

    def _check_registrations(self, state: MetadataState, stored: dict[str, Subject]) -> None:
        for told in self.told:
            subject = stored.get(told.subject)
            version = None
            if subject is not None:
                version = next((v for v in subject.versions if v.version == told.version), None)
            fingerprint = parse_avro(told.definition).fingerprint
            if subject is None or version is None:
                self.violation("registration", f"{told} is not stored")
            elif version.fingerprint != fingerprint or subject.schema_id != told.schema_id:
                self.violation(
                    "registration",
                    f"{told.producer} was told {told.subject} v{told.version} (id "
                    f"{told.schema_id}) is {told.definition.decode()}; stored: id "
                    f"{subject.schema_id}, {version.definition.decode()}",
                )
        ids: dict[int, str] = {}
        for subject in stored.values():
            numbers = [v.version for v in subject.versions]
            if numbers != list(range(1, len(numbers) + 1)):
                self.violation("registration", f"{subject.name} has versions {numbers}")
            prints = [v.fingerprint for v in subject.versions]
            if len(set(prints)) != len(prints):
                self.violation("registration", f"{subject.name} stores one schema twice")
            if subject.schema_id in ids:
                self.violation(
                    "registration",
                    f"{subject.name} and {ids[subject.schema_id]} share id {subject.schema_id}",
                )
            ids[subject.schema_id] = subject.name
            index = state.get(records.id_key(subject.schema_id))
            if index is None or index.value != {"subject": subject.name}:
                self.violation("registration", f"id {subject.schema_id} indexes {index}")
        counter = state.get(records.NEXT_ID)
        if ids and (counter is None or int(counter.value) <= max(ids)):
            self.violation("registration", f"the id counter is {counter} with ids {sorted(ids)}")

    def _check_promises(self, stored: dict[str, Subject]) -> None:
        parsed: dict[tuple[str, int], Any] = {}
        for subject in stored.values():
            for version in subject.versions:
                parsed[(subject.name, version.version)] = fastavro.parse_schema(
                    json.loads(version.definition)
                )
        for name, writer, payload in self._valid:
            subject = stored.get(name)
            if subject is None or (name, writer) not in parsed:
                self.violation("registration", f"messages were accepted with {name} v{writer}, "
                               "which is not stored")  # fmt: skip
                continue
            numbers = [v.version for v in subject.versions]
            own = parsed[(name, writer)]
            buffer = io.BytesIO(payload)
            try:
                fastavro.schemaless_reader(buffer, own, None)
                whole = buffer.tell() == len(payload)
            except Exception:
                whole = False
            if not whole:
                self.violation("promise", f"{name} v{writer}: a valid payload does not decode")
                continue
            for reader in promised_readers(subject.mode, numbers, writer):
                self.promises_checked += 1
                try:
                    fastavro.schemaless_reader(io.BytesIO(payload), own, parsed[(name, reader)])
                except Exception as error:
                    self.violation(
                        "promise",
                        f"{name} ({subject.mode.value}): v{reader} cannot read a message "
                        f"written with v{writer}: {error}",
                    )
