"""The registry's decisions: which version a registration lands as, whether a schema may
join a subject, what a mode change or a deletion leaves. Pure: the driver reads a subject
from the metadata store, asks here, and writes back what comes out under a compare on the
revisions it read (spec/schema-registry.md), so two brokers registering at once cannot both
win."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from danube.machines.schema.compatibility import CompatibilityMode
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.formats import ParsedSchema, SchemaType, incompatibilities, parse
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted

DEFAULT_MODE = CompatibilityMode.BACKWARD
"""Danube's and Confluent's default: consumers upgraded first can read what is stored."""

MAX_SUBJECT_LENGTH = 255


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    version: int
    schema_type: SchemaType
    definition: bytes
    """As registered: what GetSchema gives back."""
    fingerprint: str
    created_ms: int
    created_by: str
    description: str
    tags: tuple[str, ...]
    compiled: bytes = b""
    """A Protobuf version's FileDescriptorSet, so an old version is read again without
    running the compiler."""
    message: str = ""
    """A Protobuf version's message type."""


@dataclass(frozen=True, slots=True)
class Subject:
    name: str
    schema_id: int
    """One id per subject, shared by its versions: (schema_id, version) names a schema, as
    in Danube, and producers stamp both on every message."""
    mode: CompatibilityMode
    versions: tuple[SchemaVersion, ...]
    """The live versions, oldest first."""
    next_version: int
    """Deleted version numbers are never given out again."""
    created_ms: int

    @property
    def latest(self) -> SchemaVersion:
        if not self.versions:
            raise not_found(f"subject {quoted(self.name)} has no live version (all were deleted)")
        return self.versions[-1]

    def named(self, number: int | None) -> SchemaVersion | None:
        """The live version a message names (the latest when it names none), or None."""
        if number is None:
            return self.versions[-1] if self.versions else None
        return next((v for v in self.versions if v.version == number), None)

    def version(self, number: int) -> SchemaVersion:
        for found in self.versions:
            if found.version == number:
                return found
        live = ", ".join(str(v.version) for v in self.versions) or "none"
        raise not_found(
            f"subject {quoted(self.name)} has no version {number} (live versions: {live})"
        )


@dataclass(frozen=True, slots=True)
class Registration:
    subject: Subject
    version: SchemaVersion
    is_new: bool


Reader = Callable[[SchemaVersion], ParsedSchema]
"""How the registry reads a stored version again (the driver's parse, cached)."""


def check_subject_name(name: str) -> None:
    if not name or not name.strip():
        raise invalid("a schema subject needs a name")
    if len(name) > MAX_SUBJECT_LENGTH or any(ord(c) < 0x20 for c in name) or "/" in name:
        raise invalid(
            f"invalid subject {quoted(name)}: at most {MAX_SUBJECT_LENGTH} characters, no '/' and "
            "no control characters"
        )


def parse_mode(text: str) -> CompatibilityMode:
    try:
        return CompatibilityMode(text.strip().lower())
    except ValueError:
        known = ", ".join(mode.value for mode in CompatibilityMode)
        raise invalid(f"unknown compatibility mode {quoted(text)} (one of {known})") from None


def register(
    subject: Subject | None,
    name: str,
    candidate: ParsedSchema,
    read: Reader,
    *,
    new_id: int,
    now_ms: int,
    created_by: str,
    description: str,
    tags: Sequence[str],
) -> Registration:
    """An identical schema (same fingerprint and type) returns the version that has it;
    anything else must pass the subject's mode against the versions it names."""
    check_subject_name(name)
    if subject is not None:
        for existing in subject.versions:
            if (existing.schema_type, existing.fingerprint) == (
                candidate.schema_type,
                candidate.fingerprint,
            ):
                return Registration(subject, existing, is_new=False)
    new = SchemaVersion(
        version=1 if subject is None else subject.next_version,
        schema_type=candidate.schema_type,
        definition=candidate.definition,
        fingerprint=candidate.fingerprint,
        created_ms=now_ms,
        created_by=created_by,
        description=description,
        tags=tuple(tags),
        compiled=candidate.compiled,
        message=candidate.message,
    )
    if subject is None:
        created = Subject(name, new_id, DEFAULT_MODE, (new,), 2, now_ms)
        return Registration(created, new, is_new=True)
    problems = check(subject, candidate, read, subject.mode)
    if problems:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"schema is not compatible with subject {quoted(name)} under {subject.mode.value}: "
            + "; ".join(problems),
        )
    grown = replace(subject, versions=(*subject.versions, new), next_version=new.version + 1)
    return Registration(grown, new, is_new=True)


def as_the_subject_reads(subject: Subject | None, candidate: ParsedSchema) -> ParsedSchema:
    """A Protobuf candidate is read as the message type the subject's latest version
    carries, if it defines it: adding a message above the main one must not change what
    the subject's payloads are. If it no longer defines it, the candidate stays as parsed
    and the check reports the root's new name."""
    if (
        subject is None
        or not subject.versions
        or candidate.schema_type is not SchemaType.PROTOBUF
        or subject.latest.schema_type is not SchemaType.PROTOBUF
        or subject.latest.message == candidate.message
    ):
        return candidate
    try:
        return parse(
            SchemaType.PROTOBUF, candidate.definition, compiled=candidate.compiled,
            message=subject.latest.message,
        )  # fmt: skip
    except SchemaParseError:
        return candidate


def check(
    subject: Subject, candidate: ParsedSchema, read: Reader, mode: CompatibilityMode
) -> list[str]:
    """What stops `candidate` joining the subject under `mode`, in words (empty: nothing).
    Plain modes compare with the latest version, transitive ones with every live one."""
    if mode is CompatibilityMode.NONE or not subject.versions:
        return []
    against = subject.versions if mode.transitive else subject.versions[-1:]
    problems: list[str] = []
    for existing in against:
        if existing.schema_type is not candidate.schema_type:
            problems.append(
                f"version {existing.version} is {existing.schema_type.value}, this schema is "
                f"{candidate.schema_type.value} (a subject keeps one type unless its mode is none)"
            )
            continue
        old = read(existing)
        found: list[str] = []
        if mode.backward:
            found += [f"backward: {p}" for p in incompatibilities(candidate, old)]
        if mode.forward:
            found += [f"forward: {p}" for p in incompatibilities(old, candidate)]
        problems += [f"version {existing.version}: {p}" for p in found]
    return problems


def set_mode(subject: Subject, mode: CompatibilityMode) -> Subject:
    return replace(subject, mode=mode)


def delete_version(subject: Subject, number: int) -> Subject:
    """The version goes; its number is never reused. Deleting the last live version leaves
    the subject without versions (its id and mode stay, a new registration starts it
    again)."""
    subject.version(number)
    return replace(subject, versions=tuple(v for v in subject.versions if v.version != number))


def parse_version(version: SchemaVersion) -> ParsedSchema:
    """A stored version parsed again, from what was stored (a Protobuf version with its
    compiled descriptors and message type, so nothing is compiled twice)."""
    return parse(
        version.schema_type, version.definition, compiled=version.compiled,
        message=version.message,
    )  # fmt: skip
