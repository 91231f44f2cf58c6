"""`request_check` against protobuf's own parser (google.protobuf, built from proto/): every
valid request passes and decodes as protobuf decodes it, and of arbitrary damaged bytes the
check accepts only what protobuf accepts, with the same meaning. Where the check is stricter
than protobuf, it is for a reason spec/protocol.md states ("Limits on requests")."""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import betterproto
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from danube.proto import danube as pb
from danube.proto import danube_admin as admin_pb
from danube.proto import danube_ext as ext_pb
from danube.proto import danube_schema as schema_pb
from danube.runtime import request_check
from danube.runtime.request_check import RequestRejected, check, narrow, shape_of

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"
PACKAGES = {
    pb: "danube",
    ext_pb: "danube_ext",
    admin_pb: "danube_admin",
    schema_pb: "danube_schema",
}


def _request_types() -> list[type]:
    """Every request type of every service the broker serves (from the generated bases)."""
    found: dict[str, type] = {}
    for module in PACKAGES:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__name__.endswith("Base")
                and value.__module__ == module.__name__
            ):
                for handler in value().__mapping__().values():  # type: ignore[operator]
                    found[handler.request_type.__name__] = handler.request_type
    return sorted(found.values(), key=lambda cls: cls.__name__)


REQUEST_TYPES = _request_types()


@functools.cache
def _pool(tmp: str) -> descriptor_pool.DescriptorPool:
    out = Path(tmp) / "requests.binpb"
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            *protos,
        ],
        check=True,
        capture_output=True,
    )
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(file)
    return pool


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """protobuf's message class for one of ours."""
    pool = _pool(str(tmp_path_factory.mktemp("protoc")))

    def message_class(cls: type) -> Any:
        package = PACKAGES[sys.modules[cls.__module__]]
        return message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{package}.{cls.__name__}")
        )

    return message_class


# -- random valid messages, from the same field metadata ----------------------------------------

_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "uint64": st.integers(0, (1 << 64) - 1),
    "uint32": st.integers(0, (1 << 32) - 1),
    "int64": st.integers(-(1 << 63), (1 << 63) - 1),
    "int32": st.integers(-(1 << 31), (1 << 31) - 1),
    "bool": st.booleans(),
    "string": st.text(max_size=20),
    "bytes": st.binary(max_size=20),
    "double": st.floats(allow_nan=False),
}


def _value(cls: type, name: str, proto_type: str, depth: int) -> st.SearchStrategy[Any]:
    nested = cls._betterproto.cls_by_field.get(name)  # type: ignore[attr-defined]
    if proto_type == "enum":
        return st.sampled_from(list(nested))
    if proto_type == "message":
        return messages(nested, depth + 1)
    if proto_type == "map":
        meta = nested._betterproto.meta_by_field_name  # map entry: key (1), value (2)
        keys = _value(nested, "key", meta["key"].proto_type, depth)
        values = _value(nested, "value", meta["value"].proto_type, depth)
        return st.dictionaries(keys, values, max_size=3)
    return _SCALARS[proto_type]


def messages(cls: type, depth: int = 0) -> st.SearchStrategy[Any]:
    """Random instances of betterproto message `cls` (at most one field of each oneof)."""
    shape = shape_of(cls)
    meta = cls._betterproto  # type: ignore[attr-defined]
    groups: dict[str, list[str]] = {}
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in shape.fields.values():
        info = meta.meta_by_field_name[field.name]
        if depth > 2 and field.message is not None:
            continue
        value = _value(cls, field.name, field.proto_type, depth)
        if field.repeated:
            value = st.lists(value, max_size=3)
        elif info.optional:
            value = st.none() | value
        if info.group:
            groups.setdefault(info.group, []).append(field.name)
        parts[field.name] = value

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        chosen = {name: draw(strategy) for name, strategy in parts.items()}
        for names in groups.values():
            keep = draw(st.sampled_from([*names, None]))
            for name in names:
                if name != keep:
                    chosen.pop(name)
        return cls(**chosen)

    return build()


any_request = st.sampled_from(REQUEST_TYPES).flatmap(
    lambda cls: st.tuples(st.just(cls), messages(cls))
)


def _ours(cls: type, data: bytes) -> Any:
    wide = check(data, cls)
    message = cls.FromString(data)
    if wide:
        narrow(message)
    return message


def _same(cls: type, ours: Any, theirs: Any) -> None:
    """Our decoded message holds what protobuf's does: protobuf's reading, re-encoded by
    protobuf and decoded by betterproto (which adds nothing to valid bytes), equals ours,
    unknown fields aside (neither hands them to a handler)."""
    theirs.DiscardUnknownFields()
    mirror = cls.FromString(theirs.SerializeToString())
    # bytes too: a NaN (from damaged bytes) is unequal to itself but encodes the same
    assert ours == mirror or bytes(ours) == bytes(mirror), f"{ours!r} != {mirror!r}"


def test_every_request_type_is_covered() -> None:
    """The check knows every request type from the generated code: none is missing."""
    names = {cls.__name__ for cls in REQUEST_TYPES}
    assert {"TopicLookupRequest", "PublishBatch", "SetPoliciesRequest"} <= names
    assert {"RegisterSchemaRequest", "NewTopicRequest", "AckBatchRequest"} <= names


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_request)
def test_valid_requests_pass_and_decode_as_protobuf_does(reference: Any, case: Any) -> None:
    cls, message = case
    data = bytes(message)
    ours = _ours(cls, data)
    assert bytes(ours) == data
    _same(cls, ours, reference(cls).FromString(data))


STRICTER = (
    "field number",  # >= 2^29: upb, C++, Go and prost refuse it; protobuf's pure Python does not
    "overflows 64 bits",  # a 10th varint byte > 1: prost and Go refuse it, upb drops the bits
    "wire type 3",  # groups: not proto3; protobuf skips an unknown one
    "wire type 4",
    "has wire type",  # a known field with another type's wire type: protobuf skips it as unknown
)
"""Why the check may refuse bytes protobuf accepts (spec/protocol.md, "Limits on requests")."""


@st.composite
def damaged(draw: st.DrawFn) -> tuple[type, bytes]:
    cls, message = draw(any_request)
    data = bytearray(bytes(message))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        at = draw(st.integers(0, len(data)))
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=11))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 3))]
        elif kind == "cut":
            del data[at:]
    return cls, bytes(data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_damaged_bytes_are_refused_or_mean_what_protobuf_reads(
    reference: Any, case: tuple[type, bytes]
) -> None:
    cls, data = case
    reference_cls = reference(cls)
    try:
        theirs = reference_cls.FromString(data)
    except (DecodeError, UnicodeDecodeError):  # how protobuf's pure Python refuses bad UTF-8
        theirs = None
    try:
        ours = _ours(cls, data)
    except RequestRejected as error:
        assert theirs is None or any(reason in str(error) for reason in STRICTER), (
            f"{cls.__name__} {data.hex()}: refused ({error}) what protobuf reads as {theirs}"
        )
        event("refused by both" if theirs is None else "refused, stricter than protobuf")
        return
    assert theirs is not None, f"{cls.__name__} {data.hex()}: accepted what protobuf refuses"
    _same(cls, ours, theirs)
    event("accepted by both")


# -- the limits -----------------------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class Nest(betterproto.Message):
    child: Nest = betterproto.message_field(1)  # noqa: RUF009  (betterproto's own idiom)
    note: str = betterproto.string_field(2)


def test_nesting_is_limited() -> None:
    nested = Nest()
    for _ in range(request_check.MAX_DEPTH - 1):
        nested = Nest(child=nested)
    check(bytes(Nest(child=nested)), Nest)  # MAX_DEPTH messages: fine
    with pytest.raises(RequestRejected, match="nested more than"):
        check(bytes(Nest(child=Nest(child=nested))), Nest)


def test_fields_are_limited_unknown_ones_included() -> None:
    unknown = b"\xf8\x07\x01"  # field 127, varint 1
    check(unknown * request_check.MAX_FIELDS, pb.ProducerRequest)
    with pytest.raises(RequestRejected, match="more than 4096 fields"):
        check(unknown * (request_check.MAX_FIELDS + 1), pb.ProducerRequest)
    known = bytes(ext_pb.AckBatchRequest(offsets=list(range(request_check.MAX_PACKED))))
    check(known, ext_pb.AckBatchRequest)
    with pytest.raises(RequestRejected, match="packed elements"):
        check(known + b"\x22\x01\x00", ext_pb.AckBatchRequest)


def test_a_repeated_number_sent_unpacked_has_the_packed_limit() -> None:
    """Protobuf parsers take a repeated number packed or one field per element; both cost
    betterproto the same, so both count against MAX_PACKED, not the field limit (review)."""
    unpacked = b"".join(b"\x20" + bytes([n % 100]) for n in range(5_000))  # field 4, varint
    check(unpacked, ext_pb.AckBatchRequest)
    decoded = ext_pb.AckBatchRequest().parse(unpacked)
    assert decoded.offsets == [n % 100 for n in range(5_000)]
    with pytest.raises(RequestRejected, match="packed elements"):
        check(b"\x20\x01" * (request_check.MAX_PACKED + 1), ext_pb.AckBatchRequest)


def test_wide_32_bit_values_are_cut_as_protobuf_cuts_them(reference: Any) -> None:
    """A uint32 or enum sent as a wider varint: betterproto kept all the bits, protobuf the
    low 32 (an enum as a signed int32)."""
    for cls, data in [
        (admin_pb.PartitionedTopicRequest, b"\x10" + bytes.fromhex("85808080f001")),
        (pb.HealthCheckRequest, b"\x08" + b"\xff" * 9 + b"\x01"),  # enum -1
        (pb.ProducerRequest, b"\x30" + bytes.fromhex("81808080 10".replace(" ", ""))),
    ]:
        ours = _ours(cls, data)
        _same(cls, ours, reference(cls).FromString(data))


def test_a_flood_of_fields_is_refused() -> None:
    """A megabyte of fields is refused after reading 4,097 of them, not all of them."""
    flood = b"\xf8\x07\x01" * 350_000
    with pytest.raises(RequestRejected):
        check(flood, pb.ProducerRequest)
