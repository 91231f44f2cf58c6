"""`WalMachine.append_frames`: a follower stores the owner's frames unchanged, verified first,
and serves and recovers them like its own (spec/replication.md, "Data path")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.wal import format
from danube.machines.wal.machine import Acknowledge, Durability, WalConfig, WalMachine, Write
from danube.values.errors import DanubeError, ErrorCode

TOPIC = "/default/r"


def run(machine: WalMachine, effects: list, written: bytearray) -> list:
    """Carries file effects out at once; returns the non-file effects."""
    out = []
    work = list(effects)
    while work:
        effect = work.pop(0)
        if isinstance(effect, Write):
            written += effect.data
            work += machine.write_done(effect.write_id, 0)
        elif type(effect).__name__ == "Fsync":
            work += machine.fsync_done(effect.fsync_id, 0)
        elif type(effect).__name__ in ("CreateSegment", "CloseSegment", "DeleteSegment"):
            continue
        else:
            out.append(effect)
    return out


def owner_frames(batches: list[list[bytes]]) -> tuple[bytes, int]:
    """What an owner's WAL writes for these appends: (frames, end)."""
    owner = WalMachine(TOPIC, WalConfig(durability=Durability.FSYNC))
    written = bytearray()
    for batch in batches:
        _, effects = owner.append(batch, 0)
        run(owner, effects, written)
    return bytes(written), owner.next_offset


records = st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(st.lists(records, min_size=1, max_size=6))
def test_the_follower_writes_the_owners_bytes_and_reads_the_records(
    batches: list[list[bytes]],
) -> None:
    frames, end = owner_frames(batches)
    follower = WalMachine(TOPIC, WalConfig(durability=Durability.FSYNC))
    written = bytearray()
    appended_end, effects = follower.append_frames(frames, 0)
    out = run(follower, effects, written)
    assert appended_end == end
    assert bytes(written) == frames
    assert Acknowledge(end - 1) in out
    result = follower.read(0, 1000, 1 << 20)
    assert list(result.records) == [r for batch in batches for r in batch]


def test_frames_that_do_not_verify_are_refused_and_change_nothing() -> None:
    frames, _ = owner_frames([[b"a", b"b"], [b"c"]])
    follower = WalMachine(TOPIC, WalConfig())
    damaged = bytearray(frames)
    damaged[-1] ^= 0x01
    with pytest.raises(DanubeError) as refused:
        follower.append_frames(bytes(damaged), 0)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert follower.next_offset == 0 and follower.queued_bytes == 0


def test_frames_at_the_wrong_offset_are_refused() -> None:
    frames, end = owner_frames([[b"a"], [b"b"]])
    follower = WalMachine(TOPIC, WalConfig())
    first = format.encode_frame(0, 0, [b"x"])
    follower.append_frames(first, 0)
    with pytest.raises(DanubeError, match="expected offsets from 1"):
        follower.append_frames(frames, 0)  # starts at 0 again
    assert follower.next_offset == 1
    assert end == 2
