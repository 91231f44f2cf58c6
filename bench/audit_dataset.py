"""A clean run of any size, written as a broker and its clients leave one, for measuring the
Spark audit at scale (issue 7, point 5) without waiting hours for real traffic to make it.

Storage uses the project's own encoders (`danube.machines.wal.records`,
`danube.machines.wal.format`, the
object layout): per topic, sealed segments become objects, the newest two stay in the local
WAL (the older of them also uploaded, as after an upload that local retention has not pruned
yet), frames hold 1–64 records as group commits do, and two producers interleave on every
topic. The logs are what `AuditLogs` writes: an ack per message (with its offset, so the
ack-against-storage check runs too) and the deliveries of each subscription named, the
shared one with one repeat in every `--repeat-every` deliveries (allowed, and counted).

    .venv/bin/python -m bench.audit_dataset --messages 10000000 --out /tmp/audit-10m

Deterministic for a given set of flags (`--seed`).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from danube.audit.digest import payload_digest, unique_payload
from danube.audit.logs import ACK_SCHEMA, ACKS, DELIVERIES, DELIVERY_SCHEMA, partition_of
from danube.machines.tiering import layout
from danube.machines.wal import format as wal_format
from danube.machines.wal import records
from danube.values.names import parse_topic

PRODUCERS = 2
KEYS = 16
SUB_TYPES = ("exclusive", "shared", "key_shared")
PUBLISH_MS = 1_700_000_000_000


def topics_of(count: int) -> list[str]:
    """Half of them partitions of one partitioned topic, half plain topics."""
    partitions = count // 2
    return [f"/bench/load-part-{i}" for i in range(partitions)] + [
        f"/bench/plain-{i}" for i in range(count - partitions)
    ]


class TopicWriter:
    """One topic's storage and logs, written as the messages are made."""

    def __init__(self, args: argparse.Namespace, topic: str, index: int, messages: int) -> None:
        self.args = args
        self.topic = topic
        self.name = parse_topic(topic)
        self.messages = messages
        self.rng = random.Random(f"{args.seed}:{topic}")
        self.tag = f"t{index:03d}"
        self.segment_bases: list[int] = []
        self.acks: dict[str, list[object]] = {name: [] for name in ACK_SCHEMA.names}
        self.deliveries: dict[str, list[object]] = {name: [] for name in DELIVERY_SCHEMA.names}
        self.parts = 0
        self.delivered = 0

    def write(self) -> int:
        seqs = [0] * PRODUCERS
        offset = 0
        segments_total = -(-self.messages // self.args.segment_records)
        while offset < self.messages:
            base = offset
            end = min(self.messages, base + self.args.segment_records)
            data = bytearray(wal_format.encode_segment_header(self.topic, base, PUBLISH_MS))
            while offset < end:
                batch = min(end - offset, self.rng.randint(1, 64))
                encoded = []
                for position in range(offset, offset + batch):
                    producer = position % PRODUCERS
                    encoded.append(self._message(position, producer, seqs[producer]))
                    seqs[producer] += 1
                data += wal_format.encode_frame(offset, PUBLISH_MS + offset, encoded)
                offset += batch
            self._store(len(self.segment_bases), segments_total, base, end, bytes(data))
            self.segment_bases.append(base)
            self._flush_logs()
        self._flush_logs(final=True)
        return self.delivered

    def _message(self, offset: int, producer: int, seq: int) -> bytes:
        name = f"{self.tag}-p{producer}"
        payload = unique_payload(name, seq, self.args.payload_bytes)
        key = f"k{seq % KEYS}"
        digest = payload_digest(payload)
        self._log(offset, name, seq, digest, key)
        return records.encode(
            records.Record(
                request_id=seq + 1,
                producer_id=producer + 1,
                topic_name=self.topic,
                topic_offset=offset,
                payload=payload,
                publish_time=PUBLISH_MS + offset,
                producer_name=name,
                routing_key=key,
            )
        )

    def _log(self, offset: int, producer: str, seq: int, digest: int, key: str) -> None:
        partition = partition_of(self.topic)
        ack_row = (self.topic, partition, producer, seq, digest, offset,
                   PUBLISH_MS + offset, PUBLISH_MS + offset + 2)  # fmt: skip
        for name, value in zip(ACK_SCHEMA.names, ack_row, strict=True):
            self.acks[name].append(value)
        for sub_type in self.args.subscriptions:
            consumer = {"exclusive": "c0", "shared": f"s{offset % 2}",
                        "key_shared": f"k{int(key[1:]) % 2}"}[sub_type]  # fmt: skip
            repeats = 2 if sub_type == "shared" and offset % self.args.repeat_every == 0 else 1
            for _ in range(repeats):
                row = (sub_type, sub_type, True, consumer, self.delivered, self.topic, partition,
                       producer, offset, digest, key, PUBLISH_MS + offset + 5)  # fmt: skip
                for name, value in zip(DELIVERY_SCHEMA.names, row, strict=True):
                    self.deliveries[name].append(value)
                self.delivered += 1

    def _store(self, index: int, total: int, base: int, end: int, data: bytes) -> None:
        """Sealed segments are objects; the newest two are local (the older one both)."""
        if index < total - 1:
            key = layout.object_key(self.name, base, end)
            _write(self.args.out / "objects" / key, data)
        if index >= total - 2:
            _write(self.args.out / "wal" / self.name.path / wal_format.segment_name(base), data)

    def _flush_logs(self, final: bool = False) -> None:
        if not final and len(self.acks["topic"]) < self.args.rows_per_file:
            return
        for directory, schema, columns in (
            (ACKS, ACK_SCHEMA, self.acks),
            (DELIVERIES, DELIVERY_SCHEMA, self.deliveries),
        ):
            if columns["topic"]:
                name = f"part-{self.tag}-{self.parts:05d}.parquet"
                path = self.args.out / "logs" / directory / name
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.table(columns, schema=schema), path)
            for column in columns.values():
                column.clear()
        self.parts += 1


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _subscriptions(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in SUB_TYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(SUB_TYPES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.audit_dataset", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--topics", type=int, default=16)
    parser.add_argument("--segment-records", type=int, default=50_000)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument(
        "--subscriptions", type=_subscriptions, default=("exclusive", "shared"),
        help="comma-separated subscription types, one subscription each (default "
        "exclusive,shared)",
    )  # fmt: skip
    parser.add_argument("--repeat-every", type=int, default=1000)
    parser.add_argument("--rows-per-file", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if min(args.messages, args.topics, args.segment_records, args.repeat_every) < 1:
        parser.error(
            "--messages, --topics, --segment-records and --repeat-every must be at least 1"
        )
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty")
    started = time.monotonic()
    topics = topics_of(args.topics)
    written = delivered = 0
    for index, topic in enumerate(topics):
        share = args.messages // len(topics) + (index < args.messages % len(topics))
        delivered += TopicWriter(args, topic, index, share).write()
        written += share
        print(
            f"[dataset {time.monotonic() - started:7.1f} s] {written}/{args.messages} messages, "
            f"{index + 1}/{len(topics)} topics",
            file=sys.stderr,
            flush=True,
        )
    print(f"{written} messages, {delivered} deliveries in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
