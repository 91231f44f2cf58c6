"""A small clean run on disk, as a broker and its clients leave it, for the audit tests to
plant anomalies in: objects for the sealed segments, the local WAL still holding the last
sealed segment and the active one, an ack log, and delivery logs of an Exclusive and a
Shared reliable subscription."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from danube.audit.digest import payload_digest
from danube.audit.logs import Ack, AuditLogs, Delivery
from danube.machines.tiering import layout
from danube.machines.wal import format as wal_format
from danube.proto import danube as pb
from danube.values.names import parse_topic

TOPICS = ("/default/orders", "/default/events-part-1")
MESSAGES = 30
SEGMENT = 10
"""Messages per segment: objects hold 0–9 and 10–19, the WAL 10–19 and 20–29."""


def payload(topic: str, seq: int) -> bytes:
    return f"{topic}#{seq}".encode()


def record(topic: str, offset: int, seq: int, producer: str = "p") -> bytes:
    message = pb.StreamMessage(
        request_id=seq,
        msg_id=pb.MsgId(topic_name=topic, topic_offset=offset),
        payload=payload(topic, seq),
        producer_name=producer,
        routing_key=f"k{seq % 3}",
    )
    return bytes(message)


def segment(topic: str, base: int, frames: list[list[bytes]]) -> bytes:
    data = bytearray(wal_format.encode_segment_header(topic, base, 1_000))
    offset = base
    for records in frames:
        data += wal_format.encode_frame(offset, 1_000, records)
        offset += len(records)
    return bytes(data)


def one_per_frame(topic: str, first: int, count: int) -> list[list[bytes]]:
    return [[record(topic, offset, offset)] for offset in range(first, first + count)]


@dataclass
class Run:
    root: Path
    wal: Path = field(init=False)
    objects: Path = field(init=False)
    logs: Path = field(init=False)

    def __post_init__(self) -> None:
        self.wal = self.root / "wal"
        self.objects = self.root / "objects"
        self.logs = self.root / "logs"

    def wal_file(self, topic: str, base: int) -> Path:
        name = parse_topic(topic)
        return self.wal / name.path / wal_format.segment_name(base)

    def object_file(self, topic: str, base: int) -> Path:
        return self.objects / layout.object_key(parse_topic(topic), base, base + SEGMENT)

    def write_segment(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_clean_run(root: Path) -> Run:
    run = Run(root)
    for topic in TOPICS:
        for base in (0, SEGMENT):
            data = segment(topic, base, one_per_frame(topic, base, SEGMENT))
            run.write_segment(run.object_file(topic, base), data)
        for base in (SEGMENT, 2 * SEGMENT):
            data = segment(topic, base, one_per_frame(topic, base, SEGMENT))
            run.write_segment(run.wal_file(topic, base), data)
    write_logs(run.logs, acks_of(), deliveries_of())
    return run


def acks_of() -> list[Ack]:
    return [
        Ack(topic, "p", seq, payload_digest(payload(topic, seq)), None, 1_000 + seq, 1_001 + seq)
        for topic in TOPICS
        for seq in range(MESSAGES)
    ]


def deliveries_of() -> list[Delivery]:
    rows = []
    for topic in TOPICS:
        for offset in range(MESSAGES):
            digest = payload_digest(payload(topic, offset))
            common = (topic, "p", offset, digest, f"k{offset % 3}", 2_000 + offset)
            rows.append(Delivery("ex", "exclusive", True, "c1", offset, *common))
            rows.append(Delivery("sh", "shared", True, f"s{offset % 2}", offset, *common))
    return rows


def write_logs(root: Path, acks: list[Ack], deliveries: list[Delivery]) -> None:
    logs = AuditLogs(root, "test")
    for ack in acks:
        logs.acked(ack)
    for delivery in deliveries:
        logs.delivered(delivery)
    logs.close()
