"""The broker's internal dead-letter producer (cluster mode, issue 24; spec/failure-policies.md,
"Dead letters"): carries out `ForwardDeadLetter`, the core's ask to store a dead letter on a
topic another broker serves.

It publishes through the cluster's own redirect, as any producer does: our client looks the
topic up at this broker, is sent to the owner (or to the broker the cluster places a new topic
on, which creates it reliable when `auto_create_topics` is on, as Danube does) and publishes
there on the reliable path. `send` returns once the owner acknowledged the message at the
topic's durability level: only then is `done` answered without an error, and only then does
the core tell the subscription `dead_lettered`. Any failure (unreachable, refused, a view
changing, a timeout) is answered as an error: the core asks again after the policy's backoff,
the original staying in the window. A send that timed out may still land: the retry then
stores a second copy (at-least-once, as a crash can cause; consumers of the dead-letter topic
tell copies apart by `x-original-topic` + `x-original-topic-offset`).

One producer per dead-letter topic, named `broker-dead-letter-<broker id>-<nonce>` (a
restarted process never collides with the session its predecessor left behind), created on
the first dead letter and dropped at its first failure (the next one creates it again).

With authentication on, the producer is a broker of the cluster (`peers.internal_client`):
TLS with the broker's own certificate when the client port speaks TLS, and the cluster-key
broker token on every call, so the owner's access check lets it publish. It decides
nothing: what to publish and when to ask again are the core's.
"""

from __future__ import annotations

import asyncio
import secrets

from danube.client import DanubeClient
from danube.client.client import DispatchStrategy
from danube.client.producer import Producer
from danube.client.security import ClientSecurity
from danube.interpreter.host import Done
from danube.machines.node.dead_letters import PRODUCER_NAME
from danube.machines.node.effects import ForwardDeadLetter
from danube.values.errors import DanubeError, ErrorCode

FORWARD_TIMEOUT_S = 10.0
"""Longest a forward may take (producer creation and the owner's acknowledgement)."""


class DeadLetterForward:
    def __init__(
        self,
        service_url: str,
        broker_id: str,
        loop: asyncio.AbstractEventLoop,
        *,
        security: ClientSecurity | None = None,
        timeout_s: float = FORWARD_TIMEOUT_S,
    ) -> None:
        self._url = service_url
        self._security = security
        self._loop = loop
        self._timeout_s = timeout_s
        self.producer_name = f"{PRODUCER_NAME}-{broker_id}-{secrets.token_hex(3)}"
        self._client: DanubeClient | None = None
        self._producers: dict[str, Producer] = {}
        self._creating: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.forwarded = 0
        self.failed = 0

    def perform(self, effect: ForwardDeadLetter, done: Done) -> None:
        """Called on the asyncio loop (the interpreter's); answered there, once."""
        task = self._loop.create_task(self._forward(effect, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, effect: ForwardDeadLetter, done: Done) -> None:
        topic = effect.publish.topic
        record = effect.record
        try:
            async with asyncio.timeout(self._timeout_s):
                producer = await self._producer(topic)
                await producer.send(record.payload, attributes=record.attributes)
        except Exception as error:
            self.failed += 1
            dropped = self._producers.pop(topic, None)
            if dropped is not None:
                dropped.close()  # its batcher task ends with it
            if not isinstance(error, DanubeError):
                reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                error = DanubeError(
                    ErrorCode.UNAVAILABLE, f"forwarding a dead letter to {topic}: {reason}"
                )
            done(None, error)
            return
        self.forwarded += 1
        done(None, None)

    async def _producer(self, topic: str) -> Producer:
        lock = self._creating.setdefault(topic, asyncio.Lock())
        async with lock:  # concurrent dead letters of one topic share one producer
            found = self._producers.get(topic)
            if found is None:
                if self._client is None:
                    self._client = DanubeClient(self._url, security=self._security)
                builder = self._client.producer(
                    topic, self.producer_name, dispatch=DispatchStrategy.RELIABLE
                )
                found = self._producers[topic] = await builder.create()
            return found

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for producer in self._producers.values():
            producer.close()
        self._producers.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None
