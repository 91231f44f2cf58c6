"""A real cluster (etcd, moto's S3 server, broker processes) under reliable traffic from our
client and the official one: a broker is SIGKILLed, its topics fail over and the clients carry
on; a fourth broker joins, a rebalance moves topics onto it, and still no acknowledged message
is lost (issue 6, points 6 to 8)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from grpclib.client import Channel

from danube.client import DanubeClient, SubType
from danube.client.client import DispatchStrategy
from danube.client.producer import partition_for_key
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from danube.proto import danube_admin as admin_pb
from tests.conformance.harness import ScenarioProcess
from tests.support.metrics import scrape

pytestmark = pytest.mark.slow

PARTITIONS = 9
"""With the official client's topic, ten topics over three brokers: every broker holds at
least three under the `fair` strategy, so the killed one holds some of ours too."""
WINDOW = 8
"""Sends in flight at once from our producer."""


@dataclass
class Traffic:
    """Our client's producer (all partitions) and consumer (Shared, all partitions), run on an
    asyncio loop in a thread of their own while the test drives the cluster."""

    service_urls: str
    topic: str = "/default/ours"
    acked: dict[str, float] = field(default_factory=dict)
    """payload -> when its send started, for every send that returned."""
    received: dict[str, float] = field(default_factory=dict)
    """payload -> when it first arrived."""
    received_topics: list[tuple[float, str, str]] = field(default_factory=list)
    """(when, topic, payload) of every delivery."""
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True).start()

    async def _run(self) -> None:
        try:
            async with DanubeClient(self.service_urls) as client:
                producer = await client.producer(
                    self.topic, "ours", partitions=PARTITIONS, dispatch=DispatchStrategy.RELIABLE
                ).create()
                consumer = await client.consumer(
                    self.topic, "ours-consumer", "ours-sub", sub_type=SubType.SHARED
                ).subscribe()
                receiving = asyncio.create_task(self._receive(consumer))
                counter = iter(range(10**9))

                async def send_loop() -> None:
                    while not self.stop.is_set():
                        payload = f"m-{next(counter)}"
                        started = time.monotonic()
                        await producer.send(payload.encode(), key=payload)
                        self.acked[payload] = started

                await asyncio.gather(*(send_loop() for _ in range(WINDOW)))
                deadline = time.monotonic() + 60
                while not set(self.acked) <= set(self.received) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                receiving.cancel()
        except Exception as error:
            self.errors.append(repr(error))
        finally:
            self.done.set()

    async def _receive(self, consumer: object) -> None:
        try:
            await self._receive_all(consumer)
        except Exception as error:
            self.errors.append(f"receive: {error!r}")
            raise

    async def _receive_all(self, consumer: object) -> None:
        """Acks each message as it arrives without awaiting the answer before the next one
        (the client gathers the acks in flight into one `AckBatch` per partition). Awaiting
        each ack in turn made the consumer one round trip per message: under load (two
        cores, load 5 and more) it fell hundreds of messages behind the eight concurrent
        sends, and both waits below timed that backlog instead of the failover: the first
        post-kill message of a failed-over partition comes after every earlier one of it
        (28.9 s after the kill in one run, past 60 s in another, while the partitions were
        served again 4 s after it), and the final drain ran out of its 60 s with 86
        messages not yet delivered, on partitions the killed broker never held among them."""
        pending: set[asyncio.Future[bool]] = set()
        async for message in consumer:  # type: ignore[attr-defined]
            payload = message.payload.decode()
            now = time.monotonic()
            self.received.setdefault(payload, now)
            self.received_topics.append((now, message.topic, payload))
            ack = asyncio.ensure_future(consumer.ack(message))  # type: ignore[attr-defined]
            pending.add(ack)
            ack.add_done_callback(lambda done: self._acked(pending, done))
            if len(self.received) >= 200:
                self.ready.set()

    def _acked(self, pending: set[asyncio.Future[bool]], ack: asyncio.Future[bool]) -> None:
        """An ack's answer: False (lost with a moved topic; redelivered) is fine, an error
        is the test's failure."""
        pending.discard(ack)
        if not ack.cancelled() and ack.exception() is not None:
            self.errors.append(f"ack: {ack.exception()!r}")


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _broker_id(broker: BrokerProcess) -> str:
    match = re.search(r"event=broker_ready broker_id=(\S+)", broker.log_text())
    assert match is not None
    return match.group(1)


async def _rebalance(cluster: LocalCluster) -> admin_pb.RebalanceResponse:
    live = [b for b in cluster.brokers if b.alive]
    channel = Channel(*live[0].admin_addr.rsplit(":", 1))
    try:
        leader = (
            await admin_pb.BrokerAdminStub(channel).get_leader_broker(admin_pb.Empty())
        ).leader
    finally:
        channel.close()
    broker = next(b for b in live if _broker_id(b) == leader)
    channel = Channel(*broker.admin_addr.rsplit(":", 1))
    try:
        request = admin_pb.RebalanceRequest(max_moves=3)
        return await admin_pb.BrokerAdminStub(channel).trigger_rebalance(request)
    finally:
        channel.close()


def _explain(missing: list[str], cluster: LocalCluster) -> str:
    """Which partitions the lost messages were on, and what the brokers did with them."""
    partitions = Counter(partition_for_key(p, PARTITIONS) for p in missing)
    names = {f"/default/ours-part-{i}" for i in partitions}
    return (
        f"{len(missing)} acknowledged messages never arrived ({missing[:10]}...), by "
        f"partition {dict(partitions)}:\n{_logs_of(cluster, names)}"
    )


def _logs_of(cluster: LocalCluster, topics: set[str]) -> str:
    lines = [
        f"{b.url}: {line}"
        for b in cluster.brokers
        for line in b.log_lines
        if "segment_uploaded" not in line
        and (
            any(f"topic={name} " in line or line.endswith(f"topic={name}") for name in topics)
            or "error" in line.lower()
            or "warn" in line.lower()
        )
    ]
    return "\n".join(lines[-80:])


def test_killed_broker_fails_over_and_a_new_broker_takes_topics_without_loss(
    tmp_path: Path,
) -> None:
    settings = ClusterSettings(brokers=3, durability="object", object_batch_ms=20)
    with LocalCluster(tmp_path / "cluster", settings) as cluster:
        urls = ",".join(cluster.service_urls)
        official = ScenarioProcess("cluster_traffic", urls, "/default/official")
        official.wait_event("ready", timeout=60)
        ours = Traffic(urls)
        ours.start()
        assert ours.ready.wait(60), f"our traffic did not start: {ours.errors}"

        victim = cluster.owner("/default/official")
        ours_on_victim = {t for t in victim.loaded_topics() if t.startswith("/default/ours-part-")}
        assert ours_on_victim, "the killed broker should hold some of our partitions"
        victim.kill()
        killed_at = time.monotonic()

        moved = {"/default/official", *ours_on_victim}
        survivors = [b for b in cluster.brokers if b is not victim]
        _wait(
            lambda: moved <= {t for b in survivors for t in b.loaded_topics()},
            60,
            f"{sorted(moved)} to load on the surviving brokers",
        )

        def served_after_kill() -> list[float]:
            """Deliveries, on the failed-over partitions, of messages sent after the kill
            (earlier ones may have waited in the client's buffers)."""
            return [
                at
                for at, topic, payload in list(ours.received_topics)
                if topic in ours_on_victim and ours.acked.get(payload, 0.0) > killed_at
            ]

        try:
            _wait(served_after_kill, 60, "a message of a failed-over partition")
        except AssertionError as error:
            raise AssertionError(
                f"{error}\nour client's errors: {ours.errors}\n{_logs_of(cluster, ours_on_victim)}"
            ) from None
        first_served = min(served_after_kill())

        newcomer = cluster.add_broker()
        # until the leader's view has the newcomer (its registration reaches the leader by a
        # watch, and the failed-over topics may still be settling), there is nothing to move
        deadline = time.monotonic() + 30
        while True:
            response = asyncio.run(_rebalance(cluster))
            assert response.success, response.error_message
            if response.moves_executed or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert response.moves_executed, f"no move proposed: {response.error_message}"
        _wait(lambda: newcomer.loaded_topics(), 60, "a topic to move to the new broker")
        moves = sum(
            scrape(b.metrics_url).value("danube_rebalancing_moves_total", reason="manual")
            for b in cluster.brokers
            if b.alive
        )
        assert moves >= 1, "the leader counts the moves of the manual rebalance"
        time.sleep(3)  # traffic on the moved topic

        ours.stop.set()
        official.send("stop")
        result = official.result(timeout=120)
        assert ours.done.wait(120)

    assert not ours.errors, ours.errors
    missing = sorted(set(ours.acked) - set(ours.received))
    assert not missing, _explain(missing, cluster)
    assert len(ours.acked) > 300
    assert "consumer_failure" not in result, f"{result}"
    assert result["missing"] == [], f"{result}"
    print(f"official client: {result}")
    assert result["acked"] > 50, result
    print(
        f"failover: first message of a failed-over partition {first_served - killed_at:.2f} s "
        f"after SIGKILL; ours acked {len(ours.acked)}, official acked {result['acked']} "
        f"(producer recoveries {result['producer_recoveries']}, consumer recoveries "
        f"{result['consumer_recoveries']}); moved to the new broker: {newcomer.loaded_topics()}"
    )
