"""Subscribing and receiving, plain and batched, written once: the gRPC services
(`data_plane.subscribe`, `receive_messages`, `batch_plane.receive_batches`, through
`runtime/streams.py`) and the simulated broker (`sim/broker.py`) make the same decisions:

- which start position a subscription takes (`start_of`: the batched path's `SubscribeAt`
  names one, the plain one starts at the latest offset);
- how many messages a stream sends per turn (`turn_limit`: 64 on the plain stream, the
  client's `max_messages` on the batched one, else RECEIVE_BATCH);
- a receive stream's life (`Receiver`): it opens (a previous stream of the consumer is
  taken over), each turn sends what the consumer's queue holds up to the limit, waits for a
  wake-up when the queue is empty, ends when it is no longer the consumer's current stream
  or its host ended it, and closes once (the core hears it, whatever ended it).

Sending, waiting and the wire form stay with the hosts. Pure."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from danube.machines.dispatch import LATEST
from danube.machines.dispatch.types import StartPosition
from danube.machines.node import requests
from danube.machines.node.core import BrokerCore, Step
from danube.machines.requests.effects import Apply

STREAM_BATCH = 64
"""Messages a plain receive stream sends per turn (one HTTP/2 send of that many)."""
RECEIVE_BATCH = 512
"""Messages per MessageBatch (a batched stream's turn) when the consumer does not say."""

Flow = Generator[Any, Any, Any]


def start_of(start: StartPosition | None) -> StartPosition:
    """Where a new subscription starts: the position asked for, else the latest offset."""
    return LATEST if start is None else start


def turn_limit(max_messages: int | None, default: int = 0) -> int:
    """Messages per turn: what the client asked for (a batched stream), else `default` (a
    batched stream's, RECEIVE_BATCH unless the broker was configured otherwise), else the
    plain stream's STREAM_BATCH."""
    return max_messages or default or STREAM_BATCH


def subscribe(core: BrokerCore, request: Any, start: StartPosition | None, now_ms: int) -> Flow:
    """A `ConsumerRequest`: returns the consumer id once the subscription's metadata is
    durable; refusals raise `DanubeError`."""
    step = requests.subscribe(core, request, start_of(start), now_ms)
    yield Apply(step)
    return step.value


@dataclass(frozen=True, slots=True)
class Send:
    """Send these items (what `BrokerCore.take` returns), in order, then turn again."""

    items: list[Any]


@dataclass(frozen=True, slots=True)
class Wait:
    """The queue is empty: turn again once the host wakes the stream (or ends it)."""


@dataclass(frozen=True, slots=True)
class End:
    """The stream is over (superseded, or ended by its host): close it."""


WAIT = Wait()
END = End()


class Receiver:
    """One receive stream of one consumer: `open`, then `turn` until it says `End` (or the
    host stops turning), then `close` exactly once."""

    def __init__(self, core: BrokerCore, consumer_id: int, limit: int) -> None:
        self.core = core
        self.consumer_id = consumer_id
        self.limit = limit
        self.generation: int | None = None
        self._closed = False

    def open(self, now_ms: int) -> Step[int]:
        """Starts the stream (`BrokerCore.open_stream`; refusals raise): apply the step's
        effects; its value is the stream's generation."""
        step = self.core.open_stream(self.consumer_id, now_ms=now_ms)
        self.generation = step.value
        return step

    def turn(self, ended: bool = False) -> Send | Wait | End:
        """What the stream does next; `ended`: its host ended it (takeover seen by the
        host, topic deleted, shutdown)."""
        if ended or self.generation is None:
            return END
        items = self.core.take(self.consumer_id, self.generation, self.limit)
        if items is None:
            return END
        return Send(items) if items else WAIT

    def close(self, now_ms: int) -> Step[None] | None:
        """The stream ended: the core's step (apply its effects), or None when it was
        closed before (or never opened)."""
        if self._closed or self.generation is None:
            return None
        self._closed = True
        return self.core.close_stream(self.consumer_id, self.generation, now_ms=now_ms)
