"""How subjects are kept in the metadata store (spec/schema-registry.md "Storage"): one key
per subject holding all of it, so a registration is one compare-and-put on one key; an
index from schema id to subject; and the id counter. The keys are `danube.keys`'s
(re-exported here: `SUBJECTS`, `IDS`, `NEXT_ID`, `subject_key`, `id_key`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, TypeVar

from danube.keys import IDS as IDS
from danube.keys import NEXT_ID, id_key, subject_key
from danube.keys import SUBJECTS as SUBJECTS
from danube.machines.schema.compatibility import CompatibilityMode
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.formats import SchemaType
from danube.machines.schema.registry import SchemaVersion, Subject
from danube.metadata.model import Compare, Op, Put
from danube.values.errors import DanubeError, ErrorCode, quoted

RACE_ATTEMPTS = 8
"""Changes lost to another broker's change before the client is told to retry."""
MAX_SUBJECT_BYTES = 1024 * 1024
"""A subject is one key, and etcd refuses requests above 1.5 MiB by default."""


T = TypeVar("T")


class RecordError(ValueError):
    """A stored subject that is not what this module writes (a damaged or foreign key)."""


class DamagedRecord(DanubeError):
    """A stored value this broker cannot read (INTERNAL): a damaged key, or a version the
    parsers no longer accept. Named, never a traceback; drivers log it."""


def decoded(where: str, decode: Callable[[], T]) -> T:
    try:
        return decode()
    except (RecordError, SchemaParseError, KeyError, TypeError, ValueError) as error:
        raise DamagedRecord(
            ErrorCode.INTERNAL, f"the registry's stored {where} cannot be read: {error}"
        ) from None


def commit(
    subject: Subject, seen_revision: int | None, counter_revision: int | None
) -> tuple[list[Compare], list[Op]]:
    """The transaction that stores `subject` only if nothing changed since the driver read
    it: the subject's key at `seen_revision` (None: it did not exist, and then the id
    counter at `counter_revision`, None when it did not exist either, is bumped and the id
    indexed in the same transaction). A driver that loses reads again and decides again.
    A subject above MAX_SUBJECT_BYTES is refused (FAILED_PRECONDITION)."""
    key = subject_key(subject.name)
    value = subject_to_json(subject)
    size = len(json.dumps(value))
    if size > MAX_SUBJECT_BYTES:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"subject {quoted(subject.name)} would hold {size} bytes of versions, above the "
            f"{MAX_SUBJECT_BYTES} a subject may: delete old versions first",
        )
    ops: list[Op] = [Put(key, value)]
    if seen_revision is not None:
        return [Compare(key, "mod_revision", "==", seen_revision)], ops
    compares = [Compare(key, "version", "==", 0)]
    if counter_revision is None:
        compares.append(Compare(NEXT_ID, "version", "==", 0))
    else:
        compares.append(Compare(NEXT_ID, "mod_revision", "==", counter_revision))
    ops.append(Put(NEXT_ID, subject.schema_id + 1))
    ops.append(Put(id_key(subject.schema_id), {"subject": subject.name}))
    return compares, ops


def subject_to_json(subject: Subject) -> dict[str, Any]:
    return {
        "subject": subject.name,
        "schema_id": subject.schema_id,
        "compatibility_mode": subject.mode.value,
        "next_version": subject.next_version,
        "created_ms": subject.created_ms,
        "versions": [_version_to_json(v) for v in subject.versions],
    }


def _version_to_json(version: SchemaVersion) -> dict[str, Any]:
    return {
        "version": version.version,
        "schema_type": version.schema_type.value,
        "definition": base64.b64encode(version.definition).decode(),
        "fingerprint": version.fingerprint,
        "created_ms": version.created_ms,
        "created_by": version.created_by,
        "description": version.description,
        "tags": list(version.tags),
        "compiled": base64.b64encode(version.compiled).decode(),
        "message": version.message,
    }


def subject_from_json(value: Any) -> Subject:
    try:
        return Subject(
            name=str(value["subject"]),
            schema_id=int(value["schema_id"]),
            mode=CompatibilityMode(value["compatibility_mode"]),
            versions=tuple(_version_from_json(v) for v in value["versions"]),
            next_version=int(value["next_version"]),
            created_ms=int(value["created_ms"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise RecordError(f"not a schema subject record: {error!r}") from None


def _version_from_json(value: Any) -> SchemaVersion:
    return SchemaVersion(
        version=int(value["version"]),
        schema_type=SchemaType(value["schema_type"]),
        definition=base64.b64decode(value["definition"], validate=True),
        fingerprint=str(value["fingerprint"]),
        created_ms=int(value["created_ms"]),
        created_by=str(value["created_by"]),
        description=str(value["description"]),
        tags=tuple(str(t) for t in value["tags"]),
        compiled=base64.b64decode(value["compiled"], validate=True),
        message=str(value["message"]),
    )
