"""The values of replication (spec/replication.md): the messages owner and followers exchange
and the effects the two machines return for their driver to carry out.

Offsets are record offsets of the topic's WAL. An *end* is exclusive: the offset after the last
record held (a log holding offsets 0..9 has end 10), so an empty log has end 0 and every
comparison of two logs is a comparison of two ends. `AcknowledgeUpTo(end)` therefore
acknowledges offsets < end (the WAL machine's `Acknowledge.through_offset` is `end - 1`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# -- messages between brokers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replicate:
    """Owner → follower: one group commit's frames, unchanged, starting at offset `prev_end`.
    `record_count` records end at `prev_end + record_count`. `commit` is the owner's high
    watermark when sent (what the follower may consider acknowledged). An empty `frames` with
    `record_count` 0 is a probe: it tells a follower the epoch and asks for its end."""

    topic: str
    epoch: int
    prev_end: int
    frames: bytes
    record_count: int
    commit: int

    @property
    def end(self) -> int:
        return self.prev_end + self.record_count


@dataclass(frozen=True, slots=True)
class Replicated:
    """Follower → owner: the follower holds offsets < `end` durably, written under `epoch`."""

    topic: str
    epoch: int
    end: int


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Follower → owner: a `Replicate` did not start at the follower's log end, which is
    `end`; the owner resends from there."""

    topic: str
    epoch: int
    end: int


@dataclass(frozen=True, slots=True)
class StaleEpoch:
    """Follower → owner: refused, the follower has seen `epoch`, higher than the sender's:
    the sender was deposed."""

    topic: str
    epoch: int


FollowerAnswer = Replicated | Mismatch | StaleEpoch


# -- effects of the owner's machine ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send `message` to `follower` on the replication stream (in order, per follower)."""

    follower: str
    message: Replicate


@dataclass(frozen=True, slots=True)
class ProposeInSync:
    """Write the topic's replicas value with `in_sync` as its in-sync set, in an etcd
    transaction that compares the owner's claim for `epoch` and the replicas value's version
    with `expected_version`. The driver calls `replicas_seen` with the value written when it
    committed, else (refused, answer lost) with the value read back."""

    topic: str
    epoch: int
    in_sync: tuple[str, ...]
    expected_version: int


@dataclass(frozen=True, slots=True)
class AcknowledgeUpTo:
    """Reply success to every append whose records all lie below `end`."""

    end: int


@dataclass(frozen=True, slots=True)
class ReadableUpTo:
    """Dispatch may deliver offsets < `end`."""

    end: int


@dataclass(frozen=True, slots=True)
class ReadForResend:
    """The owner's window of recent frames no longer holds offset `from_offset`: read frames
    from `from_offset` on from the WAL (or the object tier), whole records, as many as the
    driver likes up to the owner's durable end (a bounded chunk is fine: the machine asks for
    the rest as the follower acknowledges), and call
    `frames_read(follower, from_offset, frames, end, now_ms)`."""

    follower: str
    from_offset: int


@dataclass(frozen=True, slots=True)
class NotEnoughInSync:
    """Fewer than `min_in_sync` replicas (the owner counts) are in sync: the appends with
    offsets in [`from_offset`, `end`) are not acknowledged; refuse them with `UNAVAILABLE`.
    Their records stay in the log (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""

    topic: str
    from_offset: int
    end: int


@dataclass(frozen=True, slots=True)
class Deposed:
    """A higher epoch than this owner's exists: stop serving the topic (acknowledge nothing,
    upload nothing) and reply an error to whatever waits."""

    topic: str
    epoch: int


OwnerEffect = (
    Send
    | ProposeInSync
    | AcknowledgeUpTo
    | ReadableUpTo
    | ReadForResend
    | NotEnoughInSync
    | Deposed
)


# -- effects of a follower's machine --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendFrames:
    """Append `frames` (records `prev_end` .. `end` - 1) to the follower's WAL through its own
    WAL machine; once durable at the topic's level, call `appended_durable(end)`."""

    frames: bytes
    prev_end: int
    end: int


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Cut the follower's WAL to offsets < `end` (durably) before anything else is appended."""

    end: int


@dataclass(frozen=True, slots=True)
class RecordEpoch:
    """Persist, durably and before sending any later answer, that this follower has seen
    `epoch` (and, when `start` is set, that this epoch's records start at `start`). A follower
    that forgot a higher epoch after a crash would accept a deposed owner's frames again."""

    epoch: int
    start: int | None


@dataclass(frozen=True, slots=True)
class Reconcile:
    """The follower saw `epoch` for the first time: ask its owner where `last_epoch` (the
    epoch of the follower's last records) ends on the owner's log, then call
    `new_epoch(epoch, that_end)` (truncation by epoch, KIP-101)."""

    topic: str
    epoch: int
    last_epoch: int


FollowerEffect = AppendFrames | TruncateTo | RecordEpoch | Reconcile | FollowerAnswer


def end_of_epoch(epoch_starts: Sequence[tuple[int, int]], epoch: int, log_end: int) -> int:
    """Where `epoch`'s records end on a log whose epochs start at `epoch_starts` (sorted
    `(epoch, first offset)` pairs) and which ends at `log_end`: the start of the first later
    epoch, or the log end when none is later. The owner answers a `Reconcile` with it."""
    for other, start in epoch_starts:
        if other > epoch:
            return min(start, log_end)
    return log_end
