"""The tiered read planner (spec/object-layout.md, "Tiered reads") on real segment objects:
for random index and WAL layouts, every offset is served by exactly one tier (objects below
the WAL's first retained offset, the WAL from it on), a reader walking from offset 0 receives
every servable offset once and in order, and object reads decode to the right records within
their record and byte limits."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.tiering import layout
from danube.machines.tiering.index import IndexEntry, describe_object
from danube.machines.tiering.reader import (
    LocalRead,
    NotAvailable,
    ObjectRead,
    decode_object_read,
    plan_read,
)
from danube.machines.wal import format
from tests.tiering.segments import TOPIC, build_segment, record


@dataclass
class Layout:
    entries: list[IndexEntry]
    objects: dict[str, bytes]
    wal_first: int
    wal_end: int
    """The WAL's readable end: it serves [wal_first, wal_end)."""
    interval: int
    largest_frame: int
    records: dict[int, bytes]

    def tier(self, offset: int) -> str | None:
        if offset >= self.wal_first:
            return "local" if offset < self.wal_end else None
        if any(e.start_offset <= offset <= e.end_offset for e in self.entries):
            return "object"
        return None


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Contiguous objects from a random first offset; a WAL whose first retained offset lies
    anywhere from before the index to a little past its end (the last case is one the
    retention rule forbids, and the planner must still answer it honestly)."""
    first = draw(st.integers(0, 12))
    interval = draw(st.integers(0, 80))
    sizes = st.lists(st.integers(1, 3), min_size=1, max_size=4)  # records per frame
    segments = draw(st.lists(sizes, max_size=4))
    entries, objects, records, largest = [], {}, {}, 0
    offset = first
    for frame_sizes in segments:
        frames = []
        for count in frame_sizes:
            for o in range(offset, offset + count):
                records[o] = record(o, draw(st.integers(1, 20)))
            frames.append([records[o] for o in range(offset, offset + count)])
            offset += count
        base = offset - sum(frame_sizes)
        data = build_segment(base, frames)
        facts = describe_object(data, base, offset, interval)
        key = layout.object_key(TOPIC, base, offset)
        entries.append(IndexEntry(base, offset - 1, facts.size, facts.crc32c, key, 0,
                                  facts.offset_index))  # fmt: skip
        objects[key] = data
        scan = format.scan_segment(data)
        ends = [*scan.positions[1:], len(data)]
        largest = max(largest, *(e - p for p, e in zip(scan.positions, ends, strict=True)))
    wal_first = draw(st.integers(0, offset + 3))
    wal_end = wal_first + draw(st.integers(0, 6))
    return Layout(entries, objects, wal_first, wal_end, interval, largest, records)


def fetch(plan: ObjectRead, where: Layout) -> tuple[bytes, ...]:
    return decode_object_read(plan, where.objects[plan.key][plan.start_byte : plan.end_byte])


@settings(deadline=None, max_examples=150)
@given(where=layouts(), max_records=st.integers(1, 5), max_bytes=st.integers(0, 120))
def test_a_reader_walking_from_zero_gets_every_servable_offset_once_in_order(
    where: Layout, max_records: int, max_bytes: int
) -> None:
    served: list[int] = []
    offset = 0
    while offset < where.wal_end:
        plan = plan_read(where.entries, where.wal_first, offset, max_records, max_bytes)
        match plan:
            case ObjectRead():
                assert plan.from_offset == offset < plan.end_offset <= offset + max_records
                assert plan.end_offset <= where.wal_first, "an object served a WAL offset"
                assert plan.end_byte - plan.start_byte < max(max_bytes, 1) + where.interval + (
                    where.largest_frame
                )
                records = fetch(plan, where)
                assert records == tuple(where.records[o] for o in range(offset, plan.end_offset))
                served += range(offset, plan.end_offset)
                offset = plan.end_offset
            case LocalRead(from_offset=start):
                assert start == offset >= where.wal_first
                count = min(max_records, where.wal_end - offset)  # what the WAL would serve
                served += range(offset, offset + count)
                offset += count
            case NotAvailable(first_offset=next_served):
                assert next_served > offset
                assert all(where.tier(o) is None for o in range(offset, next_served))
                offset = next_served
    assert served == [o for o in range(where.wal_end) if where.tier(o) is not None]


@settings(deadline=None, max_examples=100)
@given(where=layouts())
def test_every_offset_is_served_by_exactly_one_tier(where: Layout) -> None:
    for offset in range(where.wal_end + 2):
        plan = plan_read(where.entries, where.wal_first, offset, 1, 1 << 20)
        tier = where.tier(offset)
        if offset >= where.wal_first:
            assert plan == LocalRead(offset)
        elif tier == "object":
            assert isinstance(plan, ObjectRead) and plan.end_offset == offset + 1
            assert fetch(plan, where) == (where.records[offset],)
        else:
            assert isinstance(plan, NotAvailable)


def test_handoff_at_the_wal_first_offset() -> None:
    frames = [[record(o)] for o in range(10, 20)]
    data = build_segment(10, frames)
    facts = describe_object(data, 10, 20, 0)
    key = layout.object_key(TOPIC, 10, 20)
    entry = IndexEntry(10, 19, facts.size, facts.crc32c, key, 0, facts.offset_index)
    plan = plan_read([entry], 15, 12, 100, 1 << 20)
    assert isinstance(plan, ObjectRead) and (plan.from_offset, plan.end_offset) == (12, 15)
    assert plan.start_byte == dict(facts.offset_index)[12]
    assert plan.end_byte == dict(facts.offset_index)[15]
    assert decode_object_read(plan, data[plan.start_byte : plan.end_byte]) == tuple(
        record(o) for o in (12, 13, 14)
    )
    assert plan_read([entry], 15, 15, 100, 1 << 20) == LocalRead(15)
    assert plan_read([entry], 15, 3, 100, 1 << 20) == NotAvailable(10)
    assert plan_read([], 7, 3, 100, 1 << 20) == NotAvailable(7)
    with pytest.raises(ValueError, match="max_records"):
        plan_read([entry], 15, 12, 0, 100)


def test_a_damaged_object_is_reported_with_its_key() -> None:
    data = build_segment(0, [[record(0), record(1)], [record(2)]])
    facts = describe_object(data, 0, 3, 0)
    key = layout.object_key(TOPIC, 0, 3)
    entry = IndexEntry(0, 2, facts.size, facts.crc32c, key, 0, facts.offset_index)
    plan = plan_read([entry], 3, 0, 10, 1 << 20)
    assert isinstance(plan, ObjectRead)
    damaged = bytearray(data[plan.start_byte : plan.end_byte])
    damaged[-1] ^= 0xFF
    with pytest.raises(format.WalFormatError, match=f"object {key}: .* is damaged"):
        decode_object_read(plan, bytes(damaged))
