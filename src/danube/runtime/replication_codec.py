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

`request_from_bytes` / `answer_from_bytes` decode raw protobuf bytes through
`runtime.request_check` first (linear, bounded), as every request of the broker's ports is.
"""

from __future__ import annotations

from typing import Any

import betterproto

from danube.kernels.twins import MAX_FRAME
from danube.machines.replication.messages import (
    FollowerAnswer,
    Mismatch,
    Replicate,
    Replicated,
    StaleEpoch,
)
from danube.proto import danube_ext as ext_pb
from danube.runtime.request_check import RequestRejected, check, narrow
from danube.values.names import MAX_NAME_LENGTH

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
    kind = int(msg.kind) if isinstance(msg.kind, int) else -1
    topic = _topic(msg.topic)
    epoch = _count("epoch", msg.epoch)
    if kind == ext_pb.ReplicaAnswerKind.STALE_EPOCH:
        return StaleEpoch(topic, epoch)
    end = _count("end", msg.end)
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


# -- raw bytes ------------------------------------------------------------------------------------


def _parse(body: bytes, cls: type[betterproto.Message]) -> Any:
    try:
        wide = check(body, cls)
    except RequestRejected as error:
        raise ReplicaCodecError(f"undecodable {cls.__name__}: {error}") from None
    try:
        message = cls().parse(body)
    except Exception:  # checked bytes that betterproto still refuses: the input's fault
        raise ReplicaCodecError(f"undecodable {cls.__name__}") from None
    if wide:
        narrow(message)
    return message


def request_from_bytes(body: bytes, frames_limit: int = FRAMES_LIMIT) -> Replicate:
    """The `Replicate` an encoded `ReplicaRequest` carries (tests and tools; the service
    reads through `grpc_util.recv_bounded`, which runs the same check)."""
    if len(body) > request_limit(frames_limit):
        raise ReplicaCodecError(f"request of {len(body)} bytes exceeds the limit")
    return decode_replicate(_parse(body, ext_pb.ReplicaRequest), frames_limit)


def answer_from_bytes(body: bytes) -> FollowerAnswer:
    """The answer an encoded `ReplicaAnswer` carries."""
    if len(body) > ANSWER_LIMIT:
        raise ReplicaCodecError(f"answer of {len(body)} bytes exceeds the limit of {ANSWER_LIMIT}")
    return decode_answer(_parse(body, ext_pb.ReplicaAnswer))
