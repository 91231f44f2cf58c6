"""Protobuf schemas: descriptors, payload validation and wire compatibility.

Why protoc: the registry has to turn a `.proto` text into real descriptors. Google's own
compiler (shipped in grpcio-tools, maintained together with protobuf) gives exactly the
semantics every other Protobuf user gets — proto2, proto3, editions, imports of the
well-known types, name resolution, option checks — with its own error messages, instead of a
third-party re-implementation of the grammar that would drift from it.

Compiling runs protoc, which is I/O: `danube.protoc` does it, outside this pure package,
and the descriptor set it makes is stored with each version; everything here works on that
set.

Compatibility follows the wire rules of the protobuf language guide ("Updating a message
type") in the spirit of Confluent Schema Registry's Protobuf checks; see `proto_can_read`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message

from danube.machines.schema.compatibility import Incompatibility
from danube.machines.schema.errors import SchemaParseError
from danube.values.errors import quoted

SCHEMA_FILE = "schema.proto"
"""The name the compiler gives the schema's file, so descriptors and error messages never
carry a temporary path."""

_FT = descriptor_pb2.FieldDescriptorProto

_WIRE_GROUPS: dict[int, str] = {
    _FT.TYPE_INT32: "varint",
    _FT.TYPE_UINT32: "varint",
    _FT.TYPE_INT64: "varint",
    _FT.TYPE_UINT64: "varint",
    _FT.TYPE_BOOL: "varint",
    _FT.TYPE_SINT32: "zigzag",
    _FT.TYPE_SINT64: "zigzag",
    _FT.TYPE_FIXED32: "fixed32",
    _FT.TYPE_SFIXED32: "fixed32",
    _FT.TYPE_FIXED64: "fixed64",
    _FT.TYPE_SFIXED64: "fixed64",
    _FT.TYPE_FLOAT: "float",
    _FT.TYPE_DOUBLE: "double",
    _FT.TYPE_STRING: "text",
    _FT.TYPE_BYTES: "text",
    _FT.TYPE_ENUM: "enum",
}
"""Scalar types that read each other's encoding (language guide): a value written as one
type of a group is parsed, possibly truncated or reinterpreted, by any type of the group."""

_ENUM_COMPATIBLE = frozenset({_FT.TYPE_INT32, _FT.TYPE_UINT32, _FT.TYPE_INT64, _FT.TYPE_UINT64})
"""The guide calls enum compatible with these integers; bool is not listed, so not here."""


@dataclass(frozen=True)
class ProtoSchema:
    """A compiled `.proto` file and the message type its payloads carry. Only the three
    fields are the value (compared, hashed, stored); the descriptor pool and message class
    are derived on first use and cached on the object, because building them costs far more
    than a payload check."""

    descriptor_set: bytes = field(repr=False)
    """A serialized FileDescriptorSet: the schema file last, its imports before it."""
    message: str
    """The full name of the message type, e.g. `shop.Order`."""
    fingerprint: str
    """"sha256:" + hex SHA-256 of the message name and the schema file's descriptor,
    serialized deterministically. protoc keeps comments, whitespace and positions out of the
    descriptor (no `--include_source_info`), so texts that differ only in those are equal.
    Imported files are left out, so that a grpcio-tools upgrade touching a well-known type
    does not make an unchanged schema look new."""

    @cached_property
    def pool(self) -> descriptor_pool.DescriptorPool:
        pool = descriptor_pool.DescriptorPool()
        for file in _file_set(self.descriptor_set).file:
            pool.AddSerializedFile(file.SerializeToString())
        return pool

    @cached_property
    def descriptor(self) -> Descriptor:
        return self.pool.FindMessageTypeByName(self.message)

    @cached_property
    def message_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.descriptor)

    @cached_property
    def _message_protos(self) -> dict[str, descriptor_pb2.DescriptorProto]:
        """The raw DescriptorProtos by full name: protobuf's Python Descriptor objects do not
        expose reserved ranges and names, nor whether a oneof is proto3's synthetic one for
        `optional`."""
        return {
            name: proto
            for file in _file_set(self.descriptor_set).file
            for name, proto in _walk_messages(file.package, file.message_type)
        }


def from_descriptor_set(compiled: bytes, message: str | None = None) -> ProtoSchema:
    """The schema of a compiled `.proto` file (`danube.protoc.compile_proto` makes the
    descriptor set: compiling runs a program, which this pure module must not) and the
    message type its payloads carry: `message` by full name, or the file's first top-level
    message. Raises SchemaParseError naming the messages the file does define."""
    file_set = _file_set(compiled)
    schema_file = next((file for file in file_set.file if file.name == SCHEMA_FILE), None)
    if schema_file is None:
        raise SchemaParseError(f"the descriptor set holds no {SCHEMA_FILE}")
    defined = [
        name
        for name, proto in _walk_messages(schema_file.package, schema_file.message_type)
        if not proto.options.map_entry
    ]
    if not defined:
        raise SchemaParseError(f"{SCHEMA_FILE}: defines no message type")
    if message is None:
        prefix = f"{schema_file.package}." if schema_file.package else ""
        message = prefix + schema_file.message_type[0].name
    elif message not in defined:
        raise SchemaParseError(
            f"{SCHEMA_FILE}: no message type {quoted(message)}; it defines: {', '.join(defined)}"
        )
    canonical = message.encode() + b"\0" + schema_file.SerializeToString(deterministic=True)
    return ProtoSchema(
        descriptor_set=compiled,
        message=message,
        fingerprint="sha256:" + hashlib.sha256(canonical).hexdigest(),
    )


def validate_payload(schema: ProtoSchema, payload: bytes) -> str | None:
    """Why `payload` is not a message of the schema's type, or None when it is. Required
    fields (proto2) are checked too: a parser accepts a message without them, but every
    consumer's generated code would refuse it."""
    try:
        decoded = schema.message_class.FromString(payload)
    except (DecodeError, ValueError) as exc:
        return f"not a valid {schema.message}: {exc}"
    missing = decoded.FindInitializationErrors()
    if missing:
        return f"not a valid {schema.message}: missing required fields: {', '.join(missing)}"
    return None


def encode_json_message(schema: ProtoSchema, text: str) -> bytes:
    """The binary message for a JSON document in protobuf's JSON mapping, so a CLI user can
    type a message instead of bytes. Raises ValueError naming the offending field."""
    try:
        decoded = json_format.Parse(text, schema.message_class(), descriptor_pool=schema.pool)
        return decoded.SerializeToString()
    except (json_format.Error, EncodeError) as exc:
        raise ValueError(f"not a valid {schema.message}: {exc}") from exc


def proto_can_read(reader: ProtoSchema, writer: ProtoSchema) -> list[Incompatibility]:
    """Every reason a consumer with `reader` could misread a message written with `writer`.

    The chosen messages are compared field by field, matched by number (names never reach
    the wire, so a rename is not reported), recursing into message fields:
    - types must share a wire group (see `_WIRE_GROUPS`; enum also reads int32/uint32/
      int64/uint64); a message against a scalar, or a group against a message, never does;
    - singular against repeated is refused; packed against unpacked repeated is not, as
      every parser accepts both encodings;
    - a field `required` in the reader must be required in the writer;
    - a writer field the reader does not have is fine (kept as unknown) unless the reader
      reserves its number, or its name while not using the number for a renamed field (a
      rename that reserves the old name is the guide's own advice);
    - a closed (proto2) reader enum must define every number the writer can send; open
      (proto3) enums keep unknown numbers;
    - a reader oneof must not hold fields the writer can set together (Confluent's
      MULTIPLE_FIELDS_MOVED_TO_ONEOF / FIELD_MOVED_TO_EXISTING_ONEOF; one field moving
      into a new oneof is safe), and a field may not leave a writer oneof that has other
      fields (ONEOF_FIELD_REMOVED); proto3 `optional`'s synthetic oneofs do not count;
    - the root message's full name must be the same.
    A message pair is compared once (recursive types terminate), at the first path met."""
    found: list[Incompatibility] = []
    if reader.message != writer.message:
        found.append(
            Incompatibility(
                reader.message,
                f"the root message is {reader.message} in the reader but {writer.message} "
                "in the writer",
            )
        )
    _Comparison(reader, writer, found).messages(
        reader.descriptor, writer.descriptor, reader.message
    )
    return found


class _Comparison:
    """One `proto_can_read` walk: the message pairs already compared, and the findings."""

    def __init__(
        self, reader: ProtoSchema, writer: ProtoSchema, found: list[Incompatibility]
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._found = found
        self._seen: set[tuple[str, str]] = set()

    def _report(self, path: str, message: str) -> None:
        self._found.append(Incompatibility(path, message))

    def messages(self, reader: Descriptor, writer: Descriptor, path: str) -> None:
        if (reader.full_name, writer.full_name) in self._seen:
            return
        self._seen.add((reader.full_name, writer.full_name))
        reader_proto = self._reader._message_protos[reader.full_name]
        for written in writer.fields:
            read = reader.fields_by_number.get(written.number)
            if read is None:
                self._unread(reader_proto, written, f"{path}.{written.name}[{written.number}]")
            else:
                self._fields(read, written, f"{path}.{read.name}[{read.number}]")
        for read in reader.fields:
            written = writer.fields_by_number.get(read.number)
            if read.is_required and written is None:
                self._report(
                    f"{path}.{read.name}[{read.number}]",
                    "is required in the reader but the writer has no such field",
                )
            elif read.is_required and not written.is_required and not written.is_repeated:
                self._report(
                    f"{path}.{read.name}[{read.number}]",
                    "is required in the reader but optional in the writer, which may omit it",
                )
        self._oneofs(reader, writer, path)

    def _unread(
        self, reader_proto: descriptor_pb2.DescriptorProto, written: FieldDescriptor, path: str
    ) -> None:
        if any(r.start <= written.number < r.end for r in reader_proto.reserved_range):
            self._report(
                path,
                f"the writer uses field number {written.number}, which the reader reserves "
                "(declares must never be used)",
            )
        elif written.name in reader_proto.reserved_name:
            self._report(
                path,
                f"the writer uses field name {quoted(written.name)}, which the reader reserves "
                "(declares must never be used)",
            )

    def _fields(self, read: FieldDescriptor, written: FieldDescriptor, path: str) -> None:
        if read.is_repeated != written.is_repeated:
            self._report(
                path,
                f"is {_cardinality(read)} in the reader but {_cardinality(written)} in the writer",
            )
        read_nested = read.type in (_FT.TYPE_MESSAGE, _FT.TYPE_GROUP)
        written_nested = written.type in (_FT.TYPE_MESSAGE, _FT.TYPE_GROUP)
        if read_nested and written_nested and read.type == written.type:
            self.messages(read.message_type, written.message_type, path)
        elif read_nested or written_nested or not _scalars_compatible(read.type, written.type):
            self._report(
                path,
                f"has type {_type_name(read)} in the reader but {_type_name(written)} in "
                "the writer: their wire encodings differ",
            )
        elif read.type == _FT.TYPE_ENUM and read.enum_type.is_closed:
            self._closed_enum(read, written, path)

    def _closed_enum(self, read: FieldDescriptor, written: FieldDescriptor, path: str) -> None:
        known = {value.number for value in read.enum_type.values}
        if written.type != _FT.TYPE_ENUM:
            self._report(
                path,
                f"the writer's {_type_name(written)} can carry any number, but the reader's "
                f"closed enum {read.enum_type.full_name} drops numbers it does not define",
            )
            return
        unknown = [
            f"{value.name} = {value.number}"
            for value in written.enum_type.values
            if value.number not in known
        ]
        if unknown:
            self._report(
                path,
                f"the reader's closed enum {read.enum_type.full_name} drops the writer's "
                f"values {', '.join(unknown)}",
            )

    def _oneofs(self, reader: Descriptor, writer: Descriptor, path: str) -> None:
        for oneof in reader.oneofs:
            members = [
                (read, self._oneof_name(self._writer, writer.fields_by_number[read.number]))
                for read in oneof.fields
                if read.number in writer.fields_by_number
            ]
            origins = Counter(origin for _, origin in members)
            if len(members) < 2 or (len(origins) == 1 and None not in origins):
                continue
            home = max(
                (origin for origin in origins if origin is not None),
                key=lambda origin: origins[origin],
                default=None,
            )
            for read, origin in members:
                if home is not None and origin == home:
                    continue
                source = "from outside any oneof" if origin is None else f"from oneof {origin}"
                together = ", ".join(
                    other.name
                    for other, other_origin in members
                    if other is not read and (origin is None or other_origin != origin)
                )
                self._report(
                    f"{path}.{read.name}[{read.number}]",
                    f"moved {source} into the reader's oneof {oneof.name}: the writer can set "
                    f"it together with {together}, the reader keeps only the last one set",
                )
        for written in writer.fields:
            read = reader.fields_by_number.get(written.number)
            origin = self._oneof_name(self._writer, written)
            if read is None or origin is None or self._oneof_name(self._reader, read) is not None:
                continue
            others = [f.name for f in written.containing_oneof.fields if f is not written]
            if others:
                self._report(
                    f"{path}.{read.name}[{read.number}]",
                    f"moved out of the writer's oneof {origin}: the reader no longer treats it "
                    f"as exclusive with {', '.join(others)}",
                )

    @staticmethod
    def _oneof_name(schema: ProtoSchema, field_descriptor: FieldDescriptor) -> str | None:
        """The field's real oneof, None outside any (proto3 `optional` is not a oneof)."""
        oneof = field_descriptor.containing_oneof
        if oneof is None:
            return None
        proto = schema._message_protos[field_descriptor.containing_type.full_name]
        declared = next(f for f in proto.field if f.number == field_descriptor.number)
        return None if declared.proto3_optional else oneof.name


def _file_set(serialized: bytes) -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString(serialized)


def _walk_messages(
    scope: str, messages: Iterable[descriptor_pb2.DescriptorProto]
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """Every message with its full name, nested ones after their parent, in file order."""
    for proto in messages:
        name = f"{scope}.{proto.name}" if scope else proto.name
        yield name, proto
        yield from _walk_messages(name, proto.nested_type)


def _scalars_compatible(read: int, written: int) -> bool:
    if _WIRE_GROUPS[read] == _WIRE_GROUPS[written]:
        return True
    pair = {read, written}
    return _FT.TYPE_ENUM in pair and bool(pair & _ENUM_COMPATIBLE)


def _cardinality(field_descriptor: FieldDescriptor) -> str:
    return "repeated" if field_descriptor.is_repeated else "singular"


def _type_name(field_descriptor: FieldDescriptor) -> str:
    if field_descriptor.type == _FT.TYPE_MESSAGE:
        return f"message {field_descriptor.message_type.full_name}"
    if field_descriptor.type == _FT.TYPE_GROUP:
        return f"group {field_descriptor.message_type.full_name}"
    if field_descriptor.type == _FT.TYPE_ENUM:
        return f"enum {field_descriptor.enum_type.full_name}"
    return _FT.Type.Name(field_descriptor.type).removeprefix("TYPE_").lower()
