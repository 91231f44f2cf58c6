"""The batch check (`danube.kernels.batches.check_records`) stores only records every Danube
client parses: against google.protobuf's own parser (upb), against its plain-Python twin
(`danube.kernels.twins.check_records_py`, same reason, same record), and at its limits
(spec/record-validity.md)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from danube.kernels import batches as kernel
from danube.kernels import twins
from danube.kernels.batches import check_records
from danube.machines.wal import format, records
from danube.machines.wal.batches import check_batch, stamp
from danube.values.errors import DanubeError, ErrorCode
from tests.kernels.upb_oracle import every_client_accepts, stream_messages, upb_fields

pytestmark = pytest.mark.usefixtures("kernel_build")
"""Every test over both builds of the kernels (`conftest.kernel_build`)."""


def _frame(*record: bytes) -> bytes:
    return format.encode_frame(0, 0, list(record))


@settings(max_examples=1500, deadline=None)
@given(stream_messages(msg_id=False))
@example(b"\x80\x80\x80\x80\x10\x01")  # field 2**29 (issue 20): acknowledged and stored
@example(b"\x08" + b"\xff" * 9 + b"\x02")  # 10-byte varint, last byte 2 (issue 20)
@example(b"\x08" + b"\xff" * 9 + b"\x01")  # the largest uint64
@example(b"\xf8\xff\xff\xff\x0f\x01")  # field 2**29-1, the largest
@example(b"\x5b\x5c")  # an empty group, which upb skips
@example(b"\x3a\x05\x0a\x01a\x18\x01")  # an attributes entry with a field 3
@example(b"\x1a\x81\x80\x80\x80\x80\x00x")  # a 6-byte length
def test_the_check_accepts_exactly_what_every_client_parses(record: bytes) -> None:
    bad, _, payloads, _ = check_records(_frame(record))
    fields = upb_fields("StreamMessage", record)
    accepted = every_client_accepts("StreamMessage", record) and fields["msg_id"] is None
    assert (bad == 0) == accepted, f"reason {bad}"
    if accepted:
        assert payloads[0] == len(bytes.fromhex(fields["payload"]))


@settings(max_examples=1000, deadline=None)
@given(st.lists(stream_messages(msg_id=False), min_size=1, max_size=4))
def test_the_kernel_and_its_twin_agree(batch: list[bytes]) -> None:
    frame = _frame(*batch)
    bad, index, payloads, positions = check_records(frame)
    twin = twins.check_records_py(frame, kernel.BATCH_FIELDS)
    twin_bad, twin_index, twin_payloads, twin_positions = twin
    assert (bad, index) == (twin_bad, twin_index)
    checked = len(batch) if bad == 0 else index  # records wholly checked
    assert payloads[:checked].tolist() == twin_payloads[:checked]
    assert positions[: checked + (bad != 0)].tolist() == twin_positions


def _refusal(*record: bytes) -> str:
    with pytest.raises(DanubeError) as refused:
        check_batch(_frame(b"\x1a\x01x", *record))
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    return refused.value.message


@pytest.mark.parametrize(
    ("record", "message"),
    [
        pytest.param(
            b"\x80\x80\x80\x80\x10\x01",
            "is not a valid StreamMessage encoding: a field number is 0 or above 2**29-1",
            id="field-2**29",
        ),
        pytest.param(
            b"\x08" + b"\xff" * 9 + b"\x02",
            "is not a valid StreamMessage encoding: a varint is longer than 10 bytes or its "
            "10th byte is above 1",
            id="varint-past-64-bits",
        ),
        pytest.param(b"\x5b\x5c", "a wire type is 3 or 4 (groups, refused)", id="group"),
        pytest.param(
            b"\x3a\x05\x0a\x01a\x18\x01", "an attributes entry holds a field other", id="entry"
        ),
        pytest.param(b"\x12\x00", "carries a msg_id; the broker sets it", id="msg-id"),
        pytest.param(
            b"\x3a\x00" * 1001, "has more than 1000 attributes, the limit", id="attributes"
        ),
        pytest.param(
            b"\x08\x01" * 4092,
            "has more than 4091 fields (msg_id's and attribute entries' included), "
            "the limit: with the broker's msg_id a record may hold 4096",
            id="fields",
        ),
    ],
)
def test_a_refused_record_is_named_with_the_reason(record: bytes, message: str) -> None:
    refusal = _refusal(record)
    assert refusal.startswith("message 1 of the batch ") and message in refusal


def test_a_record_at_the_limits_is_stored_and_decodes_once_stamped() -> None:
    """The stamped record (the client's fields and the broker's msg_id) is one the record codec
    reads: the check leaves room for the msg_id's fields under `MAX_FIELDS`."""
    attributes = b"\x3a\x00" * records.MAX_ATTRIBUTES
    record = attributes + b"\x08\x01" * (kernel.BATCH_FIELDS - records.MAX_ATTRIBUTES)
    stored = stamp(check_batch(_frame(record)), 7, 0, 3, "/default/t", "broker:1")[0]
    decoded = records.decode(stored)
    assert decoded.attributes == {"": ""} and decoded.topic_offset == 7
    assert decoded.producer_id == 3 and decoded.broker_addr == "broker:1"


@pytest.mark.parametrize(
    "records_",
    [
        pytest.param([b"\x3a\x00" * 1000, b"\x3a\x00" * 1001], id="attributes"),
        pytest.param([b"\x08\x01" * 4091, b"\x08\x01" * 4092], id="fields"),
        pytest.param([b"\x3a\x00" * 990 + b"\x3a\x80\x80\x01" + b"\x0a\x00" * 8192], id="entry"),
        pytest.param([b"\x1a\x01x" * 5000 + b"\x12\x00"], id="fields-before-msg-id"),
    ],
)
def test_the_kernel_and_its_twin_agree_at_the_limits(records_: list[bytes]) -> None:
    frame = _frame(*records_)
    bad, index, payloads, _ = check_records(frame)
    twin = twins.check_records_py(frame, kernel.BATCH_FIELDS)
    assert (bad, index) == twin[:2] and bad != 0
    assert payloads[:index].tolist() == twin[2][:index]
