"""The interpreter's part of the poison policies (spec/failure-policies.md): a policy drop
is logged, and a dead letter's append is waited for like a producer's publish (the same
`Publishes` table, so it is answered by the same acknowledgement or loss), its outcome then
fed back to the core (`BrokerCore.dead_letter_done`). Kept apart from `interpreter` to keep
that module one job and under the size limit."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from danube.machines.node.core import DeadLetterPublish, ForwardDeadLetter, PolicyDropped
from danube.values.errors import DanubeError, ErrorCode

if TYPE_CHECKING:
    from danube.interpreter.interpreter import Interpreter

POISON_EFFECTS = (PolicyDropped, DeadLetterPublish, ForwardDeadLetter)


def carry(
    interpreter: Interpreter, effect: PolicyDropped | DeadLetterPublish | ForwardDeadLetter
) -> None:
    if isinstance(effect, ForwardDeadLetter):  # cluster mode: the port publishes elsewhere
        interpreter._perform(effect, partial(_forwarded, interpreter, effect.publish))
    elif isinstance(effect, PolicyDropped):
        interpreter.host.event(
            "policy_dropped",
            topic=effect.topic,
            subscription=effect.subscription,
            offset=effect.offset,
            attempts=effect.attempts,
        )
    elif effect.failure is None:
        interpreter.publishes.wait(effect.topic, effect.through, effect)
    else:  # refused before any append: reported after the step at hand, as a loss would be
        error = DanubeError(ErrorCode.UNAVAILABLE, effect.failure)
        interpreter._post(partial(answered, interpreter, effect, error))


def _forwarded(
    interpreter: Interpreter,
    publish: DeadLetterPublish,
    _answer: object,
    error: BaseException | None,
) -> None:
    """The owner's answer to a forwarded dead letter: stored, or not (any error: lost,
    refused, unreachable, a view changing), which the core asks again after the backoff."""
    if error is not None and not isinstance(error, DanubeError):
        error = DanubeError(ErrorCode.UNAVAILABLE, f"{type(error).__name__}: {error}")
    answered(interpreter, publish, error)


def answered(
    interpreter: Interpreter, publish: DeadLetterPublish, error: DanubeError | None
) -> None:
    """The dead letter is stored at its topic's durability (error None) or is not: the
    core hears which, and the host logs it."""
    failure = None if error is None else error.message
    interpreter.host.event(
        "dead_lettered" if failure is None else "dead_letter_failed",
        topic=publish.origin,
        subscription=publish.subscription,
        epoch=publish.epoch,
        offset=publish.offset,
        attempts=publish.attempts,
        dead_letter_topic=publish.topic,
        dead_letter_offset=publish.through,
        reason=failure,
    )
    core = interpreter.core
    interpreter._apply_step(
        lambda: core.dead_letter_done(publish, failure, now_ms=interpreter.host.now_ms())
    )
