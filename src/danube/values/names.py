"""Topic, namespace and partition names.

Danube accepts `a/b/c` and `//t` (its validator only splits on `/`); we require the canonical
`/namespace/topic` with non-empty parts, because a name that two brokers could spell two ways
cannot be a metadata key (spec/protocol.md, "Names").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from danube.values.errors import DanubeError, ErrorCode, invalid, quoted
from danube.values.frozen import fast_init

MAX_NAME_LENGTH = 255
"""Bytes (UTF-8) of a topic's full name, a namespace's name, a subscription's or a client's
name. A topic's namespace and local name become directory names (the WAL's, the object
store's), which filesystems limit to 255 bytes, not characters: `/default/` + "é" × 200
passed a limit in characters and then stopped the topic with `File name too long` (issue
20). Danube (Rust) measures `String::len()`, which is bytes too."""
MAX_PARTITIONS = 10_000
PARTITION_MARKER = "-part-"

_PART_RE = re.compile(r"[\w-]+")
_PARTITION_RE = re.compile(r"(?P<base>.+)-part-(?P<index>0|[1-9][0-9]*)", re.DOTALL)


@fast_init
@dataclass(frozen=True, slots=True)
class TopicName:
    namespace: str
    local: str
    full: str = field(init=False, repr=False, compare=False)
    """`/namespace/local`, built once: the core keys its tables by it and reads it several
    times per message (a property built it on each read: 79,000 times in a 30 s simulated
    cluster run, bench/RESULTS.md issue 22 round 10)."""

    def __post_init__(self) -> None:
        _set_full(self, f"/{self.namespace}/{self.local}")

    @property
    def path(self) -> str:
        """The storage and metadata form: no leading slash."""
        return f"{self.namespace}/{self.local}"

    @property
    def partition_of(self) -> tuple[str, int] | None:
        """(base topic, index) when this is a `<base>-part-<n>` partition."""
        match = _PARTITION_RE.fullmatch(self.full)
        if match is None:
            return None
        return match["base"], int(match["index"])


_set_full = TopicName.__dict__["full"].__set__  # type: ignore[attr-defined]
"""Stores the frozen `full` slot (as `fast_init`'s constructor stores the others)."""


def _valid_part(part: str) -> bool:
    return bool(part) and _PART_RE.fullmatch(part) is not None


def utf8_length(text: str) -> int:
    """Bytes of `text` in UTF-8 (what a filesystem or a key store counts)."""
    return len(text.encode("utf-8", "surrogatepass"))


def too_long(text: str, limit: int = MAX_NAME_LENGTH) -> bool:
    """`text` takes more than `limit` bytes in UTF-8 (a long string is not encoded to say so)."""
    return len(text) > limit or (not text.isascii() and utf8_length(text) > limit)


def validate_namespace(name: str) -> str:
    if not _valid_part(name) or too_long(name):
        raise invalid(
            f"invalid namespace name {quoted(name)}: use letters, digits, '_' or '-' "
            f"(1 to {MAX_NAME_LENGTH} bytes in UTF-8)"
        )
    return name


def parse_topic(name: str) -> TopicName:
    """Parses `/namespace/topic`, refusing anything else with an actionable message."""
    if too_long(name):
        raise invalid(
            f"invalid topic name {quoted(name)}: longer than {MAX_NAME_LENGTH} bytes in UTF-8 "
            f"({utf8_length(name)} bytes)"
        )
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "" or not _valid_part(parts[1]) or not _valid_part(parts[2]):
        raise invalid(
            f"invalid topic name {quoted(name)}: expected '/namespace/topic' where both parts "
            f"use letters, digits, '_' or '-' (at most {MAX_NAME_LENGTH} bytes in all)"
        )
    return TopicName(parts[1], parts[2])


def partition_name(base: str, index: int) -> str:
    return f"{base}{PARTITION_MARKER}{index}"


def partition_index(full_name: str, base: str) -> int | None:
    """The index when `full_name` is exactly `<base>-part-<n>`, else None."""
    match = _PARTITION_RE.fullmatch(full_name)
    if match is None or match["base"] != base:
        return None
    return int(match["index"])


def partition_names(base: str, partitions: int) -> list[TopicName]:
    """The topics of a partitioned topic, checked: a valid base and 1 to MAX_PARTITIONS, and
    every partition's name (the base with `-part-<n>`) within the byte limit."""
    parse_topic(base)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise invalid(f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}")
    longest = partition_name(base, partitions - 1)
    if too_long(longest):
        raise invalid(
            f"topic name {quoted(base)} is too long for {partitions} partitions: "
            f"{quoted(longest[len(base) :])} makes {utf8_length(longest)} bytes, more than "
            f"{MAX_NAME_LENGTH} bytes in UTF-8"
        )
    return [parse_topic(partition_name(base, i)) for i in range(partitions)]


def check_partition_conflict(name: TopicName, *, base_exists: bool, partitioned: bool) -> None:
    """A partition cannot be created beside a plain topic of its base name, nor a plain topic
    beside partitions of its own name. `base_exists`: the partition's base is a plain topic;
    `partitioned`: the name has partitions."""
    partition = name.partition_of
    if partition is not None and base_exists:
        raise DanubeError(
            ErrorCode.ALREADY_EXISTS,
            f"cannot create partition {name.full}: {partition[0]} exists as a "
            "non-partitioned topic",
        )
    if partition is None and partitioned:
        raise DanubeError(
            ErrorCode.ALREADY_EXISTS,
            f"cannot create topic {name.full}: it exists as a partitioned topic",
        )
