"""google.protobuf's own parser (upb) as an oracle process: reads lines `<message> <hex>` on
stdin and answers each with one JSON line: whether upb parses `danube.<message>` from the bytes,
whether every other Danube client's parser would too, and the fields upb read.

A separate process so that the oracle is certainly upb, whatever implementation the test
process loaded first, and so that `--official` can run under the official client's
interpreter. It imports neither danube nor hypothesis: run it as `python -I upb_server.py
[--official]`. With `--official` it uses the official danube-client's generated classes
(`danube.proto.DanubeApi_pb2`), under the official client's interpreter; otherwise it builds
them from proto/DanubeApi.proto with grpc_tools.

Other parsers are stricter than upb in three ways (spec/record-validity.md), each read from
upb's own result where it can be: a known field upb kept as unknown (another wire type, or an
attributes entry holding anything but its key and value), a group anywhere, and a 10-byte
varint whose last byte is above 1 (upb takes it; prost and Go refuse it), which a small walker
below finds.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
from typing import Any

from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

PROTO_DIR = pathlib.Path(__file__).resolve().parents[2] / "proto"
GROUP = 3


def _built_classes() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as scratch:
        out = pathlib.Path(scratch) / "danube.binpb"
        args = ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", "DanubeApi.proto"]
        assert protoc.main(args) == 0, "protoc refused proto/DanubeApi.proto"
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)

    def find(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"danube.{name}"))

    return find


def _official_classes() -> Any:
    from danube.proto import DanubeApi_pb2  # the official client's generated module

    return lambda name: getattr(DanubeApi_pb2, name)


def _is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _kept_unknown_what_others_refuse(message: Any) -> bool:
    known = message.DESCRIPTOR.fields_by_number
    for unknown in UnknownFieldSet(message):
        if unknown.field_number in known or unknown.wire_type == GROUP:
            return True
    for field, value in message.ListFields():
        nested = field.message_type is not None and not _is_map(field)
        if nested and _kept_unknown_what_others_refuse(value):
            return True
    return False


def _walk_varint(data: bytes, pos: int) -> tuple[int, int, int]:
    value = size = 0
    while True:
        byte = data[pos + size]
        value |= (byte & 0x7F) << (7 * size)
        size += 1
        if byte < 0x80:
            return value, pos + size, byte


def _has_wide_varint(descriptor: Any, data: bytes) -> bool:
    """Whether bytes upb parsed hold a value varint of 10 bytes whose last byte is above 1,
    in this message or a message-typed field (an attributes entry holding a varint is refused
    for that already)."""
    pos = 0
    while pos < len(data):
        tag, pos, _ = _walk_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            start = pos
            _, pos, last = _walk_varint(data, pos)
            if pos - start == 10 and last > 1:
                return True
        elif wire == 2:
            size, pos, _ = _walk_varint(data, pos)
            field = descriptor.fields_by_number.get(number)
            nested = field is not None and field.message_type is not None and not _is_map(field)
            if nested and _has_wide_varint(field.message_type, data[pos : pos + size]):
                return True
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            return False  # a group: refused for being one
    return False


def plain(message: Any) -> dict[str, Any]:
    """Every field upb read: bytes as hex, an unset message or optional field as None."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            out[field.name] = dict(value)
        elif field.message_type is not None:
            out[field.name] = plain(value) if message.HasField(field.name) else None
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = value.hex() if isinstance(value, bytes) else value
    return out


def answer(find: Any, name: str, data: bytes) -> dict[str, Any]:
    message = find(name)()
    try:
        message.ParseFromString(data)
    except DecodeError:
        return {"parsed": False, "accepted": False, "fields": None}
    accepted = not _kept_unknown_what_others_refuse(message) and not _has_wide_varint(
        message.DESCRIPTOR, data
    )
    return {"parsed": True, "accepted": accepted, "fields": plain(message)}


def main() -> None:
    assert api_implementation.Type() == "upb", f"not upb: {api_implementation.Type()}"
    find = _official_classes() if "--official" in sys.argv else _built_classes()
    for line in sys.stdin:
        name, _, hexed = line.strip().partition(" ")
        print(json.dumps(answer(find, name, bytes.fromhex(hexed))), flush=True)


if __name__ == "__main__":
    main()
