"""The six schema types behind one face: parse a definition, compare two schemas, validate a
payload. Everything format-specific lives in `avro`, `json_schema` and `protobuf`; the
registry and the broker see only `ParsedSchema`."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from danube.machines.schema import (
    avro,
    avro_binary,
    avro_compat,
    json_compat,
    json_schema,
    protobuf,
)
from danube.machines.schema.budget import LimitExceeded
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.limits import MAX_VALIDATED_BYTES
from danube.values.errors import quoted


class SchemaType(enum.Enum):
    BYTES = "bytes"
    STRING = "string"
    NUMBER = "number"
    AVRO = "avro"
    JSON_SCHEMA = "json_schema"
    PROTOBUF = "protobuf"


ALIASES = {
    **{kind.value: kind for kind in SchemaType},
    "int64": SchemaType.NUMBER,
    "int": SchemaType.NUMBER,
    "float": SchemaType.NUMBER,
    "double": SchemaType.NUMBER,
    "json": SchemaType.JSON_SCHEMA,
    "proto": SchemaType.PROTOBUF,
}
"""Danube's names and aliases, matched without regard to case."""

SIMPLE = (SchemaType.BYTES, SchemaType.STRING, SchemaType.NUMBER)

Form = avro.AvroSchema | json_schema.JsonSchema | protobuf.ProtoSchema | None


def schema_type(text: str) -> SchemaType:
    found = ALIASES.get(text.strip().lower())
    if found is None:
        known = ", ".join(kind.value for kind in SchemaType)
        raise SchemaParseError(f"unknown schema type {quoted(text)} (one of {known})")
    return found


@dataclass(frozen=True)
class ParsedSchema:
    schema_type: SchemaType
    definition: bytes
    fingerprint: str
    form: Form
    compiled: bytes = b""
    """Protobuf: the FileDescriptorSet the compiler made of `definition`."""
    message: str = ""
    """Protobuf: the message type payloads are."""


def parse(
    kind: SchemaType, definition: bytes, *, compiled: bytes = b"", message: str = ""
) -> ParsedSchema:
    """A Protobuf definition comes with its compiled descriptor set (`danube.protoc`
    makes it: compiling runs a program, which no pure code may do)."""
    if kind in SIMPLE:
        return ParsedSchema(kind, definition, kind.value, None)
    if kind is SchemaType.AVRO:
        parsed_avro = avro.parse_avro(definition)
        return ParsedSchema(kind, definition, parsed_avro.fingerprint, parsed_avro)
    if kind is SchemaType.JSON_SCHEMA:
        parsed_json = json_schema.parse_json_schema(definition)
        return ParsedSchema(kind, definition, parsed_json.fingerprint, parsed_json)
    if not compiled:
        raise SchemaParseError("a Protobuf schema must be compiled before it is parsed")
    parsed_proto = protobuf.from_descriptor_set(compiled, message or None)
    return ParsedSchema(
        kind,
        definition,
        parsed_proto.fingerprint,
        parsed_proto,
        compiled=compiled,
        message=parsed_proto.message,
    )


def incompatibilities(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why a consumer holding `reader` cannot read what `writer` wrote (empty: it can)."""
    if reader.schema_type is not writer.schema_type:
        return [f"a {reader.schema_type.value} reader cannot read {writer.schema_type.value}"]
    r, w = reader.form, writer.form
    if isinstance(r, avro.AvroSchema) and isinstance(w, avro.AvroSchema):
        found = avro_compat.avro_can_read(r, w)
    elif isinstance(r, json_schema.JsonSchema) and isinstance(w, json_schema.JsonSchema):
        found = json_compat.json_can_read(r, w)
    elif isinstance(r, protobuf.ProtoSchema) and isinstance(w, protobuf.ProtoSchema):
        found = protobuf.proto_can_read(r, w)
    else:
        found = []
    return [str(problem) for problem in found]


def validate(schema: ParsedSchema, payload: bytes) -> str | None:
    """None when `payload` is a valid message of `schema`, else what is wrong with it;
    `budget.LimitExceeded` when the payload is larger than MAX_VALIDATED_BYTES or its check
    needs more than the budget in force."""
    if len(payload) > MAX_VALIDATED_BYTES:
        raise LimitExceeded(
            "validated payload bytes",
            f"a payload checked against a schema may be {MAX_VALIDATED_BYTES} bytes, this one "
            f"is {len(payload)}",
        )
    form = schema.form
    if isinstance(form, avro.AvroSchema):
        return avro_binary.validate_datum(form, payload)
    if isinstance(form, json_schema.JsonSchema):
        return json_schema.validate_payload(form, payload)
    if isinstance(form, protobuf.ProtoSchema):
        return protobuf.validate_payload(form, payload)
    if schema.schema_type is SchemaType.STRING:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as error:
            return f"not UTF-8 text: {error.reason} at byte {error.start}"
    if schema.schema_type is SchemaType.NUMBER and len(payload) not in (4, 8):
        return f"a number is 4 or 8 bytes (an int32/float or int64/double), got {len(payload)}"
    return None
