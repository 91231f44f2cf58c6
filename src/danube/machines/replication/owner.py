"""The owner's side of replication for one topic (spec/replication.md, "Data path" and
"In-sync set changes"), as a pure machine: the driver reports local group commits, follower
answers, broken streams, ticks and the replicas value it reads from etcd; the machine returns
`Send`s, in-sync proposals and `AcknowledgeUpTo` / `ReadableUpTo` up to the high watermark.

Frames go out when the owner's WAL writes them (`written`), before its fsync, so owner and
followers fsync at the same time; the owner's own copy counts once `durable` says so. The
high watermark is the minimum of the owner's durable end and the acknowledged end of every
follower in the in-sync set *as recorded in etcd* (`replicas_seen`) or in the outstanding
proposal, never less than before. Because a shrink only counts once it is seen committed and an
expand counts from the moment it is proposed, nothing is acknowledged with less redundancy
than etcd records, whatever the transaction's fate.

Each follower is, for this machine, in one of these states (`Link.state`), orthogonal to its
membership of the recorded in-sync set:

| state | input | next | effects |
|---|---|---|---|
| STREAMING | `written`, < `max_in_flight` unacked | STREAMING | `Send(Replicate)`, pipelined |
| any | `durable` | same | high watermark (never past the owner's durable end) |
| STREAMING | `replicated(end)` | STREAMING | high watermark, maybe `ProposeInSync` (expand), |
|  |  |  | and `Send`s it was held back from by `max_in_flight` |
| any | `mismatch(end)`, from in window | STREAMING | `Send` from `end` to durable end |
| any | `mismatch(end)`, at durable end or held back | STREAMING | `Send` of a probe at `end` |
| any | `mismatch(end)`, before window | READING | `ReadForResend(end)` |
| READING | `frames_read` | STREAMING | `Send` of what was read, then the window's rest |
| READING | `resend_unavailable(first)` | STREAMING | a probe (where is the follower?) |
| any | `mismatch(end)` below that `first` | behind | nothing sent; it leaves in-sync |
| any | `stream_broke` | as `mismatch(acknowledged end)` | resend on the new stream |
| any | `tick`, in sync, oldest unacked send > `lag_ms` old | same | `ProposeInSync` without it |
| (none) | `tick`, recorded in sync but no longer a follower | — | `ProposeInSync` without it |
| any | `stale_epoch` / higher epoch seen | (owner DEPOSED) | `Deposed`; nothing after |

One proposal is outstanding at a time; `replicas_seen` (the watch or the read-back after the
transaction) adopts the recorded set and version and clears it once the version moved past
the one the proposal compared. The same version seen again (the watch's late copy of it, or a
read-back before the transaction landed, or one whose compare failed on the claim) says
nothing of the proposal, which may still land: it stays outstanding, its members keep
counting, and a `tick` proposes it again (the copy that lands second fails its compare).
Clearing it there let the high watermark pass an expand's member that then landed in the
set without the records just acknowledged (`python -m sim --cluster --replicated --profile
peers --seed 149`). The same holds when the driver loses the proposal (`proposal_lost`).
A catching-up follower is proposed for the in-sync set once its acknowledged end reaches the
owner's durable end.

Resending: the machine keeps a bounded window (`window_bytes`) of the most recent group
commits' frames, the ones a pipelined stream may still need after a break, so the common case
(a stream broke, its last sends are lost) resends from memory without touching the disk; a
follower further behind (a restart, a new follower) is caught up from the WAL through
`ReadForResend`, which the driver serves as a sequential read, with no cache to size for it.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from danube.machines.replication.messages import (
    AcknowledgeUpTo,
    Deposed,
    Mismatch,
    NotEnoughInSync,
    OwnerEffect,
    ProposeInSync,
    ReadableUpTo,
    ReadForResend,
    Replicate,
    Replicated,
    Send,
    StaleEpoch,
)


class LinkState(enum.Enum):
    STREAMING = "streaming"
    """Everything up to `sent_end` is on the stream; new commits are sent as they come."""
    READING = "reading"
    """Waiting for the driver's `frames_read` to resend from before the window."""


@dataclass(slots=True)
class Link:
    """What the owner knows of one follower."""

    sent_end: int
    acked_end: int = 0
    last_heard_ms: int = 0
    state: LinkState = LinkState.STREAMING
    resend_from: int | None = None
    """Where the last resend started: a repeated `Mismatch` with this end is a stale answer
    to the old pipeline, not a new gap, and is ignored."""
    sends: deque[tuple[int, int]] = field(default_factory=deque)
    """`(end, first sent at)` of sends not yet acknowledged, oldest first (the lag clock)."""
    floor: int | None = None
    """The owner's WAL holds nothing below this (`resend_unavailable`): a follower whose
    log ends below cannot be caught up here."""
    behind: bool = False
    """The follower ends below `floor`: nothing is sent to it, and it leaves the in-sync set."""
    probed_ms: int = 0
    """When `_probe_overdue` last asked this follower what it holds."""


@dataclass(frozen=True, slots=True)
class _Commit:
    prev_end: int
    end: int
    frames: bytes


class OwnerReplication:
    """Replication state of one topic on its owner, for one epoch."""

    def __init__(
        self,
        topic: str,
        epoch: int,
        *,
        durable_end: int,
        high_watermark: int,
        followers: Iterable[str],
        in_sync: Iterable[str],
        version: int,
        lag_ms: int = 1_000,
        min_in_sync: int = 1,
        window_bytes: int = 8 << 20,
        max_in_flight: int = 1 << 16,
        now_ms: int = 0,
    ) -> None:
        self.topic = topic
        self.epoch = epoch
        self.durable_end = durable_end
        self.written_end = durable_end
        """The end of the frames sent (written or being written locally): ahead of
        `durable_end` by at most the group commit whose fsync is under way."""
        self.high_watermark = min(high_watermark, durable_end)
        self.links = {f: Link(sent_end=durable_end, last_heard_ms=now_ms) for f in followers}
        self.in_sync = frozenset(in_sync)
        self.version = version
        self.lag_ms = lag_ms
        self.min_in_sync = min_in_sync
        self.window_bytes = window_bytes
        self.max_in_flight = max_in_flight
        self.pending: tuple[str, ...] | None = None
        self.retry_pending = False
        """`pending` was seen unresolved (`replicas_seen` at its version, `proposal_lost`):
        the next `tick` proposes it again."""
        self.held_back = False
        """A proposal just failed (the value read back is the version it compared): the
        next waits for a `tick`, so a refusing store is not asked again in a tight loop."""
        self.deposed = False
        self._window: deque[_Commit] = deque()
        self._window_size = 0

    # -- inputs -----------------------------------------------------------------------------------

    def start(self, now_ms: int) -> list[OwnerEffect]:
        """Probe every follower: tells them the epoch (they reconcile) and asks for their end."""
        if self.deposed:
            return []
        return [self._send(f, self.written_end, b"", 0, now_ms) for f in self.links]

    def written(self, end: int, frames: bytes, now_ms: int) -> list[OwnerEffect]:
        """The WAL is writing a group commit: `frames`, offsets [`written_end`, `end`).
        They go to the followers now, so the followers' appends and fsyncs run alongside
        the owner's own fsync instead of after it. Nothing counts for the high watermark
        until `durable` says the owner has them on disk too: a follower may hold frames the
        owner loses in a crash before its fsync, which were never acknowledged (a promoted
        follower keeps them, as in Kafka; one that follows the restarted owner cuts them by
        epoch at reconciliation)."""
        if self.deposed or end <= self.written_end:
            return []
        prev_end, self.written_end = self.written_end, end
        self._remember(_Commit(prev_end, end, frames))
        out: list[OwnerEffect] = []
        for name, link in self.links.items():
            if self._may_send(link) and link.sent_end == prev_end:
                out.append(self._send(name, prev_end, frames, end - prev_end, now_ms))
        return out

    def durable(self, end: int, frames: bytes, now_ms: int) -> list[OwnerEffect]:
        """A local group commit made offsets < `end` durable. `frames`, when not empty,
        are its bytes not yet reported by `written` (a driver that sends after the fsync)."""
        out: list[OwnerEffect] = []
        if end > self.written_end:
            out.extend(self.written(end, frames, now_ms))
        if self.deposed or end <= self.durable_end:
            return out
        prev_end, self.durable_end = self.durable_end, end
        for name, link in self.links.items():
            # A link stalled because what it needs left the window before it was durable
            # (`_send_window_from` reads only durable frames) goes on now.
            if link.sent_end < self.written_end and self._may_send(link):
                out.extend(self._send_window_from(name, link.sent_end, now_ms))
        if self._too_few_in_sync():
            out.append(NotEnoughInSync(self.topic, max(prev_end, self.high_watermark), end))
        out.extend(self._advance())
        return out

    def replicated(self, follower: str, msg: Replicated, now_ms: int) -> list[OwnerEffect]:
        link = self.links.get(follower)
        if self.deposed or link is None or msg.epoch < self.epoch:
            return []
        if msg.epoch > self.epoch:
            return self._depose(msg.epoch)
        link.last_heard_ms = now_ms
        end = min(msg.end, link.sent_end)  # may pass `durable_end`: `_target` caps it
        if end > link.acked_end:
            link.acked_end = end
        while link.sends and link.sends[0][0] <= link.acked_end:
            link.sends.popleft()
        out: list[OwnerEffect] = []
        if self._may_send(link) and link.sent_end < self.written_end:
            out.extend(self._send_window_from(follower, link.sent_end, now_ms))
        return out + self._maybe_expand() + self._advance()

    def mismatch(self, follower: str, msg: Mismatch, now_ms: int) -> list[OwnerEffect]:
        link = self.links.get(follower)
        if self.deposed or link is None or msg.epoch < self.epoch:
            return []
        if msg.epoch > self.epoch:
            return self._depose(msg.epoch)
        link.last_heard_ms = now_ms
        if msg.end == link.resend_from:
            return []
        if link.floor is not None and msg.end < link.floor:
            link.behind = True  # the WAL no longer holds what it lacks: out of sync for good
            link.state = LinkState.STREAMING
            return self.tick(now_ms) if self.pending is None else []
        link.behind = False
        # A follower never durably loses what it acknowledged (its WAL fsyncs first); if it
        # did (a lost disk), believing the lower end is the safe side.
        link.acked_end = min(link.acked_end, msg.end)
        return self._resend(follower, min(msg.end, self.written_end), now_ms)

    def stale_epoch(self, follower: str, msg: StaleEpoch) -> list[OwnerEffect]:
        if self.deposed or msg.epoch <= self.epoch:
            return []
        return self._depose(msg.epoch)

    def stream_broke(self, follower: str, now_ms: int) -> list[OwnerEffect]:
        """The stream to `follower` broke: its unacknowledged sends may be lost. Resend from
        its acknowledged end on the next stream (the driver queues the sends on it)."""
        link = self.links.get(follower)
        if self.deposed or link is None:
            return []
        link.resend_from = None
        return self._resend(follower, link.acked_end, now_ms)

    def frames_read(
        self, follower: str, from_offset: int, frames: bytes, end: int, now_ms: int
    ) -> list[OwnerEffect]:
        """The driver's answer to `ReadForResend`: the frames of offsets [from_offset, end)."""
        link = self.links.get(follower)
        if self.deposed or link is None or link.state is not LinkState.READING:
            return []
        if from_offset != link.sent_end:
            return []
        link.state = LinkState.STREAMING
        out: list[OwnerEffect] = []
        if end > from_offset:
            out.append(self._send(follower, from_offset, frames, end - from_offset, now_ms))
        out.extend(self._send_window_from(follower, link.sent_end, now_ms))
        return out

    def resend_unavailable(
        self, follower: str, first_offset: int, now_ms: int
    ) -> list[OwnerEffect]:
        """The driver's answer to `ReadForResend` when the WAL no longer holds the offset
        asked for (retention, or a log that starts where the object index ends): the
        follower may be further on than the link believed, so a probe asks where it is; one
        that ends below `first_offset` cannot be caught up from here and leaves the in-sync
        set (catching up from objects is not built)."""
        link = self.links.get(follower)
        if self.deposed or link is None or link.state is not LinkState.READING:
            return []
        link.floor = first_offset
        link.state = LinkState.STREAMING
        link.resend_from = None
        link.sends.clear()
        return [self._send(follower, self.written_end, b"", 0, now_ms)]

    def tick(self, now_ms: int) -> list[OwnerEffect]:
        """Shrink the in-sync set by every member whose oldest unacknowledged send is older
        than `lag_ms` (one proposal at a time)."""
        self.held_back = False
        if self.deposed:
            return []
        if self.pending is not None:
            if not self.retry_pending:
                return []
            self.retry_pending = False
            return [ProposeInSync(self.topic, self.epoch, self.pending, self.version)]
        laggards = {
            name
            for name in self.in_sync
            if (link := self.links.get(name)) is None  # no longer a follower (replaced)
            or link.behind
            or (link.sends and now_ms - link.sends[0][1] > self.lag_ms)
        }
        if not laggards:
            return self._probe_overdue(now_ms) + self._maybe_expand()
        return self._propose(tuple(sorted(self.in_sync - laggards)))

    @property
    def next_timer_ms(self) -> int | None:
        """The earliest time at which `tick` has something to do (a lower bound; 0: at the
        next tick), None when only an input can give it work. The broker ticks a replicated
        topic only then or when an input touched it (issue 23 point 4: a failover's new owner
        spent 29 % of its main thread ticking hundreds of topics with nothing due). The
        earliest of: a retried proposal (at once), an in-sync member that is gone or behind
        (at once), one whose oldest unacknowledged send passes `lag_ms`, a catching-up
        follower's probe (`lag_ms` after it was last heard from or probed), a caught-up
        follower not proposed yet (at once)."""
        if self.deposed:
            return None
        if self.pending is not None:
            return 0 if self.retry_pending else None
        due: int | None = None
        lag = self.lag_ms
        for name in self.in_sync:
            link = self.links.get(name)
            if link is None or link.behind:
                return 0
            if link.sends:
                at = link.sends[0][1] + lag + 1  # `tick`: older than `lag_ms`
                if due is None or at < due:
                    due = at
        durable = self.durable_end
        for name, link in self.links.items():
            if name in self.in_sync:
                continue
            if link.acked_end >= durable:
                return 0  # `_maybe_expand` proposes it
            if link.state is LinkState.STREAMING and not link.behind:
                at = max(link.last_heard_ms, link.probed_ms) + lag + 1
                if due is None or at < due:
                    due = at
        return due

    def _probe_overdue(self, now_ms: int) -> list[OwnerEffect]:
        """A catching-up follower that has not acknowledged everything durable here and
        was not heard from (nor probed) for `lag_ms` is asked again what it holds (an empty
        `Replicate` at what was sent). Its answers may all have been withheld: a follower
        does not acknowledge a durable append of an older epoch's frames
        (`FollowerLog.appended_durable`), and an empty probe that finds its append not yet
        durable gets no answer; with the topic idle nothing new would ever make it answer,
        and it would stay out of sync for good (replication model seeds 1802, 2387)."""
        out: list[OwnerEffect] = []
        for name, link in self.links.items():
            if (
                name not in self.in_sync
                and link.state is LinkState.STREAMING
                and not link.behind
                and link.acked_end < self.durable_end
                and now_ms - max(link.last_heard_ms, link.probed_ms) > self.lag_ms
            ):
                link.probed_ms = now_ms
                out.append(self._send(name, link.sent_end, b"", 0, now_ms))
        return out

    def proposal_lost(self) -> list[OwnerEffect]:
        """The driver could neither write nor read back the outstanding proposal (the store
        did not answer). It may still land, so it stays outstanding (its members keep
        counting) and the next `tick` proposes it again."""
        if self.pending is not None:
            self.retry_pending = True  # it may still land: its members keep counting
        return []

    def replicas_seen(
        self, in_sync: Iterable[str], version: int, epoch: int, *, claim_gone: int | None = None
    ) -> list[OwnerEffect]:
        """The topic's replicas value as read from etcd (watch or read-back). `claim_gone`:
        the read-back of a proposal under that epoch refused for its claim compare. This
        owner then stops as it does for a higher epoch: whoever holds the claim now, none
        of its writes can land, and proposing again looped on the store until it heard."""
        if self.deposed:
            return []
        if epoch > self.epoch:
            return self._depose(epoch)
        if claim_gone == self.epoch:
            return self._depose(self.epoch)
        unresolved = self.pending is not None and version <= self.version
        if version >= self.version:
            self.in_sync = frozenset(in_sync)
            self.version = version
        if unresolved:
            self.retry_pending = True
            return self._advance()
        self.pending = None
        self.retry_pending = False
        return self._maybe_expand() + self._advance()

    # -- decisions --------------------------------------------------------------------------------

    def _may_send(self, link: Link) -> bool:
        if link.behind:
            return False
        """Streaming and under the in-flight limit: a dead or slow follower holds at most
        `max_in_flight` records of sends (and of the driver's stream buffers); the rest is sent
        as it acknowledges, from the window or the WAL."""
        return (
            link.state is LinkState.STREAMING
            and link.sent_end - link.acked_end < self.max_in_flight
        )

    def _too_few_in_sync(self) -> bool:
        return 1 + len(self.in_sync) < self.min_in_sync

    def _target(self) -> int:
        """The high watermark the recorded in-sync set allows now: never beyond the owner's
        own durable end, whatever the followers acknowledged (frames are sent as they are
        written, so followers may have them on disk before the owner does)."""
        if self._too_few_in_sync():
            return self.high_watermark
        end = self.durable_end
        for name in self._counted():
            link = self.links.get(name)
            end = min(end, link.acked_end if link is not None else 0)
        return end

    def _counted(self) -> frozenset[str]:
        """The followers the high watermark waits for: the recorded in-sync set and, while a
        proposal is outstanding, its members too. A shrink must not count before it is seen
        committed (the recorded set still has the laggard); an expand must count from the
        moment it is proposed, because etcd may record it before this owner hears back, and
        from then on the new member may be promoted: it must hold everything acknowledged."""
        return self.in_sync | frozenset(self.pending or ())

    def _advance(self) -> list[OwnerEffect]:
        target = self._target()
        if target <= self.high_watermark:
            return []
        self.high_watermark = target
        return [AcknowledgeUpTo(target), ReadableUpTo(target)]

    def _maybe_expand(self) -> list[OwnerEffect]:
        if self.pending is not None or self.held_back:
            return []
        caught_up = [
            name
            for name, link in self.links.items()
            if name not in self.in_sync and link.acked_end >= self.durable_end
        ]
        if not caught_up:
            return []
        return self._propose(tuple(sorted(self.in_sync | set(caught_up))))

    def _propose(self, in_sync: tuple[str, ...]) -> list[OwnerEffect]:
        self.pending = in_sync
        return [ProposeInSync(self.topic, self.epoch, in_sync, self.version)]

    def _depose(self, epoch: int) -> list[OwnerEffect]:
        self.deposed = True
        return [Deposed(self.topic, epoch)]

    # -- sending ----------------------------------------------------------------------------------

    def _send(self, follower: str, prev_end: int, frames: bytes, count: int, now_ms: int) -> Send:
        link = self.links[follower]
        end = prev_end + count
        link.sent_end = end
        if count and (not link.sends or link.sends[-1][0] < end):
            link.sends.append((end, now_ms))
        message = Replicate(self.topic, self.epoch, prev_end, frames, count, self.high_watermark)
        return Send(follower, message)

    def _resend(self, follower: str, from_offset: int, now_ms: int) -> list[OwnerEffect]:
        link = self.links[follower]
        link.resend_from = from_offset
        link.sent_end = from_offset
        link.state = LinkState.STREAMING
        if from_offset >= self.written_end or not self._may_send(link):
            # Nothing to send now (or held back by `max_in_flight`): a probe makes the
            # follower say what it holds durably, in case its last answers were lost.
            return [self._send(follower, from_offset, b"", 0, now_ms)]
        if not any(c.prev_end == from_offset for c in self._window):
            if from_offset >= self.durable_end:
                # Not on disk yet, so not readable from the WAL; the window always keeps
                # the newest commit, so this is a follower ending inside one: a probe.
                return [self._send(follower, from_offset, b"", 0, now_ms)]
            link.state = LinkState.READING
            return [ReadForResend(follower, from_offset)]
        return self._send_window_from(follower, from_offset, now_ms)

    def _send_window_from(self, follower: str, from_offset: int, now_ms: int) -> list[OwnerEffect]:
        """Send the window's commits from `from_offset` on (the follower is STREAMING)."""
        out: list[OwnerEffect] = []
        link = self.links[follower]
        for commit in self._window:
            if not self._may_send(link):
                return out
            if commit.prev_end >= from_offset and commit.prev_end == link.sent_end:
                count = commit.end - commit.prev_end
                out.append(self._send(follower, commit.prev_end, commit.frames, count, now_ms))
        if link.sent_end < self.durable_end and self._may_send(link):
            # The window moved on meanwhile (or never had it): read the gap from the WAL
            # (only durable frames are read there; the newest commit is always in the window).
            link.state = LinkState.READING
            out.append(ReadForResend(follower, link.sent_end))
        return out

    def _remember(self, commit: _Commit) -> None:
        self._window.append(commit)
        self._window_size += len(commit.frames)
        while len(self._window) > 1 and self._window_size > self.window_bytes:
            self._window_size -= len(self._window.popleft().frames)
