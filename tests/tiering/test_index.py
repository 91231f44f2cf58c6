"""The object index and layout (spec/object-layout.md): entry JSON round trips and shape
errors, every invariant `validate_index` names, `describe_object` on real segment bytes, and
the deterministic names of objects and entries."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.kernels.twins import crc32c_py
from danube.machines.tiering import layout
from danube.machines.tiering.index import (
    IndexEntry,
    IndexFormatError,
    describe_object,
    entry_problems,
    sparse_offset_index,
    validate_index,
)
from danube.machines.wal import format
from tests.tiering.segments import TOPIC, build_segment, record


def entry(start: int, end: int, **changes: Any) -> IndexEntry:
    base = IndexEntry(
        start, end, 500, 7, layout.object_key(TOPIC, start, end + 1), 1, ((start, 56),)
    )
    return replace(base, **changes)


entries = st.builds(
    IndexEntry,
    start_offset=st.integers(0, 1 << 63),
    end_offset=st.integers(0, 1 << 63),
    size=st.integers(0, 1 << 40),
    crc32c=st.integers(0, (1 << 32) - 1),
    key=st.text(),
    created_ms=st.integers(0, 1 << 50),
    offset_index=st.lists(st.tuples(st.integers(0, 1 << 63), st.integers(0, 1 << 40))).map(tuple),
)


# -- JSON -------------------------------------------------------------------------------------


@given(entries)
def test_json_round_trip(value: IndexEntry) -> None:
    assert IndexEntry.from_json(value.to_json()) == value


def test_json_shape() -> None:
    assert entry(10, 19).to_json() == {
        "start_offset": 10,
        "end_offset": 19,
        "size": 500,
        "crc32c": 7,
        "key": "storage/topics/default/tiered/segments/"
        "00000000000000000010-00000000000000000020.wal",
        "created_ms": 1,
        "offset_index": [[10, 56]],
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda j: j.pop("crc32c"), "lacks crc32c"),
        (lambda j: j.update(size=True), "size must be an integer"),
        (lambda j: j.update(end_offset="19"), "end_offset must be an integer"),
        (lambda j: j.update(key=3), "key must be a string"),
        (lambda j: j.update(offset_index=[[10]]), r"\[\[offset, byte\], ...\]"),
        (lambda j: j.update(offset_index=[[10, 5.5]]), r"\[\[offset, byte\], ...\]"),
        (lambda j: j.update(offset_index={"10": 56}), r"\[\[offset, byte\], ...\]"),
    ],
)
def test_json_shape_errors(change: Any, message: str) -> None:
    value = entry(10, 19).to_json()
    change(value)
    with pytest.raises(IndexFormatError, match=message):
        IndexEntry.from_json(value)


def test_json_not_an_object_and_unknown_fields() -> None:
    with pytest.raises(IndexFormatError, match="must be a JSON object"):
        IndexEntry.from_json([1, 2])
    value = entry(10, 19).to_json() | {"etag": "abc", "completed": True}
    assert IndexEntry.from_json(value) == entry(10, 19)


# -- invariants -------------------------------------------------------------------------------


def test_a_sound_index_has_no_problems() -> None:
    assert validate_index([]) == []
    assert validate_index([entry(0, 9), entry(10, 10), entry(11, 40)]) == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (entry(10, 9), "offsets 10–9 are empty"),
        (entry(10, 19, crc32c=1 << 32), "not a 32-bit value"),
        (entry(10, 19, key="x/00000000000000000010-00000000000000000021.wal"), "does not name"),
        (entry(10, 19, offset_index=()), "offset_index is empty"),
        (entry(10, 19, offset_index=((11, 56),)), "starts at offset 11"),
        (entry(10, 19, offset_index=((10, 8),)), "inside the header"),
        (entry(10, 19, offset_index=((10, 56), (12, 56))), "not strictly increasing"),
        (entry(10, 19, offset_index=((10, 56), (10, 99))), "not strictly increasing"),
        (entry(10, 19, offset_index=((10, 56), (20, 99))), "offset 20 past the end"),
        (entry(10, 19, offset_index=((10, 56), (12, 470))), "byte 470 past the last frame"),
    ],
)
def test_each_broken_entry_is_named(bad: IndexEntry, message: str) -> None:
    assert entry_problems(entry(10, 19)) == []
    problems = validate_index([bad])
    assert problems and message in problems[0]


def test_gaps_overlaps_and_disorder_are_named_all_at_once() -> None:
    problems = validate_index([entry(0, 9), entry(12, 19), entry(15, 30), entry(0, 3)])
    assert problems == [
        "index entry 00000000000000000012 does not continue the previous one (which ends at "
        "9): offsets 10–11 are missing",
        "index entry 00000000000000000015 does not continue the previous one (which ends at "
        "19): offsets 15–19 are in two entries",
        "index entry 00000000000000000000 does not continue the previous one (which ends at "
        "30): offsets 0–30 are in two entries",
    ]


# -- facts from bytes -------------------------------------------------------------------------


def frames_strategy() -> st.SearchStrategy[list[list[bytes]]]:
    return st.lists(st.lists(st.binary(max_size=30), min_size=1, max_size=4), min_size=1)


@settings(deadline=None)  # the first call loads the numba kernels
@given(frames=frames_strategy(), base=st.integers(0, 1 << 40), interval=st.integers(0, 200))
def test_describe_object_reports_the_bytes_and_a_sparse_index(
    frames: list[list[bytes]], base: int, interval: int
) -> None:
    data = build_segment(base, frames)
    next_offset = base + sum(len(f) for f in frames)
    facts = describe_object(data, base, next_offset, interval)
    assert facts.size == len(data) and facts.crc32c == crc32c_py(data)
    scan = format.scan_segment(data)
    everything = list(zip(scan.base_offsets, scan.positions, strict=True))
    assert facts.offset_index[0] == everything[0]
    assert set(facts.offset_index) <= set(everything)
    kept = [position for _, position in facts.offset_index]
    for position in scan.positions:  # every frame within `interval` bytes after a kept one
        assert position - max(k for k in kept if k <= position) < max(interval, 1)
    assert entry_problems(
        IndexEntry(base, next_offset - 1, facts.size, facts.crc32c, "a/" +
                   layout.object_name(base, next_offset), 0, facts.offset_index)
    ) == []  # fmt: skip


def test_sparse_index_keeps_a_frame_once_the_interval_has_passed() -> None:
    positions, bases = [40, 60, 90, 100, 150], [0, 2, 3, 5, 9]
    assert sparse_offset_index(positions, bases, 50) == ((0, 40), (3, 90), (9, 150))
    assert sparse_offset_index(positions, bases, 0) == tuple(zip(bases, positions, strict=True))


def test_describe_object_refuses_damaged_or_mismatched_segments() -> None:
    data = build_segment(100, [[record(100), record(101)], [record(102)]])
    assert describe_object(data, 100, 103, 0).size == len(data)
    flipped = bytearray(data)
    flipped[-2] ^= 1
    with pytest.raises(format.WalFormatError, match="does not verify"):
        describe_object(bytes(flipped), 100, 103, 0)
    with pytest.raises(format.WalFormatError, match="does not verify"):
        describe_object(data[:-1], 100, 103, 0)
    with pytest.raises(format.WalFormatError, match="holds offsets 100–102, not offsets 100–103"):
        describe_object(data, 100, 104, 0)
    header_only = build_segment(100, [])
    with pytest.raises(format.WalFormatError, match="holds no frame"):
        describe_object(header_only, 100, 103, 0)


# -- names ------------------------------------------------------------------------------------


@given(
    start=st.integers(0, 10**20 - 1),
    end=st.integers(0, 10**20 - 1),
    epoch=st.integers(0, 10**20 - 1),
)
def test_object_keys_parse_back(start: int, end: int, epoch: int) -> None:
    key = layout.object_key(TOPIC, start, end, epoch)
    assert layout.parse_object_key(TOPIC, key) == (start, end)
    assert layout.index_start(layout.index_path(TOPIC, start)) == start


def test_writers_of_one_range_get_keys_of_their_own() -> None:
    keys = {layout.object_key(TOPIC, 10, 20, epoch) for epoch in (0, 1, 7)}
    assert len(keys) == 3
    assert layout.object_key(TOPIC, 10, 20).endswith(
        "/00000000000000000010-00000000000000000020.wal"
    ), "standalone (epoch 0) keeps the names of earlier releases"


@pytest.mark.parametrize(
    "key",
    [
        "storage/topics/default/tiered/segments/00000000000000000001.wal",
        "storage/topics/default/tiered/segments/0000000000000000000a-00000000000000000002.wal",
        "storage/topics/default/tiered/segments/00000000000000000001-00000000000000000002.tmp",
        "storage/topics/default/tiered2/segments/00000000000000000001-00000000000000000002.wal",
        "storage/topics/default/tiered/segments/x/00000000000000000001-00000000000000000002.wal",
        "storage/topics/default/tiered/segments/00000000000000000001-00000000000000000002-"
        "00000000000000000000.wal",
        "storage/topics/default/tiered/segments/00000000000000000001-00000000000000000002-"
        "00000000000000000003-00000000000000000004.wal",
    ],
)
def test_foreign_keys_do_not_parse(key: str) -> None:
    assert layout.parse_object_key(TOPIC, key) is None


def test_the_current_pointer_is_not_an_entry() -> None:
    assert layout.index_start(layout.current_path(TOPIC)) is None
    assert layout.current_path(TOPIC).startswith(layout.index_prefix(TOPIC))
