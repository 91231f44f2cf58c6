"""The audit logs: Parquet part files with the documented schemas, written a buffer at a time
(danube.audit.logs)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from danube.audit.logs import ACK_SCHEMA, Ack, AuditLogs, Delivery, partition_of


def test_rows_land_in_part_files_with_the_partition_filled_in(tmp_path: Path) -> None:
    logs = AuditLogs(tmp_path, "w1", rows_per_file=2)
    for seq in range(5):
        logs.acked(Ack("/default/t-part-3", "p", seq, seq * 11, None, 10, 12))
    logs.delivered(Delivery("s", "exclusive", True, "c", 0, "/default/t", "p", 0, 11, None, 20))
    logs.close()
    parts = sorted((tmp_path / "acks").glob("*.parquet"))
    assert [p.name for p in parts] == [
        "part-w1-00000.parquet", "part-w1-00001.parquet", "part-w1-00002.parquet",
    ]  # fmt: skip
    table = pq.read_table(tmp_path / "acks")
    assert table.schema.equals(ACK_SCHEMA, check_metadata=False)
    assert sorted(table.column("seq").to_pylist()) == [0, 1, 2, 3, 4]
    assert set(table.column("partition").to_pylist()) == {3}
    assert table.column("offset").null_count == 5
    deliveries = pq.read_table(tmp_path / "deliveries")
    assert deliveries.column("partition").to_pylist() == [None]


def test_an_unknown_subscription_type_is_refused(tmp_path: Path) -> None:
    logs = AuditLogs(tmp_path, "w")
    with pytest.raises(ValueError, match="unknown subscription type"):
        logs.delivered(Delivery("s", "Exclusive", True, "c", 0, "/d/t", "p", 0, 1, None, 0))


def test_partitions_are_read_from_the_topic_name() -> None:
    assert partition_of("/default/orders-part-12") == 12
    assert partition_of("/default/orders") is None
    assert partition_of("/default/orders-part-x") is None
