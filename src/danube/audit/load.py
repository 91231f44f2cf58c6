"""The load generator behind `danube-cli load`: producers and consumers against a broker or
a cluster at a set rate, writing the ack and delivery logs an audit reads (spec/audit.md).

Every payload is `<producer>:<seq>:` padded to the payload size, and producer names carry a
run id, so each message is unique across runs. Topic names carry the run id too (unless a
prefix is given): a subscription is owed every message stored on its topic after it started,
so two generators on the same topics would make each other's messages `unseen` to their
subscriptions. A failed send is retried with the same payload (to the same partition when
the message has a key, so storage may hold it twice: an allowed `duplicate`; without a key
the retry goes to the next partition); only what the broker acknowledged goes into the ack
log. Subscriptions are made before the first publish, so every acknowledged message is owed
to every reliable one. A non-reliable run writes only
the delivery log: nothing is stored, so nothing is owed and there is nothing to audit."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from danube.audit import logs
from danube.audit.digest import payload_digest, unique_payload
from danube.audit.logs import Ack, AuditLogs, Delivery
from danube.client import DanubeClient, DanubeClientError, DispatchStrategy, Producer, SubType
from danube.client.consumer import Consumer

SUB_TYPES = {name: SubType[name.upper()] for name in logs.SUB_TYPES}
"""The log's names (spec/audit.md); `subscription_types` also takes danube-cli's spellings."""
SEND_ATTEMPTS = 10
RETRY_S = 0.5
PROGRESS_S = 1.0


@dataclass(frozen=True)
class LoadPlan:
    service_url: str
    logs: Path
    topic_prefix: str = ""
    """Topics are `<prefix>-0`, `<prefix>-1`, ...; empty: `/default/load-<run id>`."""
    topics: int = 1
    partitions: int = 0
    producers: int = 1
    """Per topic."""
    messages: int = 1000
    """In all, shared evenly by the producers."""
    rate: float = 100.0
    """Messages per second in all. Each producer sends its share one at a time on a fixed
    schedule: a slow acknowledgement delays the sends behind it, which then catch up."""
    payload_bytes: int = 128
    keys: int = 0
    """Routing keys drawn round-robin per producer (0: none)."""
    subscriptions: tuple[str, ...] = ("exclusive", "shared")
    consumers: int = 2
    """Per subscription (an Exclusive subscription has one)."""
    reliable: bool = True
    drain_s: float = 30.0
    """How long to wait for deliveries after the last acknowledgement, without progress."""
    duration_s: float = 0.0
    """Stop sending after this many seconds, whatever is left of `messages` (0: send them
    all): a soak asks for a rate over a time, and a machine that cannot keep the rate must not
    stretch the load past it. What was acknowledged is still drained and owed."""
    connection_topics: int = 100
    """Topics whose producers and consumers share one client connection. Every call opens an
    HTTP/2 stream, and h2 counts a connection's open streams by visiting them all at each
    new one (client and broker side): 1,000 topics on one connection (3,000 streams: a
    batch stream per producer, a receive stream and an acknowledgement call per consumer)
    spent most of both processes' time there and held the load to 60-72 of 300 msg/s
    (bench/RESULTS.md, issue 28 part 5)."""
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    subscription_prefix: str = ""
    """Subscriptions are `<prefix>-<type>` (`soak-exclusive`); empty: `load-<run id>-<type>`.
    Named, they can be made before the load (the memory soak's set-up makes the ones its load
    will use, so that they are part of the level the memory after the load is judged
    against) and a later run reuses them, resuming where they left off."""

    def subscription(self, sub: str) -> str:
        """The name of the load's subscription of type `sub`."""
        return f"{self.subscription_prefix or f'load-{self.run_id}'}-{sub}"

    def problems(self) -> list[str]:
        found = []
        for name in ("topics", "producers", "messages", "consumers", "connection_topics"):
            if getattr(self, name) < 1:
                flag = "topics-per-connection" if name == "connection_topics" else name
                found.append(f"--{flag} must be at least 1")
        if self.keys < 0:
            found.append("--keys must be 0 (no key) or more")
        if self.drain_s < 0:
            found.append("--drain must not be negative")
        if self.duration_s < 0:
            found.append("--duration must not be negative")
        if not self.subscriptions:
            found.append("name at least one subscription type")
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
        prefix = self.topic_prefix or f"/default/load-{self.run_id}"
        return [f"{prefix}-{t}" for t in range(self.topics)]


@dataclass
class LoadResult:
    acknowledged: int = 0
    send_retries: int = 0
    deliveries: dict[str, int] = field(default_factory=dict)
    """Per subscription type: every delivery, repeats included."""
    missing: dict[str, int] = field(default_factory=dict)
    """Per reliable subscription: acknowledged messages it never received."""
    failures: list[str] = field(default_factory=list)
    """Consumers that stopped before the end, and why: the run is not complete."""
    elapsed_s: float = 0.0


class Tally:
    """Which acknowledged messages each subscription still owes, by (topic, producer,
    digest), so the drain knows when every subscription has everything. A message received
    before its acknowledgement came back is remembered until the acknowledgement does."""

    def __init__(self, subscriptions: tuple[str, ...]) -> None:
        self.outstanding: dict[str, set[tuple[str, str, int]]] = {s: set() for s in subscriptions}
        self.early: dict[str, set[tuple[str, str, int]]] = {s: set() for s in subscriptions}
        self.deliveries = dict.fromkeys(subscriptions, 0)
        self.changed = time.monotonic()

    def acked(self, message: tuple[str, str, int]) -> None:
        for sub, owed in self.outstanding.items():
            if message in self.early[sub]:
                self.early[sub].discard(message)
            else:
                owed.add(message)

    def received(self, sub: str, message: tuple[str, str, int]) -> None:
        owed = self.outstanding[sub]
        if message in owed:
            owed.discard(message)
        else:
            self.early[sub].add(message)
        self.deliveries[sub] += 1
        self.changed = time.monotonic()

    def missing(self) -> dict[str, int]:
        return {sub: len(owed) for sub, owed in self.outstanding.items()}


class LoadRun:
    def __init__(self, plan: LoadPlan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.say = say
        self.logs = AuditLogs(plan.logs, f"load-{plan.run_id}")
        self.tally = Tally(plan.subscriptions)
        self.result = LoadResult()
        self._started = time.monotonic()

    async def run(self) -> LoadResult:
        plan = self.plan
        strategy = DispatchStrategy.RELIABLE if plan.reliable else DispatchStrategy.NON_RELIABLE
        try:
            async with contextlib.AsyncExitStack() as stack:
                clients = [
                    await stack.enter_async_context(DanubeClient(plan.service_url))
                    for _ in range(0, plan.topics, plan.connection_topics)
                ]
                producers = []
                for t, topic in enumerate(plan.topic_names):
                    client = clients[t // plan.connection_topics]
                    for p in range(plan.producers):
                        name = f"load-{plan.run_id}-t{t}-p{p}"
                        producer = client.producer(
                            topic, name, partitions=plan.partitions, dispatch=strategy
                        )
                        producers.append(await producer.create())
                consumers = await self._subscribe(clients)
                receiving = [asyncio.create_task(self._receive(*c)) for c in consumers]
                progress = asyncio.create_task(self._progress())
                try:
                    shares = _shares(plan.messages, len(producers))
                    interval = len(producers) / plan.rate
                    start = time.monotonic()
                    # A TaskGroup: a producer that gives up stops the others at once, so the
                    # logs do not go on collecting acknowledgements nobody consumes. Each
                    # producer's schedule is shifted by its share of the interval: all on
                    # the same beat, 1,000 producers sent 1,000 messages at once every
                    # interval, and their acknowledgements came back in bursts.
                    try:
                        async with asyncio.TaskGroup() as sending:
                            for i, (producer, share) in enumerate(
                                zip(producers, shares, strict=True)
                            ):
                                first = start + interval * i / len(producers)
                                sending.create_task(self._produce(producer, share, interval, first))
                    except ExceptionGroup as group:
                        raise group.exceptions[0] from None
                    await self._drain()
                finally:
                    progress.cancel()
                    for task in receiving:
                        task.cancel()
                    await asyncio.gather(progress, *receiving, return_exceptions=True)
        finally:
            self.logs.close()
        self.result.deliveries = dict(self.tally.deliveries)
        self.result.missing = self.tally.missing() if plan.reliable else {}
        self.result.elapsed_s = time.monotonic() - self._started
        return self.result

    async def _subscribe(self, clients: list[DanubeClient]) -> list[tuple[Consumer, str, str]]:
        consumers = []
        for t, topic in enumerate(self.plan.topic_names):
            client = clients[t // self.plan.connection_topics]
            for sub in self.plan.subscriptions:
                count = 1 if sub == "exclusive" else self.plan.consumers
                for c in range(count):
                    name = f"{sub}-c{c}"
                    consumer = client.consumer(
                        topic, name, self.plan.subscription(sub), sub_type=SUB_TYPES[sub]
                    )
                    consumers.append((await consumer.subscribe(), sub, name))
        return consumers

    async def _receive(self, consumer: Consumer, sub: str, name: str) -> None:
        """Any failure is recorded with the consumer's name (a dead consumer would otherwise
        show only as messages never received) and ends the drain's wait for it."""
        try:
            await self._consume(consumer, sub, name)
        except Exception as error:
            failure = f"consumer {name} of {consumer.topic} ({sub}) stopped: {error}"
            self.result.failures.append(failure)
            self.say(failure)

    async def _produce(self, producer: Producer, count: int, interval: float, start: float) -> None:
        """Message `seq` is due at `start + seq * interval`; none is sent after `duration_s`."""
        duration = self.plan.duration_s
        stop = self._started + duration if duration else None
        for seq in range(count):
            await asyncio.sleep(max(0.0, start + seq * interval - time.monotonic()))
            if stop is not None and time.monotonic() >= stop:
                return
            payload = unique_payload(producer.name, seq, self.plan.payload_bytes)
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
            if self.plan.reliable:  # nothing is owed on a non-reliable topic
                self.tally.acked((receipt.topic, receipt.producer_name, digest))
            self.result.acknowledged += 1

    async def _consume(self, consumer: Consumer, sub: str, name: str) -> None:
        counts: dict[str, int] = {}
        subscription = self.plan.subscription(sub)
        async for message in consumer:
            n = counts.get(message.topic, 0)
            counts[message.topic] = n + 1
            digest = payload_digest(message.payload)
            self.logs.delivered(
                Delivery(subscription, sub, self.plan.reliable, name, n, message.topic,
                         message.producer_name, message.offset, digest, message.routing_key,
                         time.time_ns() // 1_000_000)
            )  # fmt: skip
            self.tally.received(sub, (message.topic, message.producer_name, digest))
            await consumer.ack(message)

    async def _drain(self) -> None:
        """Until every reliable subscription has every acknowledged message, or nothing
        arrived for `drain_s` seconds (a non-reliable run always waits that long)."""
        self.tally.changed = time.monotonic()
        while time.monotonic() - self.tally.changed < self.plan.drain_s:
            if self.result.failures:
                return
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


def subscription_types(text: str) -> tuple[str, ...]:
    """Comma-separated, any spelling `SubType.named` takes, as the log's names; an unknown
    one is kept as given, for `LoadPlan.problems` to name."""
    names = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                names.append(SubType.named(part).name.lower())
            except ValueError:
                names.append(part)
    return tuple(names)


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
        lines.append(f"subscription {plan.subscription(sub)}: {count} deliveries{tail}")
    lines += [f"FAILED: {failure}" for failure in result.failures]
    lines.append(f"logs in {plan.logs} (run {plan.run_id}, topics {plan.topic_names[0]} ...)")
    if plan.reliable:
        lines.append(
            "audit them with: python -m spark.audit --wal <each broker's wal dir> "
            f"--logs {plan.logs} --out <dir> [--objects <durable root> --index <keys.json>]"
        )
    return "\n".join(lines)


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
