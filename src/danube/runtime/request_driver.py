"""Runs the request flows of `danube.machines.requests` on the broker's event loop: the one place
the gRPC services turn a flow's effects into runtime calls (`BrokerRuntime`), the schema gate
and asyncio sleeps. The services only translate wire messages into flows and results into
replies; the simulator runs the same flows (`sim/requests.py`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from danube.effects import Sleep
from danube.effects.flow import Finished, Flow, step
from danube.machines.node.core import Step
from danube.machines.requests.effects import (
    AdmitSchema,
    Apply,
    AwaitRoom,
    AwaitStored,
    CheckFence,
    SchemaInspects,
)
from danube.runtime.broker import BrokerRuntime
from danube.runtime.grpc_util import RECEIVED
from danube.runtime.schema_gate import SchemaGate

T = TypeVar("T")

_NOTHING = Step(None)
"""The empty step `start_publish` registers a storage wait with, ahead of the real one."""


class RequestDriver:
    def __init__(
        self, runtime: BrokerRuntime, gate: SchemaGate | None = None, *, staged: bool = False
    ) -> None:
        """`gate`: None for services whose flows check no schema (acknowledgements);
        `staged`: a publish service's driver, which adds each request's `receive` and
        `check` stages (`danube.runtime.stage_metrics`) as its core call starts."""
        self._runtime = runtime
        self._gate = gate
        self._staged = staged

    async def run(self, flow: Flow[T]) -> T:
        """The flow's value once it is done; its refusal raised."""
        rest = await self.begin(flow)
        return await rest

    async def begin(self, flow: Flow[T]) -> Awaitable[T]:
        """Runs the flow up to its first `Apply` (everything before it awaited in order),
        starts that step's effects before returning, and returns the rest: a caller that
        keeps the core's order between requests (a stream of batches) may begin the next
        request while this one waits for its storage."""
        waits: dict[int, Coroutine[Any, Any, None]] = {}
        try:
            request = step(flow)
            while not isinstance(request, Finished):
                if isinstance(request, Apply):
                    settled = self._start(request, waits)
                    if self._staged:
                        self._checked()
                    return self._rest(flow, settled, waits)
                request = await self._answer(flow, request)
        except BaseException:
            flow.close()  # cancelled (the client left): its `finally` gives back its memory
            raise
        return _Done(_value(request))

    def _checked(self) -> None:
        received = RECEIVED.get()
        if received is None:
            return
        read_at, decoded = received
        stages = self._runtime.metrics.stages
        if read_at:
            stages.observe("receive", decoded - read_at)
        stages.observe("check", time.perf_counter() - decoded)

    def _start(self, apply: Apply, waits: dict[int, Coroutine[Any, Any, None]]) -> Awaitable[None]:
        stored = apply.stored
        if stored is not None:
            # Registered before the step's effects start (`start_publish` registers first).
            waits[id(stored)] = self._runtime.start_publish(  # type: ignore[assignment]
                stored.topic, _NOTHING, stored.through
            )
        return self._runtime.start(apply.step)

    async def _rest(
        self,
        flow: Flow[T],
        settled: Awaitable[None],
        waits: dict[int, Coroutine[Any, Any, None]],
    ) -> T:
        try:
            request = await _resumed(flow, settled)
            while not isinstance(request, Finished):
                if isinstance(request, Apply):
                    request = await _resumed(flow, self._start(request, waits))
                elif isinstance(request, AwaitStored):
                    request = await _resumed(flow, waits.pop(id(request)))
                else:
                    request = await self._answer(flow, request)
            return _value(request)
        finally:
            for wait in waits.values():
                wait.close()  # a flow that answered without waiting (never, but not leaked)
            flow.close()  # cancelled: the flow's `finally` gives back its publish pool room

    async def _answer(self, flow: Flow[Any], request: Any) -> Any:
        """Carries out one effect and returns the flow's next request."""
        try:
            answer = await self._perform(request)
        except Exception as error:
            return step(flow, error=error)
        return step(flow, answer=answer)

    async def _perform(self, request: Any) -> Any:
        if isinstance(request, CheckFence):
            return self._runtime.fenced
        if isinstance(request, Sleep):
            await asyncio.sleep(request.ms / 1000)
            return None
        if isinstance(request, AwaitRoom):
            await _room(request)
            return None
        if isinstance(request, (SchemaInspects, AdmitSchema)):
            gate = self._gate
            if gate is None:
                raise TypeError(f"{request!r} asked of a driver without a schema gate")
            if isinstance(request, SchemaInspects):
                return await gate.inspects(request.topic)
            await gate.admit_batch(request.topic, request.messages)
            return None
        raise TypeError(f"a request flow asked for {request!r}, which the broker does not do")


async def _room(request: AwaitRoom) -> None:
    """Waits until the publish pool admits the waiter (it calls `wake` from the release that
    freed the room, on this loop) or the time is up."""
    waiter = request.waiter
    if waiter.granted:
        return
    woken = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    waiter.wake = wake
    try:
        await asyncio.wait_for(woken, request.timeout_ms / 1000)
    except TimeoutError:
        pass
    finally:
        waiter.wake = None


async def _resumed(flow: Flow[Any], done: Awaitable[None]) -> Any:
    try:
        await done
    except Exception as error:
        return step(flow, error=error)
    return step(flow, answer=None)


def _value(finished: Finished) -> Any:
    if finished.error is not None:
        raise finished.error
    return finished.value


class _Done:
    """An awaitable of a value already known (a flow refused or done before any `Apply`)."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def __await__(self) -> Any:
        return self._value
        yield  # pragma: no cover - makes this a generator
