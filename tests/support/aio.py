"""Running asyncio client scenarios from plain pytest tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from danube.client import Consumer, Message

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0


def run(scenario: Callable[[], Awaitable[T]], timeout: float = DEFAULT_TIMEOUT_S) -> T:
    """Runs one scenario on a fresh event loop, failing (not hanging) after `timeout`."""

    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), timeout)

    return asyncio.run(bounded())


def unique_topic(prefix: str = "t") -> str:
    return f"/default/{prefix}-{uuid.uuid4().hex[:12]}"


async def receive_n(
    consumer: Consumer, count: int, timeout: float = 10.0, *, ack: bool = True
) -> list[Message]:
    """Receives exactly `count` messages (acking each unless told not to) or fails after
    `timeout`."""
    received = []
    async with asyncio.timeout(timeout):
        while len(received) < count:
            message = await consumer.receive()
            if ack:
                await consumer.ack(message)
            received.append(message)
    return received


async def receive_for(consumer: Consumer, seconds: float) -> list[Message]:
    """Everything that arrives within `seconds` (for asserting that nothing more comes)."""
    received = []
    try:
        async with asyncio.timeout(seconds):
            while True:
                message = await consumer.receive()
                await consumer.ack(message)
                received.append(message)
    except TimeoutError:
        return received
