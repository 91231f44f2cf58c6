"""The client logs an audit reads (spec/audit.md): what each producer was told
(`acks/`) and what each consumer received (`deliveries/`), as Parquet part files.

Written through `AuditLogs` (by the load generator, `danube.audit.load`, and the
simulator, `sim/audit_output.py`); read by `spark/audit.py`. Rows are buffered and written
`rows_per_file` at a time, so a long run keeps bounded memory and a crash loses at most one
buffer of log (never reported as anything but missing log rows, which the audit cannot tell
from a message that was never acknowledged: flush before stopping)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from danube.machines.dispatch.types import SubscriptionType
from danube.values.names import parse_topic

ACKS = "acks"
DELIVERIES = "deliveries"
SETTLEMENTS = "settlements"

ACK_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("producer", pa.string()),
        ("seq", pa.int64()),
        ("digest", pa.int64()),
        ("offset", pa.int64()),
        ("send_ms", pa.int64()),
        ("ack_ms", pa.int64()),
    ]
)
"""One row per acknowledged message. `partition` is null for a plain topic; `offset` is null
when the protocol did not say (Danube's `MessageResponse` carries only the request id)."""

DELIVERY_SCHEMA = pa.schema(
    [
        ("subscription", pa.string()),
        ("sub_type", pa.string()),
        ("reliable", pa.bool_()),
        ("consumer", pa.string()),
        ("n", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("producer", pa.string()),
        ("offset", pa.int64()),
        ("digest", pa.int64()),
        ("key", pa.string()),
        ("recv_ms", pa.int64()),
    ]
)
"""One row per message a consumer received, repeats included. `n` numbers one consumer's
deliveries in the order it received them (its order checks use it, never the clock);
`sub_type` is exclusive, shared, failover or key_shared."""

SETTLEMENT_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("subscription", pa.string()),
        ("offset", pa.int64()),
        ("action", pa.string()),
        ("attempts", pa.int64()),
    ]
)
"""One row per message a broker settled for a subscription without a consumer's
acknowledgement: `action` is `dropped` (the Drop poison policy passed it after `attempts`
failed deliveries). Written from the brokers' `policy_dropped` events (`danube.audit.events`
for a real broker's log, the simulator's own hook for its runs). A dead letter needs no row:
the copy in the dead-letter topic names its origin, and storage is the evidence."""

SETTLEMENT_ACTIONS = ("dropped",)

SUB_TYPES = tuple(kind.name.lower() for kind in SubscriptionType)


def partition_of(topic: str) -> int | None:
    """The partition number of `/ns/name-part-N`, None for a plain topic."""
    partition = parse_topic(topic).partition_of
    return None if partition is None else partition[1]


class Ack(NamedTuple):
    topic: str
    producer: str
    seq: int
    digest: int
    offset: int | None
    send_ms: int
    ack_ms: int


class Delivery(NamedTuple):
    subscription: str
    sub_type: str
    reliable: bool
    consumer: str
    n: int
    topic: str
    producer: str
    offset: int
    digest: int
    key: str | None
    recv_ms: int


class Settlement(NamedTuple):
    topic: str
    subscription: str
    offset: int
    action: str
    attempts: int


class LogWriter:
    """One writer's part files of one log. `writer` names them (a process or a client), so
    several writers can share a directory."""

    def __init__(
        self, directory: Path, schema: pa.Schema, writer: str, rows_per_file: int = 200_000
    ) -> None:
        if rows_per_file < 1:
            raise ValueError(f"rows_per_file must be at least 1, got {rows_per_file}")
        self.directory = directory
        self.schema = schema
        self.writer = writer
        self.rows_per_file = rows_per_file
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._parts = itertools.count()
        directory.mkdir(parents=True, exist_ok=True)

    def append(self, row: dict[str, Any]) -> None:
        for name, column in self._columns.items():
            column.append(row.get(name))
        if len(self._columns["topic"]) >= self.rows_per_file:
            self.flush()

    def flush(self) -> None:
        if not self._columns["topic"]:
            return
        table = pa.table(self._columns, schema=self.schema)
        path = self.directory / f"part-{self.writer}-{next(self._parts):05d}.parquet"
        pq.write_table(table, path)
        self._columns = {name: [] for name in self.schema.names}


class AuditLogs:
    """Both logs of one writer under `root` (`root/acks`, `root/deliveries`)."""

    def __init__(self, root: Path, writer: str, rows_per_file: int = 200_000) -> None:
        self.acks = LogWriter(root / ACKS, ACK_SCHEMA, writer, rows_per_file)
        self.deliveries = LogWriter(root / DELIVERIES, DELIVERY_SCHEMA, writer, rows_per_file)

    def acked(self, ack: Ack) -> None:
        row = ack._asdict()
        row["partition"] = partition_of(ack.topic)
        self.acks.append(row)

    def delivered(self, delivery: Delivery) -> None:
        if delivery.sub_type not in SUB_TYPES:
            raise ValueError(f"unknown subscription type {delivery.sub_type!r}")
        row = delivery._asdict()
        row["partition"] = partition_of(delivery.topic)
        self.deliveries.append(row)

    def close(self) -> None:
        self.acks.flush()
        self.deliveries.flush()


class SettlementLog:
    """What brokers settled without a consumer (`SETTLEMENT_SCHEMA`) under `root/settlements`.
    Its own writer, so the clients' logs gain no empty directory."""

    def __init__(self, root: Path, writer: str, rows_per_file: int = 200_000) -> None:
        self.writer = LogWriter(root / SETTLEMENTS, SETTLEMENT_SCHEMA, writer, rows_per_file)

    def settled(self, settlement: Settlement) -> None:
        if settlement.action not in SETTLEMENT_ACTIONS:
            raise ValueError(f"unknown settlement {settlement.action!r}")
        row = settlement._asdict()
        row["partition"] = partition_of(settlement.topic)
        self.writer.append(row)

    def close(self) -> None:
        self.writer.flush()
