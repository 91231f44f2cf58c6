"""Prints, as JSON keyed by full name, every proto file, message, field, enum, enum value, service
and method that the official Python client (`danube-client`) was generated from.

It must run under the official client's interpreter (`python -I`, so PYTHONPATH cannot put our
own `danube` package first): both distributions import as `danube`, so they cannot share an
environment. test_official_client_descriptors.py compares the output with our protos through
`flatten`, which needs nothing but descriptor_pb2 and therefore loads in both environments.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2

Entry = dict[str, Any]
FieldProto = descriptor_pb2.FieldDescriptorProto


def flatten(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> dict[str, Entry]:
    """One entry per named element, so two descriptor sets compare with plain dict equality and a
    mismatch names the exact element. Type names lose their leading dot to read like the spec."""
    out: dict[str, Entry] = {}
    for file in files:
        out[file.name] = {"kind": "file", "package": file.package}
        for message in file.message_type:
            _add_message(out, file.package, message)
        for enum in file.enum_type:
            _add_enum(out, file.package, enum)
        for service in file.service:
            service_name = f"{file.package}.{service.name}"
            out[service_name] = {"kind": "service"}
            for method in service.method:
                out[f"{service_name}.{method.name}"] = {
                    "kind": "method",
                    "input_type": method.input_type.lstrip("."),
                    "output_type": method.output_type.lstrip("."),
                    "client_streaming": method.client_streaming,
                    "server_streaming": method.server_streaming,
                }
    return out


def _add_message(
    out: dict[str, Entry], scope: str, message: descriptor_pb2.DescriptorProto
) -> None:
    name = f"{scope}.{message.name}"
    out[name] = {"kind": "message", "map_entry": message.options.map_entry}
    for field in message.field:
        # proto3 `optional` lives in a synthetic oneof named by protoc; it is not part of the
        # wire contract, so only real oneofs are recorded and presence shows in proto3_optional.
        real_oneof = field.HasField("oneof_index") and not field.proto3_optional
        out[f"{name}.{field.name}"] = {
            "kind": "field",
            "number": field.number,
            "type": FieldProto.Type.Name(field.type),
            "type_name": field.type_name.lstrip("."),
            "label": FieldProto.Label.Name(field.label),
            "proto3_optional": field.proto3_optional,
            "oneof": message.oneof_decl[field.oneof_index].name if real_oneof else None,
        }
    for nested in message.nested_type:
        _add_message(out, name, nested)
    for enum in message.enum_type:
        _add_enum(out, name, enum)


def _add_enum(out: dict[str, Entry], scope: str, enum: descriptor_pb2.EnumDescriptorProto) -> None:
    name = f"{scope}.{enum.name}"
    out[name] = {"kind": "enum"}
    for value in enum.value:
        out[f"{name}.{value.name}"] = {"kind": "enum_value", "number": value.number}


def official_files() -> list[descriptor_pb2.FileDescriptorProto]:
    """Every `*_pb2` module shipped in the official client, so a proto file added by a newer
    client release is compared too instead of being silently ignored."""
    package = importlib.import_module("danube.proto")
    files = []
    for module_info in pkgutil.iter_modules(package.__path__):
        if module_info.name.endswith("_pb2"):
            module = importlib.import_module(f"{package.__name__}.{module_info.name}")
            file = descriptor_pb2.FileDescriptorProto()
            module.DESCRIPTOR.CopyToProto(file)
            files.append(file)
    return files


if __name__ == "__main__":
    print(json.dumps(flatten(official_files()), indent=1, sort_keys=True))
