"""Cost of the batched path's per-record work and of the plain path's hand codec: the record
check and stamping kernels (`danube.kernels.batches`) and `danube.machines.wal.records.decode`.

PYTHONPATH=src .venv/bin/pytest bench/test_batch_kernels_bench.py --benchmark-only

Each test records `records/s` (and `GB/s` for frames) from its median in extra_info. The frames
are what a Danube client sends: records without msg_id, each a payload, a producer name, two
attributes and a schema id, in one frame of 1,000 records of 1 KiB payloads (about 1 MiB) and
one of 10,000 records of 16-byte payloads (many small fields: the check's worst case per byte).
"""

from __future__ import annotations

from typing import Any

import pytest

from danube.kernels.batches import check_records, stamp_frame
from danube.machines.wal import format, records


def _record(payload_size: int, index: int) -> bytes:
    return records.encode(
        records.Record(
            request_id=index,
            payload=bytes([index & 0xFF]) * payload_size,
            producer_name="producer-1",
            attributes={"trace-id": f"{index:016x}", "kind": "order"},
            schema_id=7,
            schema_version=1,
            has_msg_id=False,
        )
    )


@pytest.fixture(
    scope="module", params=[(1_000, 1024), (10_000, 16)], ids=["1000x1KiB", "10000x16B"]
)
def frame(request: pytest.FixtureRequest) -> tuple[bytes, int]:
    count, payload_size = request.param
    return format.encode_frame(0, 0, [_record(payload_size, i) for i in range(count)]), count


def _rates(benchmark: Any, nbytes: int, count: int) -> None:
    median = benchmark.stats.stats.median
    benchmark.extra_info["GB/s"] = round(nbytes / median / 1e9, 4)
    benchmark.extra_info["records/s"] = round(count / median)


def test_check_records(benchmark: Any, frame: tuple[bytes, int]) -> None:
    data, count = frame
    bad, _, payloads, _ = benchmark(check_records, data)
    assert bad == 0 and len(payloads) == count
    _rates(benchmark, len(data), count)


def test_stamp_frame(benchmark: Any, frame: tuple[bytes, int]) -> None:
    data, count = frame
    msg_id = records.msg_id_fields(12345, "/default/orders", "broker-1:6650")
    stored, positions = benchmark(stamp_frame, data, msg_id, 1_000_000, 1_700_000_000_000)
    assert len(positions) == count and len(stored) > len(data)
    _rates(benchmark, len(data), count)


def test_records_decode(benchmark: Any) -> None:
    """One SendMessage body as the official clients send it (1 KiB payload, a msg_id)."""
    record = _record(1024, 1)
    record += records.encode(records.Record(producer_id=3, topic_name="/default/orders"))
    decoded = benchmark(records.decode, record)
    assert decoded.producer_id == 3
    _rates(benchmark, len(record), 1)
