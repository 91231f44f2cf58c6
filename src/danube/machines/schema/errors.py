"""Errors of the schema layer, in words a user can act on."""

from __future__ import annotations


class SchemaParseError(ValueError):
    """A definition that is no valid schema of its type: the message says where and why
    (a line and column for Protobuf, a JSON path for JSON Schema and Avro)."""
