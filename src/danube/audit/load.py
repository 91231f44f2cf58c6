"""The load generator behind `danube-cli load`: producers and consumers against a broker or
a cluster at a set rate, writing the ack and delivery logs an audit reads (spec/audit.md).

Every payload is `<producer>:<seq>:` padded to the payload size, and producer names carry a
run id, so each message is unique across runs on the same topics. A failed send is retried
with the same payload (so storage may hold it twice: an allowed `duplicate`); only what the
broker acknowledged goes into the ack log. Subscriptions are made before the first publish,
so every acknowledged message is owed to every reliable one. A non-reliable run writes only
the delivery log: nothing is stored, so nothing is owed and there is nothing to audit."""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from danube.audit.digest import payload_digest
from danube.audit.logs import Ack, AuditLogs, Delivery
from danube.client import DanubeClient, DanubeClientError, DispatchStrategy, Producer, SubType
from danube.client.consumer import Consumer

SUB_TYPES = {
    "exclusive": SubType.EXCLUSIVE,
    "shared": SubType.SHARED,
    "failover": SubType.FAILOVER,
    "key_shared": SubType.KEY_SHARED,
}
SEND_ATTEMPTS = 10
RETRY_S = 0.5
PROGRESS_S = 1.0


@dataclass(frozen=True)
class LoadPlan:
    service_url: str
    logs: Path
    topic_prefix: str = "/default/load"
    topics: int = 1
    partitions: int = 0
    producers: int = 1
    """Per topic."""
    messages: int = 1000
    """In all, shared evenly by the producers."""
    rate: float = 100.0
    """Messages per second in all; each producer paces its share open-loop."""
    payload_bytes: int = 128
    keys: int = 0
    """Routing keys drawn round-robin per producer (0: none)."""
    subscriptions: tuple[str, ...] = ("exclusive", "shared")
    consumers: int = 2
    """Per subscription (an Exclusive subscription has one)."""
    reliable: bool = True
    drain_s: float = 30.0
    """How long to wait for deliveries after the last acknowledgement, without progress."""
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))

    def problems(self) -> list[str]:
        found = []
        for name in ("topics", "producers", "messages", "consumers"):
            if getattr(self, name) < 1:
                found.append(f"--{name} must be at least 1")
        if self.partitions < 0:
            found.append("--partitions must be 0 (not partitioned) or more")
        if self.rate <= 0:
            found.append("--rate must be above 0")
        if self.payload_bytes < 32:
            found.append("--payload-bytes must be at least 32 (the producer and sequence)")
        unknown = [name for name in self.subscriptions if name not in SUB_TYPES]
        if unknown:
            found.append(f"unknown subscription type(s) {', '.join(unknown)}")
        if len(set(self.subscriptions)) != len(self.subscriptions):
            found.append("each subscription type may be named once")
        return found

    @property
    def topic_names(self) -> list[str]:
        return [f"{self.topic_prefix}-{t}" for t in range(self.topics)]


@dataclass
class LoadResult:
    acknowledged: int = 0
    send_retries: int = 0
    deliveries: dict[str, int] = field(default_factory=dict)
    """Per subscription type: every delivery, repeats included."""
    missing: dict[str, int] = field(default_factory=dict)
    """Per reliable subscription: acknowledged messages it never received."""
    elapsed_s: float = 0.0


class _Tally:
    """What was acknowledged and what each subscription received, by (topic, producer,
    digest), so the drain knows when every subscription has everything."""

    def __init__(self, subscriptions: tuple[str, ...]) -> None:
        self.acked: set[tuple[str, str, int]] = set()
        self.received: dict[str, set[tuple[str, str, int]]] = {
            name: set() for name in subscriptions
        }
        self.deliveries = dict.fromkeys(subscriptions, 0)
        self.changed = time.monotonic()

    def missing(self) -> dict[str, int]:
        return {name: len(self.acked - got) for name, got in self.received.items()}


class LoadRun:
    def __init__(self, plan: LoadPlan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.say = say
        self.logs = AuditLogs(plan.logs, f"load-{plan.run_id}")
        self.tally = _Tally(plan.subscriptions)
        self.result = LoadResult()
        self._started = time.monotonic()

    async def run(self) -> LoadResult:
        plan = self.plan
        strategy = DispatchStrategy.RELIABLE if plan.reliable else DispatchStrategy.NON_RELIABLE
        try:
            async with DanubeClient(plan.service_url) as client:
                producers = []
                for t, topic in enumerate(plan.topic_names):
                    for p in range(plan.producers):
                        name = f"load-{plan.run_id}-t{t}-p{p}"
                        producer = client.producer(
                            topic, name, partitions=plan.partitions, dispatch=strategy
                        )
                        producers.append(await producer.create())
                consumers = await self._subscribe(client)
                receiving = [asyncio.create_task(self._receive(*c)) for c in consumers]
                progress = asyncio.create_task(self._progress())
                try:
                    shares = _shares(plan.messages, len(producers))
                    interval = len(producers) / plan.rate
                    sending = zip(producers, shares, strict=True)
                    await asyncio.gather(*(self._produce(p, n, interval) for p, n in sending))
                    await self._drain()
                finally:
                    progress.cancel()
                    for task in receiving:
                        task.cancel()
                    ended = await asyncio.gather(progress, *receiving, return_exceptions=True)
                    for outcome in ended:
                        if isinstance(outcome, DanubeClientError):
                            self.say(f"a consumer stopped early: {outcome}")
        finally:
            self.logs.close()
        self.result.deliveries = dict(self.tally.deliveries)
        self.result.missing = self.tally.missing() if plan.reliable else {}
        self.result.elapsed_s = time.monotonic() - self._started
        return self.result

    async def _subscribe(self, client: DanubeClient) -> list[tuple[Consumer, str, str]]:
        consumers = []
        for topic in self.plan.topic_names:
            for sub in self.plan.subscriptions:
                count = 1 if sub == "exclusive" else self.plan.consumers
                for c in range(count):
                    name = f"{sub}-c{c}"
                    consumer = client.consumer(
                        topic, name, f"load-{self.plan.run_id}-{sub}", sub_type=SUB_TYPES[sub]
                    )
                    consumers.append((await consumer.subscribe(), sub, name))
        return consumers

    async def _produce(self, producer: Producer, count: int, interval: float) -> None:
        padding_to = self.plan.payload_bytes
        start = time.monotonic()
        for seq in range(count):
            await asyncio.sleep(max(0.0, start + seq * interval - time.monotonic()))
            stem = f"{producer.name}:{seq:012d}:".encode()
            payload = stem + b"x" * max(0, padding_to - len(stem))
            key = f"k{seq % self.plan.keys}" if self.plan.keys else None
            sent_ms = time.time_ns() // 1_000_000
            for attempt in range(SEND_ATTEMPTS):
                try:
                    receipt = await producer.send(payload, key=key)
                    break
                except DanubeClientError as error:
                    if attempt == SEND_ATTEMPTS - 1:
                        raise DanubeClientError(
                            f"{producer.name} gave up on message {seq} after {SEND_ATTEMPTS} "
                            f"attempts: {error}"
                        ) from None
                    self.result.send_retries += 1
                    await asyncio.sleep(RETRY_S)
            digest = payload_digest(payload)
            if self.plan.reliable:
                self.logs.acked(
                    Ack(receipt.topic, receipt.producer_name, seq, digest, None, sent_ms,
                        time.time_ns() // 1_000_000)
                )  # fmt: skip
            self.tally.acked.add((receipt.topic, receipt.producer_name, digest))
            self.result.acknowledged += 1

    async def _receive(self, consumer: Consumer, sub: str, name: str) -> None:
        counts: dict[str, int] = {}
        subscription = f"load-{self.plan.run_id}-{sub}"
        async for message in consumer:
            n = counts.get(message.topic, 0)
            counts[message.topic] = n + 1
            digest = payload_digest(message.payload)
            self.logs.delivered(
                Delivery(subscription, sub, self.plan.reliable, name, n, message.topic,
                         message.producer_name, message.offset, digest, message.routing_key,
                         time.time_ns() // 1_000_000)
            )  # fmt: skip
            self.tally.received[sub].add((message.topic, message.producer_name, digest))
            self.tally.deliveries[sub] += 1
            self.tally.changed = time.monotonic()
            await consumer.ack(message)

    async def _drain(self) -> None:
        """Until every reliable subscription has every acknowledged message, or nothing
        arrived for `drain_s` seconds (a non-reliable run always waits that long)."""
        self.tally.changed = time.monotonic()
        while time.monotonic() - self.tally.changed < self.plan.drain_s:
            if self.plan.reliable and not any(self.tally.missing().values()):
                return
            await asyncio.sleep(0.1)

    async def _progress(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_S)
            elapsed = time.monotonic() - self._started
            received = ", ".join(f"{k} {v}" for k, v in self.tally.deliveries.items())
            self.say(
                f"[load {elapsed:6.1f} s] acknowledged {self.result.acknowledged}/"
                f"{self.plan.messages} ({self.result.acknowledged / elapsed:.0f} msg/s); "
                f"received {received}"
            )


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def summary(plan: LoadPlan, result: LoadResult) -> str:
    lines = [
        f"acknowledged {result.acknowledged} messages in {result.elapsed_s:.1f} s "
        f"({result.send_retries} send retries)",
    ]
    for sub, count in result.deliveries.items():
        missing = result.missing.get(sub)
        tail = "" if missing is None else (", all received" if not missing else f", {missing} "
                                           "acknowledged messages not received")  # fmt: skip
        lines.append(f"subscription load-{plan.run_id}-{sub}: {count} deliveries{tail}")
    lines.append(f"logs in {plan.logs} (run {plan.run_id}); audit them with")
    lines.append(
        f"  python -m spark.audit --wal <each broker's wal dir> --logs {plan.logs} "
        "--out <dir> [--objects <durable root> --index <keys.json>]"
    )
    return "\n".join(lines)


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
