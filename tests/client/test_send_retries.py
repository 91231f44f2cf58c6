"""A send refused as retryable is sent again for as long as the retry policy allows, on both
paths (Danube's SendMessage and our batched stream). A topic that moved lands on a broker that
may answer UNAVAILABLE "loading its write-ahead log" several times in a row; a client that
retried once failed the cluster failover test in CI with exactly that answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import grpclib.const
import grpclib.server
import pytest
from grpclib import GRPCError
from grpclib.const import Status

from danube.client import Batching, DanubeClient, DanubeClientError, RetryPolicy
from danube.machines.wal import format, records
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from tests.support.aio import run

LOADING = "/default/t is loading its write-ahead log; retry shortly"
QUICK = RetryPolicy(base_backoff_s=0.01, max_backoff_s=0.02, min_elapsed_s=5.0)
"""The default schedule's shape at a test's pace: at least 5 retries and 5 s."""


class _LoadingBroker(pb.ProducerServiceBase, pb.DiscoveryBase, ext_pb.ProducerExtBase):
    """Answers the first `refusals` sends (single or batched) UNAVAILABLE as a broker still
    loading the topic does, then stores; `batched` False leaves out the batched path."""

    def __init__(self, port: int, refusals: int, batched: bool) -> None:
        self.port = port
        self.refusals = refusals
        self.batched = batched
        self.stored: list[bytes] = []
        self.created = 0
        self.refused = 0

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            **pb.ProducerServiceBase.__mapping__(self),
            **pb.DiscoveryBase.__mapping__(self),
            **ext_pb.ProducerExtBase.__mapping__(self),
        }

    def _refuse(self) -> bool:
        if self.refused < self.refusals:
            self.refused += 1
            return True
        return False

    async def create_producer(self, request: pb.ProducerRequest) -> pb.ProducerResponse:
        self.created += 1
        return pb.ProducerResponse(request.request_id, 7, request.producer_name)

    async def send_message(self, request: pb.StreamMessage) -> pb.MessageResponse:
        if self._refuse():
            raise GRPCError(Status.UNAVAILABLE, LOADING)
        self.stored.append(request.payload)
        return pb.MessageResponse(request.request_id)

    async def publish_batches(
        self, publish_batch_iterator: AsyncIterator[ext_pb.PublishBatch]
    ) -> AsyncIterator[ext_pb.BatchAck]:
        if not self.batched:
            raise GRPCError(Status.UNIMPLEMENTED)
        async for batch in publish_batch_iterator:
            frame = format.decode_frame(batch.frame, 0)
            if self._refuse():
                unavailable = Status.UNAVAILABLE.value
                yield ext_pb.BatchAck(batch.sequence, status=unavailable, error=LOADING)
                continue
            first = len(self.stored)
            self.stored.extend(records.decode(record).payload for record in frame.records)
            yield ext_pb.BatchAck(batch.sequence, first, len(frame.records))

    async def topic_lookup(self, request: pb.TopicLookupRequest) -> pb.TopicLookupResponse:
        url = f"http://127.0.0.1:{self.port}"
        return pb.TopicLookupResponse(
            request.request_id, pb.TopicLookupResponseLookupType.Connect, url, url
        )

    async def topic_partitions(self, request: pb.TopicLookupRequest) -> pb.TopicPartitionsResponse:
        return pb.TopicPartitionsResponse(request.request_id, [request.topic])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _publish(refusals: int, *, batched: bool, count: int, retry: RetryPolicy) -> _LoadingBroker:
    """Starts the fake broker, publishes `count` messages (gathered, so the batched path
    sends them together) and returns the broker to look at; a send the client gave up on
    raises its error."""
    broker = _LoadingBroker(_free_port(), refusals, batched)

    async def scenario() -> None:
        server = grpclib.server.Server([broker])
        await server.start("127.0.0.1", broker.port)
        try:
            async with (
                DanubeClient(f"http://127.0.0.1:{broker.port}", retry=retry) as client,
                client.producer("/default/t", "p", batching=Batching()) as producer,
            ):
                await producer.create()
                await asyncio.gather(*[producer.enqueue(b"m%d" % i) for i in range(count)])
        finally:
            server.close()
            await server.wait_closed()

    run(scenario)
    return broker


@pytest.fixture(params=["batched", "single"])
def batched(request: pytest.FixtureRequest) -> Iterator[bool]:
    yield request.param == "batched"


def test_a_send_refused_while_the_topic_loads_is_sent_again_until_stored(batched: bool) -> None:
    broker = _publish(4, batched=batched, count=1, retry=QUICK)
    assert broker.refused == 4
    assert broker.stored == [b"m0"]
    assert broker.created > broker.refused, "the producer is created again before each resend"


def test_batched_messages_sent_again_keep_their_order() -> None:
    broker = _publish(3, batched=True, count=20, retry=QUICK)
    assert broker.stored == [b"m%d" % i for i in range(20)]


def test_a_send_gives_up_once_the_policy_is_spent_and_says_why(batched: bool) -> None:
    spent = RetryPolicy(max_retries=2, base_backoff_s=0.01, max_backoff_s=0.02, min_elapsed_s=0)
    with pytest.raises(DanubeClientError, match=r"UNAVAILABLE: .*loading its write-ahead log"):
        _publish(100, batched=batched, count=1, retry=spent)
