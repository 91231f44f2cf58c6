"""What the broker stores, the official Danube Python client (danube-client 0.5.0, protobuf's
upb parser under its own generated classes) reads, and reads as we do: the records of a batch
that passed the check once stamped, and the records the plain path stores (the decoded
message, re-encoded with its offset). The client runs in its own interpreter
(`.venv-official`, or $DANUBE_OFFICIAL_PYTHON): if it is missing the test fails, never skips."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.kernels.batches import check_records
from danube.machines.wal import format, records
from danube.machines.wal.batches import check_batch, stamp
from tests.conformance.harness import official_python
from tests.kernels.test_batches import record_values
from tests.kernels.upb_oracle import Oracle, client_messages, record_of_upb
from tests.wal.test_records import messages

BATCH_RECORDS = st.one_of(client_messages(msg_id=False), record_values.map(records.encode))
"""Records of a batch: odd encodings (some refused by the check) and canonical ones."""
PLAIN_MESSAGES = st.one_of(client_messages(msg_id=True), messages().map(bytes))

pytestmark = pytest.mark.slow


@functools.cache
def _official() -> Oracle:
    return Oracle(official_python(), "--official")


@pytest.fixture(scope="module", autouse=True)
def official() -> Oracle:
    """Started before any example runs: a missing official client fails every test here."""
    return _official()


def _client_reads(stored: bytes) -> records.Record:
    """What the official client's parser read of a stored record, checked to be what we meant
    to store; and that none of Danube's other clients is stricter about its bytes."""
    answer = _official().ask("StreamMessage", stored)
    assert answer["parsed"], f"the official client cannot parse {stored.hex()}"
    assert answer["accepted"], f"another Danube client would refuse {stored.hex()}"
    return record_of_upb(answer["fields"])


def _checked(record: bytes) -> bool:
    return check_records(format.encode_frame(0, 0, [record]))[0] == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BATCH_RECORDS, min_size=20, max_size=40), st.integers(0, 2**40))
def test_stored_batch_records_read_as_we_store_them(candidates: list[bytes], base: int) -> None:
    accepted = [record for record in candidates if _checked(record)] or [b""]
    batch = check_batch(format.encode_frame(0, 0, accepted))
    stored = stamp(batch, base, 1_700_000_000_000, 42, "/default/orders", "http://broker:6650")
    for index, record in enumerate(stored):
        read = _client_reads(record)
        assert read == records.decode(record)
        assert read.topic_offset == base + index and read.producer_id == 42
        assert read.topic_name == "/default/orders"
        assert read.payload == records.decode(accepted[index]).payload


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PLAIN_MESSAGES, min_size=20, max_size=40), st.integers(0, 2**40))
def test_records_the_plain_path_stores_read_as_we_store_them(
    candidates: list[bytes], offset: int
) -> None:
    for candidate in candidates:
        try:
            message = records.decode(candidate)
        except records.RecordError:
            continue
        if not message.has_msg_id:
            continue  # refused: "msg_id is required"
        message.topic_offset = offset  # as `node.requests.publish` stamps it
        stored = records.encode(message)
        assert _client_reads(stored) == message
