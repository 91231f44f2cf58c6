"""Acknowledging and negatively acknowledging delivered messages, one or many (Ack, Nack,
the batched path's AckBatch): one flow each, so the plain and the batched services and the
simulator settle messages the same way. The answer waits for the step's metadata (a cursor
persisted, a redelivery scheduled)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from danube.machines.node import requests
from danube.machines.node.core import BrokerCore
from danube.machines.requests.effects import Apply
from danube.values.errors import invalid

Flow = Generator[Any, Any, None]


def ack(
    core: BrokerCore, topic: str, subscription: str, offsets: Sequence[int], now_ms: int
) -> Flow:
    """Acknowledges `offsets` of the subscription (an Ack is the one-offset case)."""
    if len(offsets) == 1:
        step = core.ack(topic, subscription, offsets[0], now_ms=now_ms)
    else:
        step = core.ack_many(topic, subscription, offsets, now_ms=now_ms)
    yield Apply(step)


def ack_one(core: BrokerCore, request: requests.Acknowledgement, now_ms: int) -> Flow:
    """An `AckRequest`: its `msg_id` names the topic and the offset."""
    if not request.has_msg_id:
        raise invalid("msg_id is required (it names the topic and the offset)")
    yield from ack(
        core, request.topic_name, request.subscription_name, (request.topic_offset,), now_ms
    )


def nack_one(core: BrokerCore, request: requests.Acknowledgement, now_ms: int) -> Flow:
    """A `NackRequest`: redelivery after its delay or the failure policy's."""
    yield Apply(requests.nack(core, request, now_ms))
