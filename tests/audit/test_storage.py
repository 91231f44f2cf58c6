"""Decoding stored segments for audits: the field walk agrees with protobuf, and damage is
reported and stepped over instead of ending the read (danube.audit.storage)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.audit.digest import payload_digest
from danube.audit.storage import (
    DeadLetterOrigin,
    SourceKind,
    StorageProblem,
    StoredRecord,
    decode_source,
    stream_fields,
)
from danube.machines.wal import format as wal_format
from danube.proto import danube as pb

TOPIC = "/default/audited"


def message(offset: int, producer: str = "p", key: str | None = None) -> bytes:
    return bytes(
        pb.StreamMessage(
            request_id=offset,
            msg_id=pb.MsgId(producer_id=3, topic_name=TOPIC, topic_offset=offset),
            payload=f"m{offset}".encode(),
            publish_time=1_700_000_000_000,
            producer_name=producer,
            attributes={"a": "b"},
            routing_key=key,
            schema_id=7,
        )
    )


def segment(offsets: list[int]) -> tuple[bytes, list[int]]:
    """One frame per offset, each carrying the offset it is given; frame positions too."""
    data = bytearray(wal_format.encode_segment_header(TOPIC, offsets[0], 1))
    positions = []
    for offset in offsets:
        positions.append(len(data))
        data += wal_format.encode_frame(offset, 1, [message(offset)])
    return bytes(data), positions


def decoded(data: bytes, kind: SourceKind = SourceKind.OBJECT) -> tuple[list[int], list[str]]:
    rows = list(decode_source(data, "s", kind))
    offsets = [r.offset for r in rows if isinstance(r, StoredRecord)]
    problems = [r.kind for r in rows if isinstance(r, StorageProblem)]
    return offsets, problems


@given(
    producer=st.text(max_size=20),
    payload=st.binary(max_size=300),
    key=st.none() | st.text(max_size=10),
    attributes=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    request_id=st.integers(0, 2**64 - 1),
)
def test_the_field_walk_agrees_with_protobuf(
    producer: str, payload: bytes, key: str | None, attributes: dict[str, str], request_id: int
) -> None:
    encoded = bytes(
        pb.StreamMessage(
            request_id=request_id,
            msg_id=pb.MsgId(topic_name=TOPIC, topic_offset=request_id),
            payload=payload,
            producer_name=producer,
            attributes=attributes,
            routing_key=key,
            schema_version=2,
        )
    )
    assert tuple(stream_fields(encoded)) == (producer, payload, key, None)


def test_every_record_is_a_row_with_its_digest() -> None:
    data, _ = segment([5, 6, 7])
    rows = list(decode_source(data, "s", SourceKind.WAL))
    assert [(r.offset, r.producer) for r in rows if isinstance(r, StoredRecord)] == [
        (5, "p"), (6, "p"), (7, "p"),
    ]  # fmt: skip
    assert rows[0].digest == payload_digest(b"m5")


def test_a_damaged_frame_is_reported_and_the_read_goes_on() -> None:
    data, positions = segment([0, 1, 2, 3])
    broken = bytearray(data)
    broken[positions[1] + 40] ^= 1
    offsets, problems = decoded(bytes(broken))
    assert offsets == [0, 2, 3]
    assert problems == ["corrupt-frame"]


def test_a_torn_end_is_expected_only_of_a_topics_newest_wal_segment() -> None:
    """As recovery rules (`plan_recovery`): the broker closes a segment durably before it
    writes the next, so only the newest can end in an unfinished write."""
    data, _ = segment([0, 1])
    torn = data + b"\x00garbage"
    assert decoded(torn, SourceKind.WAL_NEWEST) == ([0, 1], ["torn-tail"])
    assert decoded(torn, SourceKind.WAL) == ([0, 1], ["corrupt-frame"])
    assert decoded(torn, SourceKind.OBJECT) == ([0, 1], ["corrupt-frame"])


def test_a_header_cut_short_is_a_torn_newest_segment_and_unreadable_elsewhere() -> None:
    cut = wal_format.encode_segment_header(TOPIC, 0, 1)[:20]
    assert decoded(cut, SourceKind.WAL_NEWEST) == ([], ["torn-tail"])
    assert decoded(cut, SourceKind.WAL) == ([], ["unreadable"])


def test_offsets_that_do_not_continue_are_decoded_for_the_checks_to_judge() -> None:
    data, _ = segment([0, 1, 1, 5])
    assert decoded(data) == ([0, 1, 1, 5], [])


def test_a_file_without_a_segment_header_is_unreadable() -> None:
    assert decoded(b"not a segment at all, just some bytes here") == ([], ["unreadable"])


def test_a_valid_frame_with_a_record_that_is_no_message_is_a_corrupt_record() -> None:
    data = wal_format.encode_segment_header(TOPIC, 0, 1) + wal_format.encode_frame(
        0,
        1,
        [message(0) + b"\x0f"],  # field 1 with wire type 7
    )
    assert decoded(data) == ([], ["corrupt-record"])


def dead_letter(attributes: dict[str, str]) -> bytes:
    return bytes(
        pb.StreamMessage(
            request_id=1,
            msg_id=pb.MsgId(producer_id=3, topic_name="/default/dlq", topic_offset=0),
            payload=b"poison",
            producer_name="dead-letters",
            attributes=attributes,
        )
    )


ORIGIN = {
    "x-original-topic": "/default/orders",
    "x-original-subscription": "billing",
    "x-original-topic-offset": "41",
    "x-poison-policy": "dead_letter",
    "a": "b",
}


def test_a_dead_letter_names_its_origin() -> None:
    fields = stream_fields(dead_letter(ORIGIN))
    assert fields.origin == DeadLetterOrigin("/default/orders", "billing", 41)
    assert fields.payload == b"poison"


@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {"a": "b"},
        {k: v for k, v in ORIGIN.items() if k != "x-original-subscription"},
        {**ORIGIN, "x-original-topic-offset": "forty-one"},
        {**ORIGIN, "x-original-topic": ""},
    ],
)
def test_a_record_without_a_whole_origin_is_no_dead_letter(attributes: dict[str, str]) -> None:
    """A user's own attributes, or a partial or unreadable set, name no origin."""
    assert stream_fields(dead_letter(attributes)).origin is None


def test_stored_records_carry_the_origin() -> None:
    data = bytearray(wal_format.encode_segment_header("/default/dlq", 0, 1))
    data += wal_format.encode_frame(0, 1, [dead_letter(ORIGIN), message(1)])
    rows = list(decode_source(bytes(data), "dlq.wal", SourceKind.OBJECT))
    assert [r.origin for r in rows if isinstance(r, StoredRecord)] == [
        DeadLetterOrigin("/default/orders", "billing", 41),
        None,
    ]
