"""`bench.topic_synth` renames a broker-written topic's keys, values and WAL segment for a clone
(issue 23 point 3); the end-to-end equivalence with a broker-created directory is
`python -m bench.topic_synth --check 200` (bench/RESULTS.md), these check the renaming."""

from __future__ import annotations

from bench.topic_synth import renamed_key, renamed_segment, renamed_value
from danube.machines.wal import records
from danube.machines.wal.format import (
    SegmentState,
    decode_frame,
    encode_frame,
    encode_segment_header,
    scan_segment,
)

OLD, NEW = "/default/idle-0", "/default/idle-77"


def test_keys_of_the_template_topic_are_renamed_part_for_part() -> None:
    ids = {5: 9}
    assert renamed_key("/topics/default/idle-0/delivery", OLD, NEW) == (
        "/topics/default/idle-77/delivery"
    )
    assert renamed_key("/namespaces/default/topics/default/idle-0", OLD, NEW) == (
        "/namespaces/default/topics/default/idle-77"
    )
    assert renamed_key("/topics/default/idle-0/producers/5", OLD, NEW, ids) == (
        "/topics/default/idle-77/producers/9"
    )
    assert renamed_key("/topics/default/idle-01/delivery", OLD, NEW) is None, "not a prefix"
    assert renamed_key("/namespaces/default/policy", OLD, NEW) is None


def test_values_name_the_clone_and_its_producer_ids() -> None:
    value = {"topic_name": OLD, "producer_id": 5, "status": True, "other": "default/idle-0"}
    assert renamed_value(value, OLD, NEW, {5: 9}) == {
        "topic_name": NEW,
        "producer_id": 9,
        "status": True,
        "other": "default/idle-77",
    }


def test_a_segment_is_written_again_for_the_clone_with_offsets_and_times_kept() -> None:
    record = records.encode(
        records.Record(request_id=1, producer_id=5, topic_name=OLD, payload=b"x", publish_time=7)
    )
    data = encode_segment_header(OLD, 3, 1234) + encode_frame(3, 99, [record])
    again = renamed_segment(data, NEW, {5: 9})
    scan = scan_segment(again)
    assert (scan.header.topic, scan.header.base_offset, scan.header.created_ms) == (NEW, 3, 1234)
    assert scan.state is SegmentState.WHOLE and scan.next_offset == 4
    frame = decode_frame(again, scan.positions[0])
    assert (frame.base_offset, frame.publish_ms) == (3, 99)
    copied = records.decode(frame.records[0])
    assert (copied.topic_name, copied.producer_id, copied.payload, copied.publish_time) == (
        NEW,
        9,
        b"x",
        7,
    )
