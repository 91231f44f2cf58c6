"""How subjects are kept in the metadata store (spec/schema-registry.md "Storage"): one key
per subject holding all of it, so a registration is one compare-and-put on one key; an
index from schema id to subject; and the id counter."""

from __future__ import annotations

import base64
from typing import Any

from danube.schema.compatibility import CompatibilityMode
from danube.schema.formats import SchemaType
from danube.schema.registry import SchemaVersion, Subject

SUBJECTS = "/schemas/subjects/"
IDS = "/schemas/ids/"
NEXT_ID = "/schemas/next_id"


class RecordError(ValueError):
    """A stored subject that is not what this module writes (a damaged or foreign key)."""


def subject_key(name: str) -> str:
    return SUBJECTS + name


def id_key(schema_id: int) -> str:
    return f"{IDS}{schema_id:020d}"


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
