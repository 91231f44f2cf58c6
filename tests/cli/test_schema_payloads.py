"""What `danube-cli produce` sends and `consume` prints for each schema type: JSON typed for
Avro goes out as one binary datum, payloads that do not fit are refused before anything is
sent, naming the field (issue 8, point 5)."""

from __future__ import annotations

import json

import pytest

from danube.cli.schema_payloads import PayloadError, SchemaPayloads
from danube.client import WriterSchema

ORDER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}],
    }
).encode()
ORDER_JSON = json.dumps(
    {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
    }
).encode()


def payloads(schema_type: str, definition: bytes = b"") -> SchemaPayloads:
    return SchemaPayloads.of(WriterSchema("orders", 7, 2, schema_type, definition))


def test_avro_json_goes_out_as_a_binary_datum_and_comes_back_as_json() -> None:
    codec = payloads("avro", ORDER_AVRO)
    sent = codec.encode(b'{"id": 1, "note": "tea"}')
    assert sent == b"\x02\x06tea"
    assert json.loads(codec.render(sent)) == {"id": 1, "note": "tea"}


@pytest.mark.parametrize(
    ("typed", "words"),
    [
        (b'{"id": "one", "note": "tea"}', "field 'id': expected long, got str"),
        (b'{"id": 1}', "field 'note'"),
        (b"id=1", "takes a JSON value"),
    ],
)
def test_avro_input_that_does_not_fit_names_the_problem(typed: bytes, words: str) -> None:
    with pytest.raises(PayloadError, match="orders v2 \\(avro\\)") as raised:
        payloads("avro", ORDER_AVRO).encode(typed)
    assert words in str(raised.value)


def test_a_payload_that_is_no_avro_datum_is_not_rendered_as_one() -> None:
    with pytest.raises(PayloadError, match="not a datum of orders v2"):
        payloads("avro", ORDER_AVRO).render(b"\x02\x10ab")


def test_json_schema_payloads_are_sent_as_typed_after_the_check() -> None:
    codec = payloads("json_schema", ORDER_JSON)
    assert codec.encode(b'{"id": 3}') == b'{"id": 3}'
    assert codec.render(b'{"id": 3}') == '{"id": 3}'
    with pytest.raises(PayloadError, match="'three' is not of type 'integer'"):
        codec.encode(b'{"id": "three"}')
    with pytest.raises(PayloadError, match="'id' is a required property"):
        codec.render(b"{}")


def test_string_and_number_payloads_are_checked_and_bytes_anything_goes() -> None:
    with pytest.raises(PayloadError, match="not UTF-8"):
        payloads("string").encode(b"\xff")
    with pytest.raises(PayloadError, match="4 or 8 bytes"):
        payloads("number").encode(b"42")
    assert payloads("number").encode(b"\x00" * 8) == b"\x00" * 8
    assert payloads("bytes").encode(b"\xff\x00") == b"\xff\x00"
    assert payloads("bytes").render(b"\xff\x00") == "<2 bytes> ff00"


def test_protobuf_payloads_are_passed_through_for_the_broker_to_check() -> None:
    codec = payloads("protobuf", b'syntax = "proto3"; message M { int64 id = 1; }')
    assert codec.encode(b"\x08\x01") == b"\x08\x01"


def test_a_definition_that_does_not_parse_here_is_an_error_not_a_traceback() -> None:
    with pytest.raises(PayloadError, match="cannot be read here"):
        payloads("avro", b"{not json")
