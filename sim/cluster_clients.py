"""Producers of a cluster run with data planes: one reliable producer per topic, as an
application with a lookup-following client runs it. It asks a random running broker where the
topic lives (that broker's view of the assignments, stale or not), creates its producer there
and sends `<topic>#<n>` one at a time; any error or timeout sends it back to the lookup, and
the same payload goes again until it is acknowledged. The checker hears of every
acknowledgement."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from danube.core.errors import DanubeError, ErrorCode
from danube.proto import danube as pb
from sim.broker import Reply
from sim.cluster_node import SimNode
from sim.network import Network
from sim.world import US_PER_MS, US_PER_S, World

REQUEST_TIMEOUT_US = 2 * US_PER_S
RETRY_US = 200 * US_PER_MS


class Acknowledgements(Protocol):
    def acknowledged(self, topic: str, payload: str) -> None: ...


class ClusterProducer:
    def __init__(
        self,
        world: World,
        network: Network,
        nodes: Sequence[SimNode],
        checker: Acknowledgements,
        *,
        name: str,
        topic: str,
        rate: float,
    ) -> None:
        self.world = world
        self.network = network
        self.nodes = nodes
        self.checker = checker
        self.name = name
        self.topic = topic
        self.interval_us = int(US_PER_S / rate)
        self.started = False
        self.stopped = False
        self.acknowledged = 0
        self.lookups = 0
        self._target: SimNode | None = None
        self._producer_id: int | None = None
        self._sequence = 0
        self._attempt = 0
        self._request_ids = 0

    def start(self) -> None:
        self._lookup()

    def stop(self) -> None:
        self.stopped = True

    # -- lookup and creation -----------------------------------------------------------------------

    def _lookup(self) -> None:
        """A TopicLookup answered from a random broker's view (a round trip)."""
        if self.stopped:
            return
        self.lookups += 1
        running = [node for node in self.nodes if node.running is not None]
        if not running:
            self.world.at(RETRY_US, self._lookup)
            return
        asked = self.world.rng.choice(running)
        process = asked.running
        assert process is not None
        owner = process.assignments.get(self.topic)
        target = next((n for n in self.nodes if n.name == owner), asked)
        self._target = target
        self._producer_id = None
        self.world.at(2 * self.network.latency(), self._create)

    def _create(self) -> None:
        if self.stopped:
            return
        self._request_ids += 1
        request = pb.ProducerRequest(
            request_id=self._request_ids,
            producer_name=self.name,
            topic_name=self.topic,
            dispatch_strategy=pb.DispatchStrategy.Reliable,
        )
        self._call(request, self._created)

    def _created(self, answer: Any) -> None:
        if isinstance(answer, DanubeError):
            self.world.at(RETRY_US, self._lookup)
            return
        self._producer_id = answer.producer_id
        self._send()

    # -- publishing --------------------------------------------------------------------------------

    def _payload(self) -> str:
        return f"{self.topic}#{self._sequence}"

    def _send(self) -> None:
        if self.stopped or self._producer_id is None:
            return
        self._request_ids += 1
        payload = self._payload()
        message = pb.StreamMessage(
            request_id=self._request_ids,
            msg_id=pb.MsgId(producer_id=self._producer_id, topic_name=self.topic),
            payload=payload.encode(),
            publish_time=self.world.now_ms,
            producer_name=self.name,
        )
        started = self.world.now
        self._call(message, lambda answer: self._answered(answer, payload, started))

    def _answered(self, answer: Any, payload: str, started: int) -> None:
        if isinstance(answer, DanubeError):
            self.world.at(RETRY_US, self._lookup)
            return
        self.checker.acknowledged(self.topic, payload)
        self.acknowledged += 1
        self._sequence += 1
        self.world.at(max(0, started + self.interval_us - self.world.now), self._send)

    # -- the wire ----------------------------------------------------------------------------------

    def _call(self, request: Any, answered: Callable[[Any], None]) -> None:
        """One request to the target broker with a timeout; an abandoned attempt's answer is
        ignored (a timeout is an error: look the topic up again)."""
        self._attempt += 1
        attempt, target = self._attempt, self._target
        assert target is not None

        def deliver(answer: Any) -> None:
            if attempt == self._attempt:
                self._attempt += 1
                answered(answer)

        def arrive() -> None:
            process = target.running
            if process is None or process.data is None:
                reply(DanubeError(ErrorCode.UNAVAILABLE, "connection refused (broker down)"))
                return
            process.data.broker.handle(request, reply)

        reply = Reply(self.network, self.name, deliver)
        self.network.send(self.name, arrive)
        timeout = DanubeError(ErrorCode.UNAVAILABLE, "no answer within the timeout")
        self.world.at(REQUEST_TIMEOUT_US, lambda: deliver(timeout))
