"""Danube's client-facing services (package `danube`): wire messages in, request flows run,
wire messages out. Decisions live in the request flows (`danube.machines.requests`: the publish
order, fencing, acknowledgements), in `BrokerCore` and, for which broker takes a request, in
the placement rules (`danube.machines.cluster.placement` through `danube.runtime.placement`)."""

from __future__ import annotations

import logging
import time

import grpclib.const
import grpclib.server
from grpclib import GRPCError
from grpclib.const import Status

from danube.machines.cluster.placement import Answer
from danube.machines.dispatch import StartPosition
from danube.machines.node import requests
from danube.machines.requests import receive, settle
from danube.machines.requests.publish import publish_one
from danube.machines.wal import records
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from danube.runtime.broker import BrokerRuntime, monotonic_ms, now_ms
from danube.runtime.grpc_util import (
    DEFAULT_REQUEST_LIMIT,
    RECEIVED,
    recv_single,
    send_encoded,
    unary,
)
from danube.runtime.metrics import BrokerMetrics
from danube.runtime.placement import Placement
from danube.runtime.request_driver import RequestDriver
from danube.runtime.schema_gate import SchemaGate
from danube.runtime.streams import serve_consumer
from danube.runtime.wire_codec import (
    AckRequestWire,
    NackRequestWire,
    RequestIdReply,
    StreamMessageWire,
)
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, invalid

log = logging.getLogger("danube.runtime")


class ProducerService:
    def __init__(
        self,
        runtime: BrokerRuntime,
        placement: Placement,
        message_limit: int,
        gate: SchemaGate,
    ) -> None:
        self._runtime = runtime
        self._core = runtime.core
        self._placement = placement
        self._message_limit = message_limit
        self._gate = gate
        self._requests = RequestDriver(runtime, gate, staged=True)

    async def create_producer(self, request: pb.ProducerRequest) -> pb.ProducerResponse:
        strategy = int(request.dispatch_strategy)
        if strategy in (0, 1):
            await self._placement.route(request.topic_name, DispatchStrategy(strategy))
        subject = requests.schema_subject(request)
        binding = None
        if subject is not None:
            binding = await self._gate.producer_binding(request.topic_name, subject)
        step = requests.create_producer(self._core, request)
        producer_id = await self._runtime.run(step)
        if subject is not None and binding is not None:
            await self._gate.bind(request.topic_name, subject, binding)
        log.info(
            "event=producer_created topic=%s producer=%s id=%d",
            request.topic_name, request.producer_name, producer_id,
        )  # fmt: skip
        return pb.ProducerResponse(
            request_id=request.request_id,
            producer_id=producer_id,
            producer_name=request.producer_name,
        )

    async def send_message(self, message: records.Record) -> RequestIdReply:
        started = time.perf_counter()
        topic = message.topic_name
        try:
            published = await self._requests.run(
                publish_one(self._core, message, now_ms, monotonic=monotonic_ms)
            )
        except DanubeError as error:
            self._runtime.metrics.send_failed(topic, 1, error.code.name)
            raise
        metrics = self._runtime.metrics
        if published.stored:
            metrics.stages.replied(RECEIVED.get())
        metrics.sent(
            topic, len(message.payload), time.perf_counter() - started, stored=published.stored
        )
        return RequestIdReply(message.request_id)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube.ProducerService/CreateProducer": unary(
                self.create_producer, pb.ProducerRequest, pb.ProducerResponse
            ),
            "/danube.ProducerService/SendMessage": unary(
                self.send_message,
                StreamMessageWire,
                RequestIdReply,
                limit=self._message_limit,
            ),
        }


class ConsumerService:
    def __init__(self, runtime: BrokerRuntime, placement: Placement) -> None:
        self._runtime = runtime
        self._core = runtime.core
        self._placement = placement
        self._requests = RequestDriver(runtime)

    async def subscribe(
        self, request: pb.ConsumerRequest, start: StartPosition | None = None
    ) -> pb.ConsumerResponse:
        """`start`: where the subscription starts (`SubscribeAt`); None, the plain
        Subscribe: `receive.start_of` decides (the latest offset)."""
        await self._placement.route(request.topic_name, None)
        flow = receive.subscribe(self._core, request, start, now_ms())
        consumer_id: int = await self._requests.run(flow)
        log.info(
            "event=subscribed topic=%s subscription=%s consumer=%s id=%d",
            request.topic_name, request.subscription, request.consumer_name, consumer_id,
        )  # fmt: skip
        return pb.ConsumerResponse(
            request_id=request.request_id,
            consumer_id=consumer_id,
            consumer_name=request.consumer_name,
        )

    async def receive_messages(self, stream: grpclib.server.Stream) -> None:
        """Streams the consumer's queue, one message per stream message, a turn's messages
        in one HTTP/2 send (`serve_consumer` says when the stream ends)."""
        request: pb.ReceiveRequest = await recv_single(stream, DEFAULT_REQUEST_LIMIT)

        async def send(items: list[object]) -> int:
            wire = [requests.encoded(item) for item in items]
            await send_encoded(stream, wire)
            return sum(map(len, wire))

        limit = receive.turn_limit(None)
        await serve_consumer(self._runtime, stream, request.consumer_id, limit, send)

    async def ack(self, request: requests.Acknowledgement) -> RequestIdReply:
        await self._requests.run(settle.ack_one(self._core, request, now_ms()))
        return RequestIdReply(request.request_id)

    async def nack(self, request: requests.Acknowledgement) -> RequestIdReply:
        await self._requests.run(settle.nack_one(self._core, request, now_ms()))
        self._runtime.metrics.nacked(request.topic_name, request.subscription_name)
        return RequestIdReply(request.request_id)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube.ConsumerService/Subscribe": unary(
                self.subscribe, pb.ConsumerRequest, pb.ConsumerResponse
            ),
            "/danube.ConsumerService/ReceiveMessages": grpclib.const.Handler(
                self.receive_messages,
                grpclib.const.Cardinality.UNARY_STREAM,
                pb.ReceiveRequest,
                pb.StreamMessage,
            ),
            "/danube.ConsumerService/Ack": unary(self.ack, AckRequestWire, RequestIdReply),
            "/danube.ConsumerService/Nack": unary(self.nack, NackRequestWire, RequestIdReply),
        }


class DiscoveryService:
    def __init__(self, placement: Placement, metrics: BrokerMetrics | None = None) -> None:
        self._placement = placement
        self._metrics = metrics

    async def topic_lookup(self, request: pb.TopicLookupRequest) -> pb.TopicLookupResponse:
        located = await self._placement.lookup(request.topic)
        kind = (
            pb.TopicLookupResponseLookupType.Connect
            if located.answer is Answer.CONNECT
            else pb.TopicLookupResponseLookupType.Redirect
        )
        if located.answer is Answer.REDIRECT and self._metrics is not None:
            self._metrics.redirected()
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=kind,
            connect_url=located.connect_url,
            broker_url=located.broker_url,
            proxy=located.proxy,
        )

    async def topic_partitions(self, request: pb.TopicLookupRequest) -> pb.TopicPartitionsResponse:
        return pb.TopicPartitionsResponse(
            request_id=request.request_id,
            partitions=await self._placement.partitions(request.topic),
        )

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube.Discovery/TopicLookup": unary(
                self.topic_lookup, pb.TopicLookupRequest, pb.TopicLookupResponse
            ),
            "/danube.Discovery/TopicPartitions": unary(
                self.topic_partitions, pb.TopicLookupRequest, pb.TopicPartitionsResponse
            ),
        }


class HealthCheckService:
    def __init__(self, runtime: BrokerRuntime) -> None:
        self._core = runtime.core

    async def health_check(self, request: pb.HealthCheckRequest) -> pb.HealthCheckResponse:
        client = int(request.client)
        if client == 0:
            healthy = self._core.producer_healthy(request.id)
        elif client == 1:
            healthy = self._core.consumer_healthy(request.id)
        else:
            raise GRPCError(Status.INVALID_ARGUMENT, f"unknown client type {client}")
        status = (
            pb.HealthCheckResponseClientStatus.OK
            if healthy
            else (pb.HealthCheckResponseClientStatus.CLOSE)
        )
        return pb.HealthCheckResponse(status=status)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube.HealthCheck/HealthCheck": unary(
                self.health_check, pb.HealthCheckRequest, pb.HealthCheckResponse
            ),
        }


class ConsumerExtService:
    """`danube_ext.ConsumerExt`: our additions for consumers (spec/protocol.md)."""

    def __init__(self, consumers: ConsumerService) -> None:
        self._consumers = consumers

    async def subscribe_at(self, request: ext_pb.SubscribeAtRequest) -> pb.ConsumerResponse:
        if not requests.present(request.request):
            raise invalid("request (the ConsumerRequest) is required")
        start = requests.start_position(request.start)
        return await self._consumers.subscribe(request.request, start)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube_ext.ConsumerExt/SubscribeAt": unary(
                self.subscribe_at, ext_pb.SubscribeAtRequest, pb.ConsumerResponse
            ),
        }
