"""A follower's copy of one topic's log (spec/replication.md, "Data path" and
"Reconciliation"), as a pure machine: `Replicate` messages in, WAL appends and truncations and
the answers for the owner out.

Fencing lives here: the follower remembers (durably, `RecordEpoch`) the highest epoch it has
seen and refuses anything from a lower one, so a deposed owner can never count this follower
towards an acknowledgement. A new epoch is accepted only after reconciliation by epoch
(KIP-101): the follower asks the new owner where the epoch of its last records ends on the
owner's log and cuts its log there, not at a high watermark, which can be stale.

| state | input | next | effects |
|---|---|---|---|
| IN_EPOCH | `replicate`, lower epoch | IN_EPOCH | `StaleEpoch(epoch)` |
| IN_EPOCH | `replicate`, same epoch, `prev_end` ≠ log end | IN_EPOCH | `Mismatch(log end)` |
| IN_EPOCH | `replicate`, same epoch, `prev_end` = log end, frames | IN_EPOCH | `AppendFrames` |
| IN_EPOCH | `replicate`, same epoch, probe at log end | IN_EPOCH | `Replicated(durable end)` |
| any | `replicate`, higher epoch | RECONCILING | `RecordEpoch(epoch)`, `Reconcile` |
| RECONCILING | `replicate`, same epoch | RECONCILING | `Reconcile` again (not appended) |
| RECONCILING | `replicate`, lower epoch | RECONCILING | `StaleEpoch(epoch)` |
| any | `new_epoch(epoch ≥ seen, end)` | IN_EPOCH | `TruncateTo(end)` if longer, |
|  |  |  | `RecordEpoch(epoch, start)`, `Mismatch(log end)` |
| any | `appended_durable(end)` | same | `Replicated(end)` if all appended in this epoch |
| any | `append_refused(end, log end)` | same | `Mismatch(log end)` (frames did not verify) |

A crash loses what was appended but not durable: the driver builds the machine again with
`FollowerLog.recovered` from the WAL's durable end and the recorded epochs.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable

from danube.machines.replication.messages import (
    AppendFrames,
    FollowerEffect,
    Mismatch,
    Reconcile,
    RecordEpoch,
    Replicate,
    Replicated,
    StaleEpoch,
    TruncateTo,
)


class FollowerState(enum.Enum):
    IN_EPOCH = "in_epoch"
    """Reconciled with the owner of `epoch`: appends its frames."""
    RECONCILING = "reconciling"
    """Saw `epoch` but has not cut its log for it yet: appends nothing."""


class FollowerLog:
    """One topic's replicated log on a follower."""

    def __init__(
        self,
        topic: str,
        *,
        epoch: int,
        log_end: int,
        epoch_starts: Iterable[tuple[int, int]] = (),
        reconciled: bool = True,
    ) -> None:
        self.topic = topic
        self.epoch = epoch
        self.log_end = log_end
        self.durable_end = log_end
        self.epoch_starts = list(epoch_starts)
        self.state = FollowerState.IN_EPOCH if reconciled else FollowerState.RECONCILING
        self._appends: deque[tuple[int, int]] = deque()
        """`(end, epoch)` of appends not yet durable."""

    @classmethod
    def recovered(
        cls,
        topic: str,
        *,
        epoch: int,
        durable_end: int,
        epoch_starts: Iterable[tuple[int, int]],
    ) -> FollowerLog:
        """After a crash: the WAL's durable end and the epochs recorded (`RecordEpoch`). A
        recorded epoch without a start was seen but not reconciled: reconcile again."""
        starts = list(epoch_starts)
        reconciled = any(e == epoch for e, _ in starts) or (not starts and epoch == 0)
        return cls(
            topic, epoch=epoch, log_end=durable_end, epoch_starts=starts, reconciled=reconciled
        )

    @property
    def last_epoch(self) -> int:
        """The epoch of the last records held (0 when none is recorded)."""
        for epoch, start in reversed(self.epoch_starts):
            if start < self.log_end:
                return epoch
        return 0

    def replicate(self, msg: Replicate) -> list[FollowerEffect]:
        if msg.epoch < self.epoch:
            return [StaleEpoch(self.topic, self.epoch)]
        if msg.epoch > self.epoch:
            self.epoch = msg.epoch
            self.state = FollowerState.RECONCILING
            return [
                RecordEpoch(msg.epoch, None),
                Reconcile(self.topic, msg.epoch, self.last_epoch),
            ]
        if self.state is FollowerState.RECONCILING:
            # Still waiting for the owner's answer, or it was lost in a crash (recovered
            # RECONCILING): ask again. The driver keeps one question in flight per topic.
            return [Reconcile(self.topic, self.epoch, self.last_epoch)]
        if msg.prev_end != self.log_end:
            return [Mismatch(self.topic, self.epoch, self.log_end)]
        if msg.record_count == 0:
            if self.durable_end == self.log_end:
                return [Replicated(self.topic, self.epoch, self.durable_end)]
            return []
        self.log_end = msg.end
        self._appends.append((msg.end, self.epoch))
        return [AppendFrames(msg.frames, msg.prev_end, msg.end)]

    def new_epoch(self, epoch: int, owner_end: int) -> list[FollowerEffect]:
        """The owner of `epoch` says the epoch of this follower's last records ends at
        `owner_end` on its log: cut anything beyond it, then ask for the rest."""
        if epoch < self.epoch:
            return []
        self.epoch = epoch
        self.state = FollowerState.IN_EPOCH
        out: list[FollowerEffect] = []
        if owner_end < self.log_end:
            self.log_end = owner_end
            self.durable_end = min(self.durable_end, owner_end)
            self._appends = deque((e, ep) for e, ep in self._appends if e <= owner_end)
            self.epoch_starts = [(e, s) for e, s in self.epoch_starts if s < owner_end]
            out.append(TruncateTo(owner_end))
        if not self.epoch_starts or self.epoch_starts[-1][0] != epoch:
            self.epoch_starts.append((epoch, self.log_end))
        out.append(RecordEpoch(epoch, self.log_end))
        out.append(Mismatch(self.topic, epoch, self.log_end))
        return out

    def append_refused(self, end: int, log_end: int) -> list[FollowerEffect]:
        """The WAL refused the `AppendFrames` ending at `end` (its frames did not verify):
        nothing of it is stored, the log ends at `log_end`, and the owner is told so."""
        self._appends = deque((e, ep) for e, ep in self._appends if e != end)
        self.log_end = log_end
        return [Mismatch(self.topic, self.epoch, log_end)]

    def appended_durable(self, end: int) -> list[FollowerEffect]:
        """The WAL made offsets < `end` durable. Acknowledged to the owner only if written
        under the epoch this follower is in: once it has seen a higher epoch, an older
        owner's frames must not count for that (deposed) owner's acknowledgements."""
        end = min(end, self.log_end)
        if end <= self.durable_end:
            return []
        self.durable_end = end
        epochs = set()
        while self._appends and self._appends[0][0] <= end:
            epochs.add(self._appends.popleft()[1])
        if self.state is not FollowerState.IN_EPOCH or epochs - {self.epoch}:
            return []
        return [Replicated(self.topic, self.epoch, end)]
