"""StreamMessage bytes must be identical between our betterproto types and the official client's
protobuf classes, in both directions. Descriptor equality does not prove this on its own: proto3
explicit presence (`schema_id = 0` must still be sent) and map encoding are codec behaviour."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import betterproto
import pytest

from danube.proto.danube import MsgId, StreamMessage

# Runs under the official interpreter. It decodes our bytes, re-encodes them, and also builds the
# message independently from plain values. deterministic=True sorts map keys, the one ordering
# protobuf guarantees; our messages insert attributes in that order.
OFFICIAL_SIDE = """
import json, sys
from danube.proto.DanubeApi_pb2 import StreamMessage

def plain(m):
    out = {}
    for f in m.DESCRIPTOR.fields:
        v = getattr(m, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.name] = dict(v)
        elif f.message_type is not None:
            out[f.name] = plain(v)
        elif f.has_presence and not m.HasField(f.name):
            out[f.name] = None
        elif f.type == f.TYPE_BYTES:
            out[f.name] = v.hex()
        else:
            out[f.name] = v
    return out

request = json.load(sys.stdin)
decoded = StreamMessage.FromString(bytes.fromhex(request["ours"]))
values = {k: v for k, v in request["values"].items() if v is not None}
values["payload"] = bytes.fromhex(values["payload"])
built = StreamMessage(**values)
json.dump({
    "decoded": plain(decoded),
    "reencoded": decoded.SerializeToString(deterministic=True).hex(),
    "built": built.SerializeToString(deterministic=True).hex(),
}, sys.stdout)
"""

CASES = {
    "explicit-zero-schema-id": StreamMessage(
        request_id=7,
        msg_id=MsgId(
            producer_id=3,
            topic_name="/default/orders-part-1",
            broker_addr="http://broker-1:6650",
            topic_offset=42,
        ),
        payload=b"\x00hello\xff",
        publish_time=1_700_000_000_123,
        producer_name="orders-producer",
        subscription_name="billing",
        attributes={"content-type": "json", "tenant": "acme", "trace": "α-β"},
        schema_id=0,
        routing_key="customer-17",
    ),
    # Clients always fill msg_id (topic name at least). betterproto cannot send a set-but-empty
    # submessage (it omits it where protobuf sends a zero-length field), so no case has one.
    "schema-version-only": StreamMessage(
        request_id=1, msg_id=MsgId(topic_offset=1), payload=b"x", schema_version=0
    ),
}


def _plain(message: StreamMessage) -> dict[str, Any]:
    """The same view the official side's `plain` produces: presence-less fields at their value,
    unset optional fields as None, bytes as hex so it survives JSON."""
    values = message.to_pydict(casing=betterproto.Casing.SNAKE, include_default_values=True)
    values["payload"] = values["payload"].hex()
    return values


@pytest.mark.conformance
@pytest.mark.parametrize("case", sorted(CASES))
def test_stream_message_bytes_identical_with_official_client(
    case: str, run_official: Callable[..., str]
) -> None:
    ours = CASES[case]
    ours_bytes = bytes(ours)
    request = {"ours": ours_bytes.hex(), "values": _plain(ours)}
    official = json.loads(run_official("-c", OFFICIAL_SIDE, stdin=json.dumps(request)))

    assert official["decoded"] == _plain(ours), "official client decodes our bytes differently"
    assert official["reencoded"] == ours_bytes.hex(), "official re-encoding of our bytes differs"
    assert official["built"] == ours_bytes.hex(), "official encoding of the same values differs"

    from_official = StreamMessage().parse(bytes.fromhex(official["built"]))
    assert _plain(from_official) == _plain(ours), "we decode the official bytes differently"
    assert bytes(from_official).hex() == official["built"], "our re-encoding of official differs"
