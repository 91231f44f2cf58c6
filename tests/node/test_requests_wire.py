"""`danube.machines.node.requests` reads betterproto messages without importing betterproto at
module load (it loads asyncio, which the machines must not): the functions that read a message
import it where they run. These would fail with a NameError if one did not."""

from __future__ import annotations

from danube.machines.dispatch import LATEST, StartKind, StartPosition
from danube.machines.node import requests
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb


def test_every_start_position_is_read() -> None:
    assert requests.start_position(ext_pb.StartPosition(earliest=True)) == StartPosition(
        StartKind.EARLIEST
    )
    assert requests.start_position(ext_pb.StartPosition(offset=42)) == StartPosition(
        StartKind.OFFSET, 42
    )
    assert requests.start_position(ext_pb.StartPosition(latest=True)) == LATEST
    assert requests.start_position(ext_pb.StartPosition()) == LATEST


def test_a_schema_reference_is_read_only_when_sent() -> None:
    plain = pb.ProducerRequest(topic_name="/default/t", producer_name="p")
    assert requests.schema_subject(plain) is None
    bound = pb.ProducerRequest(
        topic_name="/default/t", producer_name="p", schema_ref=pb.SchemaReference(subject="s")
    )
    assert requests.schema_subject(bound) == "s"


def test_an_acknowledgement_keeps_a_nacks_delay_and_an_acks_none() -> None:
    msg_id = pb.MsgId(topic_name="/default/t", topic_offset=3)
    ack = requests.acknowledgement(pb.AckRequest(request_id=1, msg_id=msg_id))
    nack = requests.acknowledgement(pb.NackRequest(request_id=2, msg_id=msg_id, delay_ms=500))
    assert ack.has_msg_id and ack.delay_ms is None
    assert nack.delay_ms == 500
