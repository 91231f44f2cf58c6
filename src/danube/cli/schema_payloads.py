"""Payloads of a schema for `danube-cli produce` and `consume`: what a user types becomes the
bytes a consumer of the schema reads, and a payload becomes text a user can read.

A user types JSON for JSON Schema and Avro subjects (as Confluent's console producers take
it): a JSON Schema payload is sent as typed, an Avro one is encoded as one binary datum,
which is what the broker validates and every Avro consumer decodes. Checking here, before
anything is sent, tells the user which field is wrong even where the topic's policy would
let the payload through. Protobuf payloads are sent as given (compiling the `.proto` to read
JSON would be a guess at which message type the subject writes); the broker checks them."""

from __future__ import annotations

import json
from dataclasses import dataclass

from danube.cli.usage import render_bytes as render_bytes  # re-exported: it lived here
from danube.client import WriterSchema
from danube.machines.schema import avro, formats
from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.formats import SchemaType


class PayloadError(ValueError):
    """The payload is not a message of the schema; the text says where."""


@dataclass(frozen=True)
class SchemaPayloads:
    schema: WriterSchema
    kind: SchemaType
    parsed: formats.ParsedSchema | None
    """None for Protobuf, which is not compiled here."""

    @classmethod
    def of(cls, schema: WriterSchema) -> SchemaPayloads:
        """Raises PayloadError when the registry's definition does not parse here."""
        try:
            kind = formats.schema_type(schema.schema_type)
            parsed = None if kind is SchemaType.PROTOBUF else formats.parse(kind, schema.definition)
        except SchemaParseError as error:
            raise PayloadError(f"{describe(schema)} cannot be read here: {error}") from None
        return cls(schema, kind, parsed)

    @property
    def name(self) -> str:
        return describe(self.schema)

    def encode(self, typed: bytes) -> bytes:
        """The payload to send for what the user gave; raises PayloadError saying what does
        not fit."""
        if self.parsed is None:
            return typed
        if self.kind is SchemaType.AVRO:
            assert isinstance(self.parsed.form, avro.AvroSchema)
            try:
                value = json.loads(typed)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise PayloadError(f"{self.name} takes a JSON value: {error}") from None
            try:
                return avro.encode_json_datum(self.parsed.form, value)
            except ValueError as error:
                raise PayloadError(f"not a datum of {self.name}: {error}") from None
        problem = formats.validate(self.parsed, typed)
        if problem is not None:
            raise PayloadError(f"not a message of {self.name}: {problem}")
        return typed

    def render(self, payload: bytes) -> str:
        """The payload as text; raises PayloadError when it is not a message of the schema."""
        if self.kind is SchemaType.AVRO:
            assert self.parsed is not None and isinstance(self.parsed.form, avro.AvroSchema)
            try:
                value = avro.decode_json_datum(self.parsed.form, payload)
            except ValueError as error:
                raise PayloadError(f"not a datum of {self.name}: {error}") from None
            return json.dumps(value, ensure_ascii=False)
        if self.parsed is not None:
            problem = formats.validate(self.parsed, payload)
            if problem is not None:
                raise PayloadError(f"not a message of {self.name}: {problem}")
        return render_bytes(payload)


def describe(schema: WriterSchema) -> str:
    """Version 0 is a schema not registered yet (`produce --schema-file` checks first)."""
    version = f"v{schema.version}" if schema.version else "from the schema file"
    return f"{schema.subject} {version} ({schema.schema_type})"
