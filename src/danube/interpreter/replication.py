"""Carrying out the owner's replication effects (spec/replication.md), for the interpreter.

- `ReplicaSend` goes to the port as it is: the port owns the streams to the followers (one
  per follower, in order) and answers at once once the send is queued on it; a follower's
  answers come back through `answered`, a broken stream through `stream_broke`.
- `ReplicaPropose` runs the proposal flow (`flows.propose_in_sync`), whose written value
  (committed) or read-back (any other outcome) is the replicas value the core hears
  (`BrokerCore.replicas_changed`).
- `ReplicaRead` reads raw frames from the WAL (`flows.read_frames`) and feeds them to the
  core; a read that fails leaves that follower behind (its lag shrinks it out of the in-sync
  set) and is reported as an event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from danube.effects.flow import Flow
from danube.interpreter import flows
from danube.machines.node.core import (
    AskEpochEnd,
    ReplicaAnswer,
    ReplicaConfig,
    ReplicaPropose,
    ReplicaRead,
    ReplicaSend,
)
from danube.machines.replication import messages as rm

if TYPE_CHECKING:
    from danube.interpreter.interpreter import Interpreter

ReplicaEffect = ReplicaSend | ReplicaPropose | ReplicaRead | ReplicaAnswer | AskEpochEnd
REPLICA_EFFECTS = (ReplicaSend, ReplicaPropose, ReplicaRead, ReplicaAnswer, AskEpochEnd)


class Replication:
    """The interpreter's replication lane: effects out, answers in."""

    def __init__(self, interpreter: Interpreter) -> None:
        self._interpreter = interpreter

    # -- the core's effects -------------------------------------------------------------------

    def carry(self, effect: ReplicaEffect) -> None:
        it = self._interpreter
        if isinstance(effect, (ReplicaSend, ReplicaAnswer)):
            it._perform(effect, _ignore)
        elif isinstance(effect, AskEpochEnd):
            self._ask(effect)
        elif isinstance(effect, ReplicaPropose):
            topic = effect.proposal.topic

            def seen(config: ReplicaConfig | None, error: BaseException | None) -> None:
                if error is not None or config is None:
                    if error is not None:
                        it.host.event("replicas_propose_failed", topic=topic, error=str(error))
                    core = it.core
                    it._apply_step(lambda: core.replica_proposal_lost(topic))
                    return
                now = it.host.now_ms()
                it._apply_step(lambda: it.core.replica_proposal_answered(topic, config, now_ms=now))

            it._run(flows.propose_in_sync(effect.proposal, effect.epoch_start, effect.known), seen)
        else:
            self._read(effect)

    def _ask(self, ask: AskEpochEnd) -> None:
        """The port asks the owner; its answer (an end, or None: not the owner, unreachable)
        goes to the core, which asks again on a later `Replicate` when there was none."""
        it = self._interpreter

        def answered(end: int | None, error: BaseException | None) -> None:
            if error is not None:
                it.host.event("epoch_end_failed", topic=ask.topic, owner=ask.owner,
                              error=str(error))  # fmt: skip
                end = None
            core, now = it.core, it.host.now_ms()
            it._apply_step(
                lambda: core.replica_epoch_answered(ask.topic, ask.epoch, end, now_ms=now)
            )

        it._run(_asked(ask), answered)

    def _read(self, read: ReplicaRead) -> None:
        it = self._interpreter

        def done(outcome: flows.FramesOutcome, error: BaseException | None) -> None:
            if error is not None:
                raise error
            if outcome.failure is not None:
                it.host.event(
                    "replica_read_failed",
                    topic=read.topic,
                    follower=read.follower,
                    error=outcome.failure,
                )
                return
            core, now = it.core, it.host.now_ms()
            frames, end = outcome.frames, outcome.end
            it._apply_step(lambda: core.replica_frames_read(read, frames, end, now_ms=now))

        it._run(flows.read_frames(read.topic, read.plan), done)

    # -- the port's calls ---------------------------------------------------------------------

    def answered(self, follower: str, answer: rm.FollowerAnswer) -> None:
        """A follower's answer arrived on its stream."""
        it = self._interpreter
        now = it.host.now_ms()
        it._enter(lambda: it._apply_step(
            lambda: it.core.replica_answered(follower, answer, now_ms=now)
        ))  # fmt: skip

    def stream_broke(self, follower: str) -> None:
        """The stream to `follower` broke (sends on it may be lost)."""
        it = self._interpreter
        now = it.host.now_ms()
        it._enter(lambda: it._apply_step(
            lambda: it.core.replica_stream_broke(follower, now_ms=now)
        ))  # fmt: skip

    def received(self, owner: str, message: rm.Replicate) -> None:
        """A `Replicate` from `owner` arrived (this broker follows the topic)."""
        it = self._interpreter
        now = it.host.now_ms()
        it._enter(lambda: it._apply_step(
            lambda: it.core.replica_received(owner, message, now_ms=now)
        ))  # fmt: skip

    def epoch_end(self, topic: str, epoch: int) -> int | None:
        """Answers a follower's `AskEpochEnd` (a query: no effects)."""
        return self._interpreter.core.replica_epoch_end(topic, epoch)

    def replicas_changed(self, topic: str, config: ReplicaConfig) -> None:
        """The topic's replicas value as read (watch or read-back)."""
        it = self._interpreter
        now = it.host.now_ms()
        it._enter(lambda: it._apply_step(
            lambda: it.core.replicas_changed(topic, config, now_ms=now)
        ))  # fmt: skip


def _ignore(_value: Any, _error: BaseException | None) -> None:
    """A send's only answer is that the port took it; a lost send shows as a broken stream."""


def _asked(ask: AskEpochEnd) -> Flow[int | None]:
    """The port's answer to the question, as it is."""
    end: int | None = yield ask
    return end
