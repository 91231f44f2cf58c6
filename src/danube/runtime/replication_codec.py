"""The wire form of replication's messages (`danube_ext.Replication`, proto/DanubeExt.proto):
`Replicate` <-> `ReplicaRequest`, the follower's answers <-> `ReplicaAnswer`, and the
`EpochEnd` call of a follower's `Reconcile`.

Pure (no I/O): both directions check the same rules, so the owner refuses to send what a
follower would refuse to read, and whatever arrives is either a valid value of
`danube.machines.replication.messages` or a `ReplicaCodecError` with a short message that
quotes nothing of the input (never a traceback from deep inside a decoder):

- topics are non-empty and at most `MAX_NAME_LENGTH` bytes (UTF-8); the transport does not
  parse them, the machines' driver does;
- epochs, offsets, counts and ends are integers in 0 … 2^63-1 (what a WAL offset can be),
  and `prev_end + record_count` stays in that range;
- `frames` holds at most `frames_limit` bytes (default `FRAMES_LIMIT`, the WAL's largest
  frame) and is empty exactly when `record_count` is 0 (a probe); the frames themselves are
  not looked into: the follower's WAL machine checks them as it appends;
- an answer's kind is one of REPLICATED, MISMATCH, STALE_EPOCH (unset or unknown: refused).

The streams carry bytes from `request_bytes` / `answer_bytes` and read them with
`request_from_bytes` / `answer_from_bytes`, hand codecs (see "raw bytes") that produce and
accept exactly what the betterproto classes do; the `encode_*` / `decode_*` functions convert
to and from those classes, for `EpochEnd` and for tools.
"""

from __future__ import annotations

from typing import Any

from danube.kernels.twins import MAX_FRAME
from danube.machines.replication.messages import (
    FollowerAnswer,
    Mismatch,
    Replicate,
    Replicated,
    StaleEpoch,
)
from danube.machines.wal import records
from danube.proto import danube_ext as ext_pb
from danube.values.names import MAX_NAME_LENGTH
from danube.values.varint import append_varint

FRAMES_LIMIT = MAX_FRAME
"""Largest `frames` of one `Replicate` (64 MiB, the WAL's largest frame). A group commit
larger than this must be sent as several `Replicate`s split at frame boundaries."""
MESSAGE_OVERHEAD = 4096
"""Room for a `ReplicaRequest`'s other fields (topic, varints, tags) beside its frames."""
MAX_OFFSET = (1 << 63) - 1
"""Largest epoch, offset, count or end: WAL offsets are signed 64-bit on disk."""
MAX_BROKER_ID = 256
"""Longest broker id (ASCII) in the `x-danube-replica-from` header."""

ANSWER_LIMIT = MAX_NAME_LENGTH + 64
"""Largest encoded `ReplicaAnswer` (a topic name and three varints)."""

FROM_BROKER_HEADER = "x-danube-replica-from"
"""Stream metadata naming the owner broker that opened a `Replication/Stream`."""


class ReplicaCodecError(ValueError):
    """A replication message that is not well formed; the message says which rule it broke."""


def request_limit(frames_limit: int = FRAMES_LIMIT) -> int:
    """Largest encoded `ReplicaRequest` a follower reads (checked before buffering)."""
    return frames_limit + MESSAGE_OVERHEAD


# -- checks ---------------------------------------------------------------------------------------


def _count(name: str, value: Any) -> int:
    if type(value) is not int:
        raise ReplicaCodecError(f"{name} must be an integer, not {type(value).__name__}")
    if not 0 <= value <= MAX_OFFSET:
        raise ReplicaCodecError(f"{name} {value} is outside 0 … 2^63-1")
    return value


def _topic(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ReplicaCodecError("topic must be a non-empty string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_LENGTH:
        raise ReplicaCodecError(f"topic longer than {MAX_NAME_LENGTH} bytes")
    return value


def _frames(value: Any, record_count: int, limit: int) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ReplicaCodecError(f"frames must be bytes, not {type(value).__name__}")
    size = len(value)
    if size > limit:
        raise ReplicaCodecError(f"frames of {size} bytes exceed the limit of {limit} bytes")
    if (size == 0) != (record_count == 0):
        raise ReplicaCodecError(
            f"{size} bytes of frames for {record_count} records: frames must be empty exactly "
            "when record_count is 0 (a probe)"
        )
    return bytes(value)


def check_replicate(msg: Replicate, frames_limit: int = FRAMES_LIMIT) -> Replicate:
    """`msg` when it is well formed (see the module's rules), else `ReplicaCodecError`."""
    topic = _topic(msg.topic)
    epoch = _count("epoch", msg.epoch)
    prev_end = _count("prev_end", msg.prev_end)
    record_count = _count("record_count", msg.record_count)
    commit = _count("commit", msg.commit)
    if prev_end + record_count > MAX_OFFSET:
        raise ReplicaCodecError("prev_end + record_count exceeds 2^63-1")
    frames = _frames(msg.frames, record_count, frames_limit)
    return Replicate(topic, epoch, prev_end, frames, record_count, commit)


def check_broker_id(value: Any) -> str:
    """A broker id usable in the `x-danube-replica-from` header: 1 … `MAX_BROKER_ID`
    printable ASCII characters."""
    if not isinstance(value, str) or not value:
        raise ReplicaCodecError("the sending broker's id is missing")
    if len(value) > MAX_BROKER_ID or not (value.isascii() and value.isprintable()):
        raise ReplicaCodecError(f"a broker id is 1 to {MAX_BROKER_ID} printable ASCII characters")
    return value


# -- Replicate <-> ReplicaRequest -----------------------------------------------------------------


def encode_replicate(msg: Replicate, frames_limit: int = FRAMES_LIMIT) -> ext_pb.ReplicaRequest:
    checked = check_replicate(msg, frames_limit)
    return ext_pb.ReplicaRequest(
        topic=checked.topic,
        epoch=checked.epoch,
        prev_end=checked.prev_end,
        record_count=checked.record_count,
        commit=checked.commit,
        frames=checked.frames,
    )


def decode_replicate(req: ext_pb.ReplicaRequest, frames_limit: int = FRAMES_LIMIT) -> Replicate:
    return check_replicate(
        Replicate(req.topic, req.epoch, req.prev_end, req.frames, req.record_count, req.commit),
        frames_limit,
    )


# -- answers <-> ReplicaAnswer --------------------------------------------------------------------

_KIND_OF: dict[type, ext_pb.ReplicaAnswerKind] = {
    Replicated: ext_pb.ReplicaAnswerKind.REPLICATED,
    Mismatch: ext_pb.ReplicaAnswerKind.MISMATCH,
    StaleEpoch: ext_pb.ReplicaAnswerKind.STALE_EPOCH,
}


def encode_answer(answer: FollowerAnswer) -> ext_pb.ReplicaAnswer:
    kind = _KIND_OF.get(type(answer))
    if kind is None:
        raise ReplicaCodecError(f"not a follower answer: {type(answer).__name__}")
    topic = _topic(answer.topic)
    epoch = _count("epoch", answer.epoch)
    end = 0 if isinstance(answer, StaleEpoch) else _count("end", answer.end)
    return ext_pb.ReplicaAnswer(kind=kind, topic=topic, epoch=epoch, end=end)


def decode_answer(msg: ext_pb.ReplicaAnswer) -> FollowerAnswer:
    """The answer `msg` carries. A STALE_EPOCH's `end` is ignored (it has none)."""
    return _answer(
        int(msg.kind) if isinstance(msg.kind, int) else -1, msg.topic, msg.epoch, msg.end
    )


def _answer(kind: int, topic_value: Any, epoch_value: Any, end_value: Any) -> FollowerAnswer:
    topic = _topic(topic_value)
    epoch = _count("epoch", epoch_value)
    if kind == ext_pb.ReplicaAnswerKind.STALE_EPOCH:
        return StaleEpoch(topic, epoch)
    end = _count("end", end_value)
    if kind == ext_pb.ReplicaAnswerKind.REPLICATED:
        return Replicated(topic, epoch, end)
    if kind == ext_pb.ReplicaAnswerKind.MISMATCH:
        return Mismatch(topic, epoch, end)
    raise ReplicaCodecError(f"unknown answer kind {kind}")


# -- EpochEnd -------------------------------------------------------------------------------------


def encode_epoch_end_request(topic: str, epoch: int) -> ext_pb.EpochEndRequest:
    return ext_pb.EpochEndRequest(topic=_topic(topic), epoch=_count("epoch", epoch))


def decode_epoch_end_request(msg: ext_pb.EpochEndRequest) -> tuple[str, int]:
    """(topic, epoch) of a follower's question."""
    return _topic(msg.topic), _count("epoch", msg.epoch)


def encode_epoch_end_response(end: int, owner_epoch: int) -> ext_pb.EpochEndResponse:
    return ext_pb.EpochEndResponse(
        end=_count("end", end), owner_epoch=_count("owner_epoch", owner_epoch)
    )


def decode_epoch_end_response(msg: ext_pb.EpochEndResponse) -> tuple[int, int]:
    """(end, owner_epoch) of the owner's answer."""
    return _count("end", msg.end), _count("owner_epoch", msg.owner_epoch)


# -- raw bytes: the hot path ---------------------------------------------------------------------
#
# betterproto builds and parses these messages in pure Python at about 0.1 ms each, which was
# most of the transport's CPU on a loopback run (cProfile): 2,000 Replicates/s of 1 KiB with
# betterproto, 18,700/s with these hand codecs, on the 2-core development machine. The streams
# therefore carry bytes encoded and decoded here by hand: the same bytes as betterproto's
# (fields in number order, zero values left out), read as any protobuf parser reads them (any
# order, last value wins, unknown fields skipped; `records.read`'s checks).

_VARINT, _LEN = 0, 2
_REQUEST = records.Schema(
    {1: _LEN, 2: _VARINT, 3: _VARINT, 4: _VARINT, 5: _VARINT, 6: _LEN}, frozenset({1})
)
_ANSWER = records.Schema({1: _VARINT, 2: _LEN, 3: _VARINT, 4: _VARINT}, frozenset({2}))


def _field_bytes(number: int, data: bytes, out: bytearray) -> None:
    if data:
        out.append(number << 3 | _LEN)
        append_varint(len(data), out)
        out += data


def _field_varint(number: int, value: int, out: bytearray) -> None:
    if value:
        out.append(number << 3 | _VARINT)
        append_varint(value, out)


def request_bytes(msg: Replicate, frames_limit: int = FRAMES_LIMIT) -> bytes:
    """`msg` as an encoded `ReplicaRequest` (checked first: `ReplicaCodecError`)."""
    checked = check_replicate(msg, frames_limit)
    out = bytearray()
    _field_bytes(1, checked.topic.encode("utf-8", "surrogatepass"), out)
    _field_varint(2, checked.epoch, out)
    _field_varint(3, checked.prev_end, out)
    _field_varint(4, checked.record_count, out)
    _field_varint(5, checked.commit, out)
    if checked.frames:
        out.append(6 << 3 | _LEN)
        append_varint(len(checked.frames), out)
        return bytes(out) + checked.frames
    return bytes(out)


def request_from_bytes(body: bytes, frames_limit: int = FRAMES_LIMIT) -> Replicate:
    """The `Replicate` an encoded `ReplicaRequest` carries."""
    if len(body) > request_limit(frames_limit):
        raise ReplicaCodecError(f"request of {len(body)} bytes exceeds the limit")
    values: dict[int, Any] = {1: "", 2: 0, 3: 0, 4: 0, 5: 0, 6: b""}
    for number, _, value in _fields(body, _REQUEST, "ReplicaRequest"):
        values[number] = value
    return check_replicate(
        Replicate(values[1], values[2], values[3], values[6], values[4], values[5]),
        frames_limit,
    )


def answer_bytes(answer: FollowerAnswer) -> bytes:
    """`answer` as an encoded `ReplicaAnswer` (checked first: `ReplicaCodecError`)."""
    kind = _KIND_OF.get(type(answer))
    if kind is None:
        raise ReplicaCodecError(f"not a follower answer: {type(answer).__name__}")
    out = bytearray()
    _field_varint(1, int(kind), out)
    _field_bytes(2, _topic(answer.topic).encode("utf-8", "surrogatepass"), out)
    _field_varint(3, _count("epoch", answer.epoch), out)
    if not isinstance(answer, StaleEpoch):
        _field_varint(4, _count("end", answer.end), out)
    return bytes(out)


def answer_from_bytes(body: bytes) -> FollowerAnswer:
    """The answer an encoded `ReplicaAnswer` carries."""
    if len(body) > ANSWER_LIMIT:
        raise ReplicaCodecError(f"answer of {len(body)} bytes exceeds the limit of {ANSWER_LIMIT}")
    values: dict[int, Any] = {1: 0, 2: "", 3: 0, 4: 0}
    for number, _, value in _fields(body, _ANSWER, "ReplicaAnswer"):
        values[number] = value
    return _answer(values[1], values[2], values[3], values[4])


def _fields(body: bytes, schema: records.Schema, name: str) -> list[tuple[int, int, Any]]:
    try:
        return records.read(body, schema)[0]
    except records.RecordError as error:
        raise ReplicaCodecError(f"undecodable {name}: {error}") from None
