"""Where a topic's segment objects and their index entries live (spec/object-layout.md).

Names are functions of the offsets and the writer's epoch, never of a clock or a counter: an
upload repeated after a crash writes the same key with the same bytes, and its index entry
goes to the same metadata path, where compare-and-create makes the repeat harmless. That
determinism is what lets the uploader resume without a checkpoint of its own.

The epoch (cluster mode: the revision of the claim the writer holds; 0 standalone, where
there is one writer) keeps two writers of one range apart. A broker that lost its claim cannot
commit an index entry, but it can still finish an upload; without the epoch that upload would
overwrite, under the same offsets-only key, the object the new owner had indexed.
"""

from __future__ import annotations

from danube.core.names import TopicName

OBJECT_SUFFIX = ".wal"
CURRENT = "cur"
"""The last component of Danube's pointer to the newest index entry (`segments/cur`)."""


def object_prefix(topic: TopicName) -> str:
    """The topic's objects, relative to `durable.root` (a listing of this prefix sees no
    other topic: it ends with a slash)."""
    return f"storage/topics/{topic.path}/segments/"


def object_name(start_offset: int, next_offset: int, epoch: int = 0) -> str:
    """Epoch 0 leaves the epoch out, so standalone names stay those of earlier releases."""
    writer = f"-{epoch:020d}" if epoch else ""
    return f"{start_offset:020d}-{next_offset:020d}{writer}{OBJECT_SUFFIX}"


def object_key(topic: TopicName, start_offset: int, next_offset: int, epoch: int = 0) -> str:
    """The object holding offsets `start_offset` … `next_offset - 1` as written by the
    writer of `epoch`: the sealed segment file of that range, byte for byte."""
    return object_prefix(topic) + object_name(start_offset, next_offset, epoch)


def parse_object_key(topic: TopicName, key: str) -> tuple[int, int] | None:
    """(start offset, next offset) of one of the topic's object keys, whatever its epoch;
    None for anything else, which the orphan collection must then leave alone."""
    prefix = object_prefix(topic)
    return parse_object_name(key[len(prefix) :]) if key.startswith(prefix) else None


def parse_object_name(name: str) -> tuple[int, int] | None:
    """(start offset, next offset) of a name `object_name` makes, whatever its epoch."""
    if not name.endswith(OBJECT_SUFFIX):
        return None
    parts = name[: -len(OBJECT_SUFFIX)].split("-")
    if len(parts) not in (2, 3) or not all(_padded(part) for part in parts):
        return None
    if len(parts) == 3 and int(parts[2]) == 0:
        return None
    return int(parts[0]), int(parts[1])


def index_prefix(topic: TopicName) -> str:
    """Danube's catalog of the topic's segments in the metadata store. A scan of it also
    returns the `cur` pointer; `index_start` tells entries from it."""
    return f"/storage/topics/{topic.path}/segments/"


def index_path(topic: TopicName, start_offset: int) -> str:
    return f"{index_prefix(topic)}{start_offset:020d}"


def current_path(topic: TopicName) -> str:
    return index_prefix(topic) + CURRENT


def current_value(start_offset: int) -> dict[str, str]:
    """Danube's `cur` pointer value: the padded start of the newest entry."""
    return {"start": f"{start_offset:020d}"}


def index_start(path: str) -> int | None:
    """The start offset an index path names; None for `cur` and anything else."""
    last = path.rpartition("/")[2]
    return int(last) if _padded(last) else None


def is_index_entry(path: str) -> bool:
    """Whether a metadata path is one of the object index's entries (of any topic)."""
    return path.startswith("/storage/topics/") and index_start(path) is not None


def _padded(text: str) -> bool:
    return len(text) == 20 and text.isascii() and text.isdigit()
