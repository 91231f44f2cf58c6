"""A producer's stream the broker pauses does not stall the other calls on its connection
(review finding, issue 28; spec/hardening.md, receive windows). The broker stops reading a
`PublishBatches` stream while its batch waits (for room in the publish pool, or here for the
topic's `max_publish_rate`); with grpclib's windows, 4 MiB a stream and 4 MiB a connection,
that one unread stream took the whole connection window and a health check on the same
connection waited until the stream was read again (about 4 s here). A real broker process,
our client's one connection per broker, and a producer pushing more than a stream window.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from danube.client import Batching, DanubeClient
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from tests.support.aio import run, unique_topic
from tests.support.wire import channel_to

pytestmark = pytest.mark.slow

PAYLOAD = b"x" * (20 * 1024)
BATCH = Batching(max_messages=50, max_bytes=1 << 20, max_in_flight=16)
"""1 MiB batches, sixteen in flight: far more than one stream window unread."""
RATE = 10
"""Messages a second: a 50-message batch waits about 5 s for its turn, its stream unread."""
HEALTH_LIMIT_S = 1.0


def test_health_check_on_a_paused_producers_connection_answers_within_a_second(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("broker:\n  memory_budget: 64MiB\n")
    broker = broker_factory(tmp_path / "data", config_file=config).start()
    topic = unique_topic("paused")

    async def scenario() -> tuple[float, int]:
        async with DanubeClient(broker.url) as client, channel_to(broker.admin_addr) as admin:
            producer = await client.producer(topic, "p", batching=BATCH).create()
            await ext_pb.PolicyAdminStub(admin).set_topic_policies(
                ext_pb.SetPoliciesRequest(name=topic, policies=f'{{"max_publish_rate": {RATE}}}')
            )
            sends = [asyncio.ensure_future(producer.enqueue(PAYLOAD)) for _ in range(800)]
            await asyncio.sleep(2.0)  # the stream is paused and the client's windows filled
            channel = client._connections.channel(broker.url)
            started = time.monotonic()
            await pb.HealthCheckStub(channel).health_check(
                pb.HealthCheckRequest(client=pb.HealthCheckRequestClientType.Producer, id=1)
            )
            latency = time.monotonic() - started
            pending = sum(not send.done() for send in sends)
            for send in sends:
                send.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
            return latency, pending

    try:
        latency, pending = run(scenario)
    finally:
        broker.kill()
    assert pending > 0, "the producer was never paused: the test did not fill a window"
    assert latency < HEALTH_LIMIT_S, (
        f"a health check on the paused producer's connection took {latency:.2f} s"
    )
