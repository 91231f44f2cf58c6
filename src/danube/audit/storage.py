"""Decoding a stored segment (a local WAL segment or an uploaded object: the same bytes,
spec/wal-format.md) into audit rows, tolerantly.

The broker's own reader stops at the first bad frame, because serving past it could skip
data. An audit must instead see everything that is there: it reports a bad frame and goes on
with the next valid one, and it leaves offset continuity to the checks that compare files
(a frame whose offsets do not continue the previous one is decoded, not rejected; the checks
then find the gap or the duplicated offset). Runs inside Spark tasks: plain Python, no
session, no I/O beyond the bytes it is given.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import NamedTuple

from danube.audit.digest import payload_digest
from danube.kernels import find_frame, scan_frames
from danube.machines.wal import records
from danube.machines.wal.format import WalFormatError, decode_frame, decode_segment_header


class SourceKind(enum.Enum):
    """What a file may legally look like (the rule of `wal.recovery.plan_recovery`: the
    machine closes a segment durably before it writes the next)."""

    WAL = "wal"
    """A closed local segment: whole, or it is damaged."""
    WAL_NEWEST = "wal-newest"
    """A topic's newest local segment: it may end torn, or have a header cut short, when the
    broker died during a write (a crash before the write ended)."""
    OBJECT = "object"
    """An uploaded sealed segment: whole, or it is damaged."""


class DeadLetterOrigin(NamedTuple):
    """A dead letter's pointer back to the message it copies: Danube's `x-original-topic`,
    `x-original-subscription` and `x-original-topic-offset` attributes (spec/failure-policies.md),
    which the audit joins with the subscription's
    acknowledged messages, so a message moved to a dead-letter topic is not `unseen`."""

    topic: str
    subscription: str
    offset: int


ORIGIN_TOPIC = "x-original-topic"
ORIGIN_SUBSCRIPTION = "x-original-subscription"
ORIGIN_OFFSET = "x-original-topic-offset"


class StoredRecord(NamedTuple):
    topic: str
    offset: int
    producer: str
    digest: int
    key: str | None
    source: str
    position: int
    """Byte position of the record's frame in the source."""
    origin: DeadLetterOrigin | None = None
    """Where the message came from when it is a dead letter (its `x-original-*`
    attributes), else None."""


class StorageProblem(NamedTuple):
    kind: str
    """`corrupt-frame` (bytes that are no valid frame, inside a segment or an object),
    `corrupt-record` (a valid frame holds a record that is no `StreamMessage`), `torn-tail`
    (a topic's newest local segment ends in an unfinished write: expected after a crash) or
    `unreadable` (no valid segment header)."""
    topic: str | None
    source: str
    position: int
    detail: str


class StreamFields(NamedTuple):
    producer: str
    payload: bytes
    key: str | None
    origin: DeadLetterOrigin | None = None


def decode_source(
    data: bytes, source: str, kind: SourceKind
) -> Iterator[StoredRecord | StorageProblem]:
    """Every record of the valid frames in `data`, and a problem for each stretch that is not
    one."""
    try:
        header = decode_segment_header(data)
    except WalFormatError as error:
        if kind is SourceKind.WAL_NEWEST and find_frame(data, 0, len(data)) < 0:
            detail = f"the header was never completed ({error}): the broker died creating it"
            yield StorageProblem("torn-tail", None, source, 0, detail)
        else:
            yield StorageProblem("unreadable", None, source, 0, str(error))
        return
    topic, position, end = header.topic, header.length, len(data)
    while position < end:
        found = find_frame(data, position, end)
        if found != position:
            yield _damage(topic, source, kind, position, found, end)
            if found < 0:
                return
            position = found
        scan = scan_frames(data, position, end, decode_frame(data, position).base_offset)
        for frame_at in scan.positions:
            frame = decode_frame(data, frame_at)
            for index, record in enumerate(frame.records):
                try:
                    fields = stream_fields(record)
                except records.RecordError as error:
                    yield StorageProblem(
                        "corrupt-record",
                        topic,
                        source,
                        frame_at,
                        f"offset {frame.base_offset + index} is no StreamMessage: {error}",
                    )
                    continue
                yield StoredRecord(
                    topic,
                    frame.base_offset + index,
                    fields.producer,
                    payload_digest(fields.payload),
                    fields.key,
                    source,
                    frame_at,
                    fields.origin,
                )
        position = scan.valid_end


def _damage(
    topic: str, source: str, kind: SourceKind, start: int, found: int, end: int
) -> StorageProblem:
    if found < 0 and kind is SourceKind.WAL_NEWEST:
        return StorageProblem(
            "torn-tail", topic, source, start, f"{end - start} bytes after the last valid frame"
        )
    stop = end if found < 0 else found
    return StorageProblem(
        "corrupt-frame",
        topic,
        source,
        start,
        f"bytes {start}–{stop - 1} are no valid frame (CRC32C or framing fails)"
        + ("" if found < 0 else f"; the next valid frame starts at byte {found}"),
    )


def stream_fields(record: bytes) -> StreamFields:
    """Producer name, payload, routing key and dead-letter origin of an encoded
    `danube.StreamMessage`, without building a whole `Record` (cheaper than
    `records.decode`, which also decodes the message id and checks every attribute)."""
    producer, payload, key = "", b"", None
    attributes: list[bytes] = []
    for number, _, value in records.fields(record):
        if not isinstance(value, bytes):
            continue
        if number == 3:
            payload = value
        elif number == 5:
            producer = value.decode("utf-8", "replace")
        elif number == 7:
            attributes.append(value)
        elif number == 10:
            key = value.decode("utf-8", "replace")
    origin = dead_letter_origin(attributes) if attributes else None
    return StreamFields(producer, payload, key, origin)


def dead_letter_origin(entries: list[bytes]) -> DeadLetterOrigin | None:
    """The origin named by a record's attribute entries (each an encoded map entry: key 1,
    value 2), None unless all three `x-original-*` attributes are there and the offset is a
    number (a user's own attribute of that name that is no offset is not taken for one)."""
    wanted: dict[str, str] = {}
    for entry in entries:
        name, text = "", ""
        for number, _, value in records.fields(entry):
            if isinstance(value, bytes):
                if number == 1:
                    name = value.decode("utf-8", "replace")
                elif number == 2:
                    text = value.decode("utf-8", "replace")
        if name in (ORIGIN_TOPIC, ORIGIN_SUBSCRIPTION, ORIGIN_OFFSET):
            wanted[name] = text
    topic, subscription = wanted.get(ORIGIN_TOPIC), wanted.get(ORIGIN_SUBSCRIPTION)
    offset = wanted.get(ORIGIN_OFFSET, "")
    if not topic or not subscription or not offset.isdigit():
        return None
    return DeadLetterOrigin(topic, subscription, int(offset))
