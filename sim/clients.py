"""Simulated producers and consumers. They send the requests the gRPC services receive
(`danube.proto.danube`; the per-message ones as the services hold them once decoded,
`sim.requests`), time out and retry as real clients do, and tell the checker what they were
told (acknowledged publishes) and what they received."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from danube.machines.dispatch import LATEST, StartPosition
from danube.machines.wal import records
from danube.machines.wal.format import encode_frame
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from danube.values.errors import DanubeError, ErrorCode
from sim.broker import Reply, SimBroker
from sim.network import Network
from sim.requests import (
    AckBatchRequest,
    AckRequest,
    ConsumerRequest,
    NackRequest,
    ProducerRequest,
    PublishBatch,
)
from sim.world import US_PER_S, Timeout, Timeouts, World

if TYPE_CHECKING:
    from sim.audit_output import AuditOutput

REQUEST_TIMEOUT_US = 1_000_000
RETRY_US = 100_000
HEALTH_US = 250_000
"""`--departing`: how often a producer sends a HealthCheck (Danube's clients: every 5 s
against a 60 s idle timeout; the simulation scales both down, `run.DEPARTING_IDLE_MS`)."""
AWAY_US = (1_000_000, 6_000_000)
"""`--departing`: how long a client that leaves stays away (around the idle timeout and the
consumer pool's grace, so it comes back both before and after them)."""
LEAVE = 0.02
"""`--departing`: the chance, per acknowledged publish or received message, that the client
leaves for a while (a producer: silent, or only pausing its publishes; a consumer: its stream
closes)."""
UNAVAILABLE_RETRIES = 5
"""`--departing`: a producer told UNAVAILABLE this many times in a row creates itself again
(Danube's clients: `max_retries` retries, then a lookup and a new create)."""
ACK_BATCH_US = 20_000
POISON_SHARE = 4
"""With `--poison`: one message in this many of the poison key is poison."""
"""How long a batched consumer gathers acknowledgements before it sends them in one
AckBatch."""


class Checker(Protocol):
    def produced(self, topic: str, payload: bytes, key: str | None) -> None: ...

    def received(
        self, topic: str, sub: str, consumer: str, offset: int, payload: bytes
    ) -> None: ...

    def client_acked(self, topic: str, sub: str, offset: int) -> None: ...


class Handler(Protocol):
    """Where a client's requests go: a broker (or a client-side route to one)."""

    def handle(self, request: Any, reply: Reply, **stream: Any) -> None: ...


class Caller:
    """One request at a time with a timeout: the answer of an abandoned attempt is ignored."""

    def __init__(
        self,
        world: World,
        network: Network,
        broker: Handler,
        name: str,
        timeout_us: int = REQUEST_TIMEOUT_US,
    ) -> None:
        self.world = world
        self._timeouts = Timeouts(world, timeout_us)
        self.network = network
        self.broker = broker
        self.name = name
        self._attempt = 0
        self._request_ids = 0

    def next_request_id(self) -> int:
        self._request_ids += 1
        return self._request_ids

    def call(
        self,
        request: Any,
        answered: Callable[[Any], None],
        timed_out: Callable[[], None],
        **kw: Any,
    ) -> None:
        self._attempt += 1
        attempt = self._attempt

        def deliver(answer: Any) -> None:
            if attempt == self._attempt:
                self._attempt += 1  # answered: the timeout is void
                timer.clear()
                answered(answer)

        def timeout() -> None:
            if attempt == self._attempt:
                self._attempt += 1
                timed_out()

        timer = self.send(request, deliver, timeout, **kw)

    def send(
        self,
        request: Any,
        deliver: Callable[[Any], None],
        expired: Callable[[], None],
        **kw: Any,
    ) -> Timeout:
        """One request with its timeout and no one-at-a-time guard: for a caller that keeps
        several in flight and tells a live answer from an abandoned one itself (the timeout
        is the caller's to clear)."""
        reply, broker = Reply(self.network, self.name, deliver), self.broker
        self.network.send(self.name, lambda: broker.handle(request, reply, **kw))
        return self._timeouts.start(expired)


class SimProducer:
    """Publishes `<name>:<n>` payloads at `rate` per second, one at a time; a failed or timed
    out send is retried with the same payload until it is acknowledged (so the topic may hold
    it twice, which the checker counts as a duplicate, not an error)."""

    def __init__(
        self,
        world: World,
        network: Network,
        broker: SimBroker,
        checker: Checker,
        *,
        name: str,
        topic: str,
        rate: float,
        keys: int,
        strategy: pb.DispatchStrategy,
        audit: AuditOutput | None = None,
    ) -> None:
        self.world = world
        self.checker = checker
        self.audit = audit
        self.name = name
        self.topic = topic
        self.interval_us = int(US_PER_S / rate)
        self.keys = keys
        self.strategy = strategy
        self._caller = Caller(world, network, broker, name)
        self._producer_id: int | None = None
        self._sequence = 0
        self._key: str | None = None
        self.sent = 0
        self.acknowledged = 0
        self.retries = 0
        self.stopped = False
        self.departing = False
        """Leaves and comes back now and then, and health-checks meanwhile (`--departing`)."""
        self._health = Caller(world, network, broker, name)
        self._checking = False
        self._away_until = 0
        """Silent (no publish, no health check) until then: a client that left."""
        self._unavailable = 0
        self.left = 0

    def start(self) -> None:
        self._create()

    def _create(self) -> None:
        if self.stopped:
            return
        request = ProducerRequest(
            self._caller.next_request_id(), self.name, self.topic, int(self.strategy)
        )
        self._caller.call(request, self._created, self._retry_create)

    def _retry_create(self) -> None:
        self.world.at(RETRY_US, self._create)

    def _created(self, answer: Any) -> None:
        if isinstance(answer, DanubeError):
            self._retry_create()
            return
        self._producer_id = answer.producer_id
        self._unavailable = 0
        if self.departing and not self._checking:
            self._checking = True
            self.world.at(HEALTH_US, self._health_check)
        self._send()

    def _health_check(self) -> None:
        """Every `HEALTH_US` while created, unless away (its answer changes nothing: Danube's
        clients do not act on CLOSE either)."""
        if self.stopped:
            return
        if self._producer_id is not None and self.world.now >= self._away_until:
            request = pb.HealthCheckRequest(
                request_id=self._health.next_request_id(),
                client=pb.HealthCheckRequestClientType.Producer,
                id=self._producer_id,
            )
            self._health.call(request, lambda answer: None, lambda: None)
        self.world.at(HEALTH_US, self._health_check)

    def _leaves(self) -> int:
        """`--departing`: how long the producer stays away now (0: it does not). Half of
        those that leave keep health-checking (only their publishes pause)."""
        if not self.departing or self.world.rng.random() >= LEAVE:
            return 0
        away = self.world.rng.randrange(*AWAY_US)
        self.left += 1
        if self.world.rng.random() < 0.5:
            self._away_until = self.world.now + away
        return away

    def _payload(self) -> bytes:
        return f"{self.name}:{self._sequence}".encode()

    def _send(self) -> None:
        if self.stopped:
            return
        assert self._producer_id is not None
        if self._key is None and self.keys:
            self._key = f"k{self.world.rng.randrange(self.keys)}"
        message = records.Record(  # a SendMessage, decoded (`wire_codec.StreamMessageWire`)
            request_id=self._caller.next_request_id(),
            producer_id=self._producer_id,
            topic_name=self.topic,
            payload=self._payload(),
            publish_time=self.world.now_ms,
            producer_name=self.name,
            routing_key=self._key,
        )
        self.sent += 1
        started = self.world.now
        self._caller.call(
            message, lambda answer: self._answered(answer, started), self._send_failed
        )

    def _send_failed(self) -> None:
        self.retries += 1
        self.world.at(RETRY_US, self._send)

    def _answered(self, answer: Any, started: int) -> None:
        if isinstance(answer, DanubeError):
            self.retries += 1
            unavailable = answer.code is ErrorCode.UNAVAILABLE
            self._unavailable = self._unavailable + 1 if unavailable else 0
            if answer.code is ErrorCode.NOT_FOUND or (
                self.departing and self._unavailable >= UNAVAILABLE_RETRIES
            ):
                self.world.at(RETRY_US, self._create)
            else:
                self.world.at(RETRY_US, self._send)
            return
        self._unavailable = 0
        count = self._acked(started)
        self._key = None
        wait = max(0, started + count * self.interval_us - self.world.now)
        self.world.at(wait + self._leaves(), self._send)

    def _acked(self, started: int) -> int:
        """Tells the checker what was acknowledged; returns how many messages that was."""
        self.checker.produced(self.topic, self._payload(), self._key)
        if self.audit is not None:
            self.audit.acked(self.topic, self.name, self._sequence, self._payload(), started)
        self.acknowledged += 1
        self._sequence += 1
        return 1


class SimBatchProducer(SimProducer):
    """A producer on the batched path (`PublishBatches`, as our client publishes by default):
    up to `batch` messages per `PublishBatch`, one frame and one answer for all; a refused or
    unanswered batch is sent again whole. Its rate is the plain producer's, in messages."""

    def __init__(self, *args: Any, batch: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch = batch
        self._count = 0
        """Messages of the batch being sent (0: none yet)."""

    def _payloads(self) -> list[bytes]:
        return [f"{self.name}:{self._sequence + i}".encode() for i in range(self._count)]

    def _send(self) -> None:
        if self.stopped:
            return
        assert self._producer_id is not None
        if not self._count:
            self._count = self.world.rng.randint(1, self.batch)
        if self._key is None and self.keys:
            self._key = f"k{self.world.rng.randrange(self.keys)}"
        frame = encode_frame(
            0,
            0,
            [
                records.encode(
                    records.Record(
                        payload=payload,
                        publish_time=self.world.now_ms,
                        producer_name=self.name,
                        routing_key=self._key,
                        has_msg_id=False,
                    )
                )
                for payload in self._payloads()
            ],
        )
        request = PublishBatch(self._producer_id, self.topic, self._caller.next_request_id(), frame)
        self.sent += self._count
        started = self.world.now
        self._caller.call(
            request, lambda answer: self._answered(answer, started), self._send_failed
        )

    def _acked(self, started: int) -> int:
        count = self._count
        for i, payload in enumerate(self._payloads()):
            self.checker.produced(self.topic, payload, self._key)
            if self.audit is not None:
                self.audit.acked(self.topic, self.name, self._sequence + i, payload, started)
        self.acknowledged += count
        self._sequence += count
        self._count = 0
        return count


def is_poison(record: records.Record, key: str) -> bool:
    """One message in `POISON_SHARE` of routing key `key`, by its payload: every consumer
    agrees, and the key's other messages queue behind a blocked one (Key-Shared)."""
    return record.routing_key == key and zlib.crc32(record.payload) % POISON_SHARE == 0


class SimConsumer:
    """Subscribes, keeps a receive stream open (reopening it after a break, subscribing again
    when the broker no longer knows it), and acknowledges each message after a random delay
    (or nacks it, with probability `nack`)."""

    reopen_us = RETRY_US
    """How long after a refused, lost or ended stream the consumer tries again."""

    def __init__(
        self,
        world: World,
        network: Network,
        broker: SimBroker,
        checker: Checker,
        *,
        name: str,
        topic: str,
        subscription: str,
        sub_type: int,
        ack_delay_us: int,
        nack: float,
        start: StartPosition = LATEST,
        audit: AuditOutput | None = None,
        poison_key: str | None = None,
    ) -> None:
        """`start` matters only when this consumer's subscribe creates the subscription;
        every poison message of routing key `poison_key` is nacked, every time."""
        self.world = world
        self.audit = audit
        self.network = network
        self.broker = broker
        self.checker = checker
        self.name = name
        self.topic = topic
        self.subscription = subscription
        self.sub_type = sub_type
        self.ack_delay_us = ack_delay_us
        self.nack = nack
        self.poison_key = poison_key
        self.start_position = start
        self._caller = Caller(world, network, broker, f"{name}@{subscription}")
        self._consumer_id: int | None = None
        self._stream = 0
        self.received = 0
        self.departing = False
        """Leaves (its stream closes) and comes back now and then (`--departing`)."""
        self._back_at = 0
        self.left = 0

    @property
    def client(self) -> str:
        return self._caller.name

    def start(self) -> None:
        self._subscribe()

    def _subscribe(self) -> None:
        request = ConsumerRequest(
            self._caller.next_request_id(), self.topic, self.name, self.subscription, self.sub_type
        )
        self._caller.call(
            request, self._subscribed, self._retry_subscribe, start=self.start_position
        )

    def _retry_subscribe(self) -> None:
        self.world.at(RETRY_US, self._subscribe)

    def _subscribed(self, answer: Any) -> None:
        if isinstance(answer, DanubeError):
            self._retry_subscribe()
            return
        self._consumer_id = answer.consumer_id
        self._open()

    def _open(self) -> None:
        assert self._consumer_id is not None
        self._stream += 1
        stream = self._stream
        request = self._receive_request(self._consumer_id)

        def opened(answer: Any) -> None:
            if isinstance(answer, DanubeError):
                self.world.at(self.reopen_us, self._after_refusal(answer))

        self._caller.call(
            request,
            opened,
            lambda: self.world.at(self.reopen_us, self._reconnect),
            client=self.client,
            on_message=lambda m: self._on_message(stream, m),
            on_end=lambda why: self._on_end(stream, why),
        )

    def _after_refusal(self, answer: DanubeError) -> Callable[[], None]:
        """What a refused stream tries next: subscribing again when the consumer is unknown,
        else opening the stream again."""
        return self._subscribe if answer.code is ErrorCode.NOT_FOUND else self._open

    def _reconnect(self) -> None:
        """After a lost answer or an ended stream: the stream again."""
        self._open()

    def _receive_request(self, consumer_id: int) -> Any:
        """The plain stream: one message per stream message."""
        return pb.ReceiveRequest(request_id=self._caller.next_request_id(), consumer_id=consumer_id)

    def _on_end(self, stream: int, why: str) -> None:
        if stream == self._stream:
            wait = max(self.reopen_us, self._back_at - self.world.now)
            self.world.at(wait, self._reconnect)

    def _maybe_leave(self) -> None:
        """`--departing`: now and then the client goes away, its stream closed, and comes
        back `AWAY_US` later (the broker then lets go of what its subscription held after
        the consumer pool's grace, and reads it again when it is back)."""
        if not self.departing or self.world.now < self._back_at:
            return
        if self.world.rng.random() >= LEAVE:
            return
        self._back_at = self.world.now + self.world.rng.randrange(*AWAY_US)
        self.left += 1
        self.world.at(0, lambda: self.broker.break_streams(self.client))

    def _on_message(self, stream: int, record: records.Record) -> None:
        self.received += 1
        self.checker.received(
            self.topic, self.subscription, self.name, record.topic_offset, record.payload
        )
        if self.audit is not None:
            self.audit.delivered(self.client, self.subscription, self.sub_type, record)
        self.world.at(self.world.rng.randrange(self.ack_delay_us + 1), lambda: self._settle(record))
        self._maybe_leave()

    def _fails(self, record: records.Record) -> bool:
        """Nacked: a poison message always, another with probability `nack`."""
        if self.poison_key is not None and is_poison(record, self.poison_key):
            return True
        return bool(self.nack) and self.world.rng.random() < self.nack

    def _settle(self, record: records.Record) -> None:
        offset = record.topic_offset
        if self._fails(record):
            request: Any = NackRequest(
                self._caller.next_request_id(),
                True,
                record.topic_name,
                offset,
                self.subscription,
                self.world.rng.choice([None, 0, 200]),
            )
        else:
            self.checker.client_acked(self.topic, self.subscription, offset)
            request = AckRequest(
                self._caller.next_request_id(), True, record.topic_name, offset, self.subscription
            )
        self._send_settlement(request)

    def _send_settlement(self, request: Any) -> None:
        """Acks and nacks are not retried: an unanswered one is redelivered later."""
        reply = Reply(self.network, self.client, lambda answer: None)
        self.network.send(self.client, lambda: self.broker.handle(request, reply))


class SimBatchConsumer(SimConsumer):
    """A consumer on the batched path: it receives on a `ReceiveBatches` stream (a turn's
    messages in one `MessageBatch`), and its acks are gathered for ACK_BATCH_US and sent
    together in one `AckBatch` (nacks go one by one, as our client sends them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acks: list[int] = []

    def _receive_request(self, consumer_id: int) -> Any:
        """The batched stream (`ReceiveBatches`), at the broker's default batch size."""
        return ext_pb.ReceiveBatchesRequest(consumer_id=consumer_id)

    def _settle(self, record: records.Record) -> None:
        if self._fails(record):
            self._send_settlement(
                NackRequest(
                    self._caller.next_request_id(),
                    True,
                    record.topic_name,
                    record.topic_offset,
                    self.subscription,
                    self.world.rng.choice([None, 0, 200]),
                )
            )
            return
        self.checker.client_acked(self.topic, self.subscription, record.topic_offset)
        if not self._acks:
            self.world.at(ACK_BATCH_US, self._flush)
        self._acks.append(record.topic_offset)

    def _flush(self) -> None:
        offsets, self._acks = self._acks, []
        self._send_settlement(
            AckBatchRequest(self._caller.next_request_id(), self.topic, self.subscription, offsets)
        )
