"""`sim.checker.stored_payload`, the checkers' short read of a stored record's payload
(the standalone checker's on every write, the cluster data checker's on every indexed
object), must give what the full codec gives, whatever fields the broker wrote before it."""

from __future__ import annotations

import pytest

from danube.machines.wal import batches, format, records
from danube.machines.wal.records import Record
from sim.checker import stored_payload
from sim.cluster_data_checker import _records_of

RECORDS = [
    Record(payload=b"t#1"),
    Record(payload=b""),
    Record(
        request_id=300,
        producer_id=2**40,
        topic_name="/default/t-1",
        broker_addr="http://broker-2:6650",
        topic_offset=2**33,
        payload="ünïcode #7".encode(),
        publish_time=1_700_000_000_000,
        producer_name="p-1",
        subscription_name="s",
        attributes={"k": "v"},
        schema_id=5,
        schema_version=2,
        routing_key="key",
    ),
    Record(payload=b"x" * 300, producer_name="long", has_msg_id=False),
]


@pytest.mark.parametrize("record", RECORDS)
def test_the_short_read_gives_the_full_codecs_payload(record: Record) -> None:
    encoded = records.encode(record)
    assert stored_payload(encoded) == records.decode(encoded).payload == record.payload


def test_an_objects_records_are_read_as_the_full_codec_reads_them() -> None:
    """A segment holding a plain frame and a stamped batch (the two ways a publish is
    stored): `_records_of` gives each record's offset and the payload the codec decodes."""
    plain = [records.encode(Record(payload=f"t#{n}".encode(), producer_id=1)) for n in range(3)]
    client = format.encode_frame(
        0,
        0,
        [records.encode(Record(payload=f"b#{n}".encode(), has_msg_id=False)) for n in range(4)],
    )
    stamped = batches.stamp(
        batches.check_batch(client),
        first_offset=13,
        publish_ms=5,
        producer_id=9,
        topic="/default/t",
        broker_addr="http://b:6650",
    )
    header = format.encode_segment_header("/default/t", 10, 0)
    segment = header + format.encode_frame(10, 1, plain) + stamped.frame
    expected = [
        (offset, records.decode(record).payload.decode())
        for offset, record in format.scanned_records(segment, format.scan_segment(segment))
    ]
    assert _records_of(segment) == expected
    assert [p for _, p in expected] == ["t#0", "t#1", "t#2", "b#0", "b#1", "b#2", "b#3"]
    assert [o for o, _ in expected] == list(range(10, 17))


def _encoded(record: Record) -> bytes:
    return records.encode(record)


@pytest.mark.parametrize(
    "damage",
    ["payload past the end", "a second payload", "garbage after the fields"],
)
def test_a_malformed_record_gets_what_the_full_codec_gives(damage: str) -> None:
    """The short read must not accept what the full codec would not (review finding: it
    returned a payload cut short, or the first of two payloads where protobuf takes the
    last): the walk gives way to the codec, so both answer the same, an error included."""
    good = _encoded(RECORDS[2])
    if damage == "payload past the end":
        bad = bytes([0x1A, 50]) + b"short"
    elif damage == "a second payload":
        bad = good + bytes([0x1A, 3]) + b"two"
    else:
        bad = good + bytes([0xFF, 0xFF])
    try:
        expected: bytes | type[BaseException] = records.decode(bad).payload
    except Exception as error:
        expected = type(error)
    try:
        got: bytes | type[BaseException] = stored_payload(bad)
    except Exception as error:
        got = type(error)
    assert got == expected
