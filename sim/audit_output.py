"""What a simulated run leaves for the Spark audit (spec/audit.md): the clients' ack and
delivery logs, as they happen, and at the end the storage images — every WAL segment file as
the simulated disk holds it, every object in the simulated store, and the keys the object
index names (so an orphan from a fenced upload is not read as history).

    <dir>/logs/acks/, <dir>/logs/deliveries/   (danube.audit.logs)
    <dir>/logs/settlements/                     (what the broker's poison policy dropped)
    <dir>/wal/<namespace>/<topic>/<base>.wal
    <dir>/objects/storage/topics/...            (object keys, spec/object-layout.md)
    <dir>/index.json                            (only in tiered runs)

The logs are a side channel: writing them draws no randomness and schedules nothing, so a
seed's trace and digest are the same with and without them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from danube.audit.digest import payload_digest
from danube.audit.logs import Ack, AuditLogs, Delivery, Settlement, SettlementLog
from danube.machines.dispatch.types import SubscriptionType
from danube.machines.tiering import layout
from danube.machines.tiering.index import IndexEntry
from danube.machines.wal import format as wal_format
from danube.machines.wal import records
from danube.values.names import parse_topic
from sim.disk import SimDisk
from sim.objects import SimObjectStore
from sim.world import World


class AuditOutput:
    """The logs of one run's clients; `write_storage` adds the images at the end."""

    def __init__(self, root: Path, world: World) -> None:
        """Refuses a directory with files in it: an audit would read an earlier run's files
        with this one's (and its logs would mix, under the same part names)."""
        if root.exists() and any(root.iterdir()):
            raise FileExistsError(f"{root} is not empty: give --audit-out a fresh directory")
        self.root = root
        self.world = world
        self.logs = AuditLogs(root / "logs", "sim")
        self.settlements = SettlementLog(root / "logs", "sim")
        self._deliveries: dict[tuple[str, str], int] = {}

    def acked(self, topic: str, producer: str, seq: int, payload: bytes, sent_us: int) -> None:
        self.logs.acked(
            Ack(topic, producer, seq, payload_digest(payload), None, sent_us // 1000,
                self.world.now_ms)
        )  # fmt: skip

    def delivered(
        self, client: str, subscription: str, sub_type: int, record: records.Record
    ) -> None:
        """`client` names one consumer of one subscription; `n` counts its deliveries on
        the record's topic."""
        counter = (client, record.topic_name)
        n = self._deliveries.get(counter, 0)
        self._deliveries[counter] = n + 1
        self.logs.delivered(
            Delivery(
                subscription=subscription,
                sub_type=SubscriptionType(sub_type).name.lower(),
                reliable=True,
                consumer=client,
                n=n,
                topic=record.topic_name,
                producer=record.producer_name,
                offset=record.topic_offset,
                digest=payload_digest(record.payload),
                key=record.routing_key,
                recv_ms=self.world.now_ms,
            )
        )

    def policy_dropped(self, topic: str, subscription: str, offset: int, attempts: int) -> None:
        """The broker's `policy_dropped` event, as a real broker's log gives it to the audit
        (`danube.audit.events`)."""
        self.settlements.settled(Settlement(topic, subscription, offset, "dropped", attempts))

    def write_storage(
        self, disk: SimDisk, objects: SimObjectStore | None, metadata: dict[str, Any]
    ) -> None:
        """Flushes the logs and writes the disk, the store and the index as they are now."""
        self.logs.close()
        self.settlements.close()
        for topic, files in disk.topics.items():
            directory = self.root / "wal" / parse_topic(topic).path
            for base, file in files.files.items():
                _write(directory / wal_format.segment_name(base), bytes(file.cache))
        if objects is None:
            return
        for key, blob in objects.objects.items():
            _write(self.root / "objects" / key, blob.data)
        indexed = sorted(
            IndexEntry.from_json(value).key
            for path, value in metadata.items()
            if layout.is_index_entry(path)
        )
        _write(self.root / "index.json", json.dumps(indexed, indent=1).encode())


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
