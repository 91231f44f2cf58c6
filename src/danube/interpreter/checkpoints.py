"""The interpreter's checkpoint writer: after each WAL completion it marks the grown durable
end (`MarkDurable`, spec/wal-format.md "Remaining window"), one write at a time per topic and
at most one per `checkpoint_interval_ms`, pausing before a mark that would come too soon; each
mark holds the topic's directory (as loads, repairs and drops do), and a failed one only lags
(the next tries again).

Callbacks, not a flow: a mark follows every WAL write of a busy topic, and as a flow (the
writer's loop, an `Exclusive` holding the directory and the mark's own flow) it cost three
generators and four resumptions a mark, a fifth of all resumptions of the cluster simulator
(bench/RESULTS.md, issue 22 round 11). The requests, their order and the order of their
answers on the interpreter's trampoline are the flow's.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from danube.effects import MarkDurable, Sleep

if TYPE_CHECKING:
    from danube.interpreter.interpreter import Interpreter, _Files


Done = Callable[[BaseException | None], None]
"""What follows a mark: its error, None once written or failed as a mark may fail (OSError)."""


def _ignore_error(then: Callable[[], None], _error: BaseException | None) -> None:
    then()


class CheckpointWriter:
    def __init__(self, interpreter: Interpreter) -> None:
        self._it = interpreter

    def moved(self, topic: str, lane: _Files) -> None:
        """After a WAL completion: marks the topic's durable end if it grew."""
        end = self._it.core.wal_durable_end(topic)
        if end is None or end <= lane.checkpoint_target:
            return
        lane.checkpoint_target = end
        if not lane.checkpointing:
            lane.checkpointing = True
            self._next(topic, lane, lane.epoch)

    def final(self, topic: str, lane: _Files, then: Callable[[], None]) -> None:
        """One last mark of the durable end, whatever the interval (a graceful stop), then
        `then`, whether it was written or not."""
        end = self._it.core.wal_durable_end(topic)
        if end is not None and end > lane.checkpoint_target:
            lane.checkpoint_target = end
        done = partial(_ignore_error, then)  # as the stop's flow did: any error only counted
        self._it._hold(topic, partial(self._mark, topic, lane.checkpoint_target, done))

    def _next(self, topic: str, lane: _Files, epoch: int) -> None:
        """The writer's loop: marks while the target is ahead (and the WAL is the one it
        started for), pausing first if the last mark was less than an interval ago."""
        if lane.epoch != epoch or lane.checkpoint_target <= lane.checkpoint_marked:
            lane.checkpointing = False
            return
        it = self._it
        if (wait := lane.checkpoint_next_ms - it.host.now_ms()) > 0:
            it._ask(Sleep(wait), partial(self._slept, topic, lane, epoch))
            return
        target = lane.checkpoint_target
        then = partial(self._marked, topic, lane, epoch, target)
        it._hold(topic, partial(self._mark, topic, target, then))

    def _slept(
        self, topic: str, lane: _Files, epoch: int, _value: Any, error: BaseException | None
    ) -> None:
        if error is not None:  # a bug of the port: the writer stops and raises it
            lane.checkpointing = False
            raise error
        lane.checkpoint_next_ms = 0  # paused: marks next (an instant port's clock stays)
        self._next(topic, lane, epoch)

    def _mark(self, topic: str, end: int, then: Done) -> None:
        """The topic's directory held: the mark, then the directory released."""
        self._it._ask(MarkDurable(topic, end), partial(self._written, topic, then))

    def _written(self, topic: str, then: Done, _value: Any, error: BaseException | None) -> None:
        it = self._it
        it._release(topic)
        if isinstance(error, OSError):  # the mark only lags (weaker evidence); the next tries
            it.host.event("wal_checkpoint_failed", topic=topic, error=repr(error))
            error = None
        then(error)

    def _marked(
        self, topic: str, lane: _Files, epoch: int, target: int, error: BaseException | None
    ) -> None:
        if error is not None:  # a bug of the port: the writer stops and raises it
            lane.checkpointing = False
            raise error
        lane.checkpoint_marked = max(lane.checkpoint_marked, target)
        lane.checkpoint_next_ms = self._it.host.now_ms() + self._it.checkpoint_interval_ms
        self._next(topic, lane, epoch)
