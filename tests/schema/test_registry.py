"""The registry's decisions (danube.machines.schema.registry): versions, identical re-registrations,
every compatibility mode with its transitive twin, type changes, deletions and the records
kept in the metadata store."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.machines.schema import records, registry
from danube.machines.schema.compatibility import CompatibilityMode
from danube.machines.schema.formats import (
    ParsedSchema,
    SchemaType,
    incompatibilities,
    parse,
    validate,
)
from danube.machines.schema.registry import Registration, SchemaVersion, Subject
from danube.protoc import compile_proto
from danube.values.errors import DanubeError, ErrorCode


def avro(*fields: dict[str, object]) -> ParsedSchema:
    text = json.dumps({"type": "record", "name": "Order", "fields": list(fields)})
    return parse(SchemaType.AVRO, text.encode())


ID = {"name": "id", "type": "long"}
NOTE = {"name": "note", "type": "string", "default": ""}
NOTE_REQUIRED = {"name": "note", "type": "string"}
ID_AS_INT = {"name": "id", "type": "int"}


def read(version: SchemaVersion) -> ParsedSchema:
    return parse(
        version.schema_type, version.definition, compiled=version.compiled, message=version.message
    )


def register(subject: Subject | None, schema: ParsedSchema, now_ms: int = 1_000) -> Registration:
    return registry.register(
        subject, "orders", schema, read, new_id=7, now_ms=now_ms, created_by="me",
        description="", tags=("t",),
    )  # fmt: skip


def subject_with(*schemas: ParsedSchema, mode: CompatibilityMode) -> Subject:
    subject = register(None, schemas[0]).subject
    subject = registry.set_mode(subject, CompatibilityMode.NONE)
    for schema in schemas[1:]:
        subject = register(subject, schema).subject
    return registry.set_mode(subject, mode)


def test_a_new_subject_gets_its_id_version_one_and_backward() -> None:
    outcome = register(None, avro(ID))
    assert outcome.is_new and outcome.version.version == 1
    assert outcome.subject.schema_id == 7
    assert outcome.subject.mode is CompatibilityMode.BACKWARD


def test_registering_the_same_schema_again_returns_its_version() -> None:
    first = register(None, avro(ID)).subject
    spaced = parse(SchemaType.AVRO, b'{ "name": "Order", "type": "record", "fields": '
                   b'[ {"type": "long", "name": "id"} ] }')  # fmt: skip
    again = register(first, spaced)
    assert not again.is_new and again.version.version == 1 and again.subject is first


def test_a_compatible_schema_becomes_the_next_version() -> None:
    first = register(None, avro(ID)).subject
    second = register(first, avro(ID, NOTE))
    assert second.is_new and second.version.version == 2
    assert [v.version for v in second.subject.versions] == [1, 2]


def test_an_incompatible_schema_is_refused_with_every_reason() -> None:
    first = register(None, avro(ID)).subject
    with pytest.raises(DanubeError) as refused:
        register(first, avro(ID_AS_INT, NOTE_REQUIRED))
    assert refused.value.code is ErrorCode.FAILED_PRECONDITION
    text = refused.value.message
    assert "under backward" in text and "version 1: backward:" in text
    assert "note" in text and "/fields/id" in text


@pytest.mark.parametrize(
    ("mode", "history", "candidate", "ok"),
    [
        # backward: the new schema reads the old; adding a defaulted field is fine...
        (CompatibilityMode.BACKWARD, [avro(ID)], avro(ID, NOTE), True),
        # ... adding a required one is not
        (CompatibilityMode.BACKWARD, [avro(ID)], avro(ID, NOTE_REQUIRED), False),
        # forward: the old schema reads the new; a new required field is fine (ignored)...
        (CompatibilityMode.FORWARD, [avro(ID)], avro(ID, NOTE_REQUIRED), True),
        # ... removing a field the old one needs is not
        (CompatibilityMode.FORWARD, [avro(ID, NOTE_REQUIRED)], avro(ID), False),
        (CompatibilityMode.FULL, [avro(ID)], avro(ID, NOTE), True),
        (CompatibilityMode.FULL, [avro(ID)], avro(ID, NOTE_REQUIRED), False),
        (CompatibilityMode.NONE, [avro(ID)], avro(ID_AS_INT), True),
    ],
)
def test_each_mode_against_the_latest_version(
    mode: CompatibilityMode, history: list[ParsedSchema], candidate: ParsedSchema, ok: bool
) -> None:
    subject = subject_with(*history, mode=mode)
    assert (registry.check(subject, candidate, read, mode) == []) is ok


def test_transitive_modes_check_every_version_plain_ones_only_the_latest() -> None:
    """v1 has a required note, v2 dropped it; v3 (without note) is backward with v2 but
    cannot be read... by v1's readers under forward: only the transitive mode sees v1."""
    subject = subject_with(avro(ID, NOTE_REQUIRED), avro(ID), mode=CompatibilityMode.FORWARD)
    candidate = avro(ID, {"name": "extra", "type": "int", "default": 0})
    assert registry.check(subject, candidate, read, CompatibilityMode.FORWARD) == []
    problems = registry.check(subject, candidate, read, CompatibilityMode.FORWARD_TRANSITIVE)
    assert problems and all(p.startswith("version 1: forward:") for p in problems)


def test_a_subject_keeps_its_type_unless_the_mode_is_none() -> None:
    subject = register(None, avro(ID)).subject
    text = parse(SchemaType.STRING, b"")
    assert "a subject keeps one type" in registry.check(subject, text, read, subject.mode)[0]
    assert registry.check(subject, text, read, CompatibilityMode.NONE) == []


def test_deleted_version_numbers_are_never_given_out_again() -> None:
    subject = register(register(None, avro(ID)).subject, avro(ID, NOTE)).subject
    subject = registry.delete_version(subject, 2)
    assert [v.version for v in subject.versions] == [1]
    again = register(subject, avro(ID, {"name": "other", "type": "int", "default": 1}))
    assert again.version.version == 3


def test_deleting_every_version_leaves_a_subject_without_a_latest() -> None:
    subject = registry.delete_version(register(None, avro(ID)).subject, 1)
    with pytest.raises(DanubeError) as missing:
        _ = subject.latest
    assert missing.value.code is ErrorCode.NOT_FOUND
    assert register(subject, avro(ID)).version.version == 2


def test_an_unknown_version_is_not_found_and_says_which_exist() -> None:
    subject = register(None, avro(ID)).subject
    with pytest.raises(DanubeError) as missing:
        registry.delete_version(subject, 4)
    assert missing.value.code is ErrorCode.NOT_FOUND and "live versions: 1" in missing.value.message


@pytest.mark.parametrize("name", ["", "  ", "a/b", "x" * 256, "tab\there"])
def test_bad_subject_names_are_refused(name: str) -> None:
    with pytest.raises(DanubeError) as refused:
        registry.register(
            None, name, avro(ID), read, new_id=1, now_ms=0, created_by="", description="",
            tags=(),
        )  # fmt: skip
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("text", ["Backward", "FULL_TRANSITIVE", " none "])
def test_modes_are_read_in_any_case(text: str) -> None:
    assert registry.parse_mode(text).value == text.strip().lower()


def test_an_unknown_mode_lists_the_known_ones() -> None:
    with pytest.raises(DanubeError) as refused:
        registry.parse_mode("sideways")
    assert "backward_transitive" in refused.value.message


@given(
    st.lists(st.sampled_from([ID, NOTE, NOTE_REQUIRED, ID_AS_INT]), min_size=1, max_size=3),
    st.sampled_from(list(CompatibilityMode)),
)
def test_a_subject_survives_its_stored_record(
    fields: list[dict[str, object]], mode: CompatibilityMode
) -> None:
    by_name = {str(f["name"]): f for f in fields}
    subject = registry.set_mode(register(None, avro(*by_name.values())).subject, mode)
    stored = json.loads(json.dumps(records.subject_to_json(subject)))
    assert records.subject_from_json(stored) == subject


def test_a_damaged_record_is_named_as_such() -> None:
    with pytest.raises(records.RecordError):
        records.subject_from_json({"subject": "x"})


def test_a_protobuf_version_keeps_its_descriptors_and_message_in_the_record() -> None:
    """Stored compiled, so a later check reads it again without running protoc."""
    text = b'syntax = "proto3";\nmessage Helper {}\nmessage Item { string sku = 1; }\n'
    parsed = parse(SchemaType.PROTOBUF, text, compiled=compile_proto(text), message="Item")
    subject = register(None, parsed).subject
    stored = records.subject_from_json(json.loads(json.dumps(records.subject_to_json(subject))))
    (version,) = stored.versions
    assert version.message == "Item" and version.compiled == parsed.compiled
    assert read(version).fingerprint == parsed.fingerprint


@pytest.mark.parametrize(
    ("kind", "payload", "problem"),
    [
        (SchemaType.BYTES, b"\xff\x00", None),
        (SchemaType.STRING, "héllo".encode(), None),
        (SchemaType.STRING, b"\xff", "not UTF-8 text"),
        (SchemaType.NUMBER, b"\x00" * 8, None),
        (SchemaType.NUMBER, b"\x00" * 3, "4 or 8 bytes"),
    ],
)
def test_simple_types_validate_payloads(
    kind: SchemaType, payload: bytes, problem: str | None
) -> None:
    found = validate(parse(kind, b""), payload)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_avro_payloads_are_validated_as_binary_datums() -> None:
    schema = avro(ID)
    assert validate(schema, b"\x02") is None  # zigzag 1
    assert validate(schema, b"\x02\x00") is not None  # a byte left over


def test_a_reader_of_another_type_reads_nothing() -> None:
    assert incompatibilities(parse(SchemaType.STRING, b""), avro(ID)) == [
        "a string reader cannot read avro"
    ]


def test_a_protobuf_candidate_is_read_as_the_message_its_subject_carries() -> None:
    item = b'syntax = "proto3";\nmessage Item { string sku = 1; }\n'
    helper_first = b'syntax = "proto3";\nmessage Helper { int64 n = 1; }\n' + item[19:]
    subject = register(None, parse(SchemaType.PROTOBUF, item, compiled=compile_proto(item))).subject
    candidate = parse(SchemaType.PROTOBUF, helper_first, compiled=compile_proto(helper_first))
    assert candidate.message == "Helper"
    assert registry.as_the_subject_reads(subject, candidate).message == "Item"
    assert registry.as_the_subject_reads(None, candidate) is candidate
    renamed = b'syntax = "proto3";\nmessage Other { string sku = 1; }\n'
    gone = parse(SchemaType.PROTOBUF, renamed, compiled=compile_proto(renamed))
    assert registry.as_the_subject_reads(subject, gone) is gone  # the check names the rename
