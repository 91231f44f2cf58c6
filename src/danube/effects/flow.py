"""Flows: generators that yield `danube.effects` values and get their answers sent back.

A flow is the sans-I/O form of a conversation with the world (our `machines/schema/flows.py` is the
first): it holds the decisions (order, retries, what to do with each answer) and no I/O.
A port runs it. `step` is the one place that advances a flow, so every port (trio,
simulator, in-memory) advances flows the same way:

    answer = port.perform(effect)          # or: error = the port's exception
    effect = step(flow, answer=answer)     # or: step(flow, error=error)
    # effect is the next request, or a `Finished` with the flow's value or its exception
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from danube.values.frozen import fast_init

T = TypeVar("T")

Flow: TypeAlias = Generator[Any, Any, T]


@fast_init
@dataclass(frozen=True, slots=True)
class Finished:
    """The flow returned `value`, or raised `error`."""

    value: Any = None
    error: BaseException | None = None


_NOTHING = object()


def step(flow: Flow[Any], *, answer: Any = _NOTHING, error: BaseException | None = None) -> Any:
    """Advances `flow` by one answer (or the first time, with neither) and returns its next
    request, or `Finished`. An exception the flow does not handle ends it as `Finished`
    with that error: the port reports it, it never escapes into the port's own machinery."""
    try:
        if error is not None:
            return flow.throw(error)
        if answer is _NOTHING:
            return next(flow)
        return flow.send(answer)
    except StopIteration as stop:
        return Finished(stop.value)
    except Exception as failure:  # the flow's own refusal (DanubeError) or a bug
        return Finished(error=failure)


def run_now(flow: Flow[T], perform: Callable[[Any], Any]) -> T:
    """Runs a flow to its end with a synchronous `perform` (the testing port, and the
    simulator for effects that take no simulated time). Raises what the flow raised.
    `drive` is the same loop for a port whose `perform` awaits (production)."""
    request = step(flow)
    while not isinstance(request, Finished):
        try:
            answer = perform(request)
        except Exception as failure:
            request = step(flow, error=failure)
        else:
            request = step(flow, answer=answer)
    if request.error is not None:
        raise request.error
    return request.value


async def drive(flow: Flow[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """`run_now` for an awaiting `perform` (the production port: trio or asyncio, whichever
    awaits it; this module imports neither): runs `flow` to its end, each request's answer,
    or the exception `perform` raised, sent back in. Raises what the flow raised."""
    request = step(flow)
    while not isinstance(request, Finished):
        try:
            answer = await perform(request)
        except Exception as failure:
            request = step(flow, error=failure)
        else:
            request = step(flow, answer=answer)
    if request.error is not None:
        raise request.error
    return request.value


def answered(value: T) -> Flow[T]:
    """A flow that asks nothing and returns `value` (for uniform call sites)."""
    return value
    yield  # pragma: no cover - makes this a generator
