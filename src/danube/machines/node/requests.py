"""Danube's client requests applied to the broker core: the one translation from wire messages
to core calls, shared by the gRPC services (`danube.runtime.data_plane`) and the simulator
(`sim/`), so both exercise the same validation and the same calls. Pure: no I/O, no clock
(callers pass `now_ms`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube.machines.dispatch import LATEST, StartKind, StartPosition
from danube.machines.node.core import BrokerCore, Step
from danube.machines.wal import records
from danube.values.config import DispatchStrategy
from danube.values.errors import invalid
from danube.values.frozen import fast_init

if TYPE_CHECKING:  # the generated modules import grpclib (their service stubs)
    import betterproto

    from danube.proto import danube as pb
    from danube.proto import danube_ext as ext_pb


def present(message: betterproto.Message) -> bool:
    """Whether an embedded message field was sent at all (betterproto fills defaults).
    betterproto is imported here, not with the module: it loads asyncio, and the caller
    that holds a message has loaded it already."""
    import betterproto

    return betterproto.serialized_on_wire(message)


def schema_subject(request: pb.ProducerRequest) -> str | None:
    """The subject a producer's `schema_ref` names, None without one."""
    if not present(request.schema_ref):
        return None
    if not request.schema_ref.subject:
        raise invalid("schema_ref needs a subject")
    return request.schema_ref.subject


def create_producer(core: BrokerCore, request: pb.ProducerRequest) -> Step[int]:
    strategy = int(request.dispatch_strategy)
    if strategy not in (0, 1):
        raise invalid(f"unknown dispatch strategy {strategy}")
    access_mode = int(request.producer_access_mode)
    if access_mode not in (0, 1):
        raise invalid(
            f"unknown producer access mode {access_mode}; expected 0 (Shared) or 1 (Exclusive)"
        )
    return core.create_producer(
        request.topic_name,
        request.producer_name,
        access_mode=access_mode,
        strategy=DispatchStrategy(strategy),
    )


@fast_init
@dataclass(frozen=True, slots=True)
class Published:
    step: Step[int]
    """Its value is the message's offset."""
    stored: bool
    """Reliable topic: answer only once a `PublishAcked` covers the offset."""


def publish(core: BrokerCore, message: records.Record, now_ms: int) -> Published:
    """Publishes; stamps `topic_offset` with the message's offset. Reliable topics store the
    stamped record; non-reliable ones deliver the record itself, stamped with the publish
    sequence before the caller's next await (`encoded` encodes it when it goes out)."""
    if not message.has_msg_id:
        raise invalid("msg_id is required (it names the producer and the topic)")
    stored = False

    def encode(offset: int) -> bytes:
        nonlocal stored
        stored = True
        message.topic_offset = offset
        return records.encode(message)

    routing_key = message.routing_key
    step = core.publish(
        message.producer_id,
        message.topic_name,
        message,
        len(message.payload),
        routing_key.encode() if routing_key is not None else None,
        encode=encode,
        now_ms=now_ms,
    )
    if not stored:
        message.topic_offset = step.value
    return Published(step, stored)


def subscribe(
    core: BrokerCore, request: pb.ConsumerRequest, start: StartPosition, now_ms: int
) -> Step[int]:
    return core.subscribe(
        request.topic_name,
        request.consumer_name,
        request.subscription,
        int(request.subscription_type),
        tuple(request.key_filters),
        start,
        now_ms=now_ms,
    )


def start_position(wire: ext_pb.StartPosition) -> StartPosition:
    import betterproto  # loaded by the caller that holds the message (see `present`)

    which, value = betterproto.which_one_of(wire, "position")
    if which == "earliest":
        return StartPosition(StartKind.EARLIEST)
    if which == "offset":
        return StartPosition(StartKind.OFFSET, value)
    return LATEST


@dataclass(slots=True)
class Acknowledgement:
    """An `AckRequest` or a `NackRequest` as the core reads it, its `msg_id` flattened (the
    broker decodes these by hand: `danube.runtime.wire_codec`)."""

    request_id: int = 0
    has_msg_id: bool = False
    topic_name: str = ""
    topic_offset: int = 0
    subscription_name: str = ""
    delay_ms: int | None = None
    """Nack only: redeliver after this long; None leaves it to the failure policy."""
    reason: str | None = None
    """Nack only: why, in the client's words (a dead letter's `x-failure-reason`)."""


def acknowledgement(request: pb.AckRequest | pb.NackRequest) -> Acknowledgement:
    """The same from a betterproto message (the simulator's clients send those)."""
    msg_id = request.msg_id
    return Acknowledgement(
        request.request_id,
        present(msg_id),
        msg_id.topic_name,
        msg_id.topic_offset,
        request.subscription_name,
        getattr(request, "delay_ms", None),  # a NackRequest's; an AckRequest has none
        getattr(request, "reason", None),
    )


def _check_target(request: Acknowledgement) -> None:
    if not request.has_msg_id:
        raise invalid("msg_id is required (it names the topic and the offset)")


def ack(core: BrokerCore, request: Acknowledgement, now_ms: int) -> Step[None]:
    _check_target(request)
    return core.ack(
        request.topic_name, request.subscription_name, request.topic_offset, now_ms=now_ms
    )


def nack(core: BrokerCore, request: Acknowledgement, now_ms: int) -> Step[None]:
    _check_target(request)
    return core.nack(
        request.topic_name,
        request.subscription_name,
        request.topic_offset,
        request.delay_ms,
        now_ms=now_ms,
        reason=request.reason,
    )


def record_of(message: pb.StreamMessage) -> records.Record:
    """The record of a betterproto message (the simulator's clients send those)."""
    msg_id = message.msg_id
    return records.Record(
        message.request_id,
        msg_id.producer_id,
        msg_id.topic_name,
        msg_id.broker_addr,
        msg_id.topic_offset,
        message.payload,
        message.publish_time,
        message.producer_name,
        message.subscription_name,
        message.attributes,
        message.schema_id,
        message.schema_version,
        message.routing_key,
        present(msg_id),
    )


def encoded(item: object) -> bytes:
    """The `StreamMessage` a receive stream sends for an item `BrokerCore.take` returned:
    reliable topics hand out stored records (bytes), non-reliable ones the published
    `records.Record`."""
    if isinstance(item, bytes):
        return item
    assert isinstance(item, records.Record)
    return records.encode(item)
