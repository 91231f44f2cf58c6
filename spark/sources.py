"""Which stored files an audit reads, and their decoding inside Spark tasks.

Only file names travel through the driver; each task opens its files with fsspec (local
paths, `file://`, `s3://` with s3fs, any fsspec filesystem), so the job never collects data
to the driver and works where s3a is not available (spec/audit.md)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import fsspec

from danube.audit.storage import SourceKind, StoredRecord, decode_source
from danube.machines.tiering import layout
from danube.machines.wal import format as wal_format

EPOCHS_NAME = "epochs"
"""A replica's epochs file in a topic's WAL directory (`danube.runtime.segment_files`):
`{"seen": E, "starts": [[epoch, first offset], ...]}`."""

OBJECTS_PREFIX = "storage/topics/"

STORED_COLUMNS = (
    "row_type string, topic string, offset long, producer string, digest long, key string, "
    "source string, position long, detail string, origin_topic string, "
    "origin_subscription string, origin_offset long"
)
"""One row per stored record (`row_type` = record) or storage problem (its kind); a dead
letter's record also names its origin (`danube.audit.storage.DeadLetterOrigin`)."""


def wal_sources(root: str, options: Mapping[str, Any]) -> list[tuple[str, str, int | None]]:
    """Every segment file under a broker's WAL root (`<root>/<ns>/<topic>/<base>.wal`), the
    newest of each topic marked as the one that may end torn; no superseded tail (one root
    alone cannot tell: `replicated_wal_sources`)."""
    return [(url, kind, None) for url, kind, _ in _segments(root, options)]


def replicated_wal_sources(
    roots: Sequence[str], options: Mapping[str, Any]
) -> list[tuple[str, str, int | None]]:
    """The segment files of every root, each with the offset from which its copy's records
    are a superseded tail (None: none are).

    With replication several brokers hold a copy of a topic's log. A copy's identical records
    are one record to the checks; but a broker that died as an owner may keep frames it
    appended and never had acknowledged, at offsets the next owner then filled with other
    messages: no inconsistency, as the broker truncates them when it follows again. Each copy's
    epochs file says which writer epochs its records come from; a copy whose newest epoch is E
    holds a superseded tail from where a later epoch starts, the start being the highest any
    copy records (a follower may date frames it received by the epoch it received them in,
    never later than where that epoch really starts). Those records are `superseded` (allowed)
    and count as stored nowhere: an acknowledged message only there is a `lost-write`."""
    found = [(root, *segment) for root in roots for segment in _segments(root, options)]
    histories: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for root, _, _, topic_dir, epochs_url in found:
        if (root, topic_dir) not in histories and epochs_url is not None:
            histories[(root, topic_dir)] = _epochs(epochs_url, options)
    starts: dict[str, dict[int, int]] = {}
    for (_, topic_dir), history in histories.items():
        for epoch, start in history:
            known = starts.setdefault(topic_dir, {})
            known[epoch] = max(known.get(epoch, start), start)
    result = []
    for root, url, kind, topic_dir, _ in found:
        history = histories.get((root, topic_dir))
        cut = None
        if history:
            newest = max(epoch for epoch, _ in history)
            later = [s for e, s in starts.get(topic_dir, {}).items() if e > newest]
            cut = min(later) if later else None
        result.append((url, kind, cut))
    return result


def _segments(root: str, options: Mapping[str, Any]) -> list[tuple[str, str, str, str | None]]:
    """(url, kind, topic directory relative to the root, its epochs file's url or None)."""
    fs, path = fsspec.core.url_to_fs(root, **options)
    base = path.rstrip("/") + "/"
    newest: dict[str, tuple[int, str]] = {}
    found = []
    epochs: set[str] = set()
    for file in fs.find(path):
        directory, _, name = file.rpartition("/")
        if name == EPOCHS_NAME:
            epochs.add(directory)
        base_offset = wal_format.segment_base(name)
        if base_offset is None:
            continue
        found.append(file)
        if base_offset > newest.get(directory, (-1, ""))[0]:
            newest[directory] = (base_offset, file)
    last = {file for _, file in newest.values()}
    kinds = {True: SourceKind.WAL_NEWEST.value, False: SourceKind.WAL.value}
    result = []
    for file in sorted(found):
        directory = file.rpartition("/")[0]
        epochs_url = (
            fs.unstrip_protocol(f"{directory}/{EPOCHS_NAME}") if directory in epochs else None
        )
        relative = directory[len(base) :] if directory.startswith(base) else directory
        result.append((fs.unstrip_protocol(file), kinds[file in last], relative, epochs_url))
    return result


def _epochs(url: str, options: Mapping[str, Any]) -> list[tuple[int, int]]:
    """A copy's epoch starts; none when the file does not parse (the broker reads such a
    file as none too)."""
    try:
        with fsspec.open(url, "r", **options) as handle:
            value = json.load(handle)
        return [(int(e), int(s)) for e, s in value["starts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def object_sources(
    root: str, options: Mapping[str, Any], indexed: Iterable[str] | None = None
) -> list[tuple[str, str]]:
    """The uploaded objects under `durable.root`: every key the object layout names, or only
    `indexed` ones (keys relative to the root, from the object index) when given, which
    leaves out the orphans a deposed broker may have uploaded."""
    fs, path = fsspec.core.url_to_fs(root, **options)
    base = path.rstrip("/") + "/"
    keep = None if indexed is None else set(indexed)
    found = []
    for full in fs.find(base + OBJECTS_PREFIX):
        key = full[len(base) :]
        if layout.parse_object_name(key.rpartition("/")[2]) is None:
            continue
        if keep is None or key in keep:
            found.append(fs.unstrip_protocol(full))
    return [(url, SourceKind.OBJECT.value, None) for url in sorted(found)]


def decoder(options: Mapping[str, Any]) -> Any:
    """The function a `mapPartitions` over (url, kind, superseded-from offset) runs."""
    settings = dict(options)

    def decode(sources: Iterator[tuple[str, str, int | None]]) -> Iterator[tuple[Any, ...]]:
        for url, kind, cut in sources:
            with fsspec.open(url, "rb", **settings) as handle:
                data = handle.read()
            for row in decode_source(data, url, SourceKind(kind)):
                if isinstance(row, StoredRecord):
                    superseded = cut is not None and row.offset >= cut
                    detail = f"a later epoch starts at offset {cut}" if superseded else None
                    origin = row.origin or (None, None, None)
                    yield ("superseded" if superseded else "record", row.topic, row.offset,
                           row.producer, row.digest, row.key, row.source, row.position,
                           detail, *origin)  # fmt: skip
                else:
                    yield (row.kind, row.topic, None, None, None, None, row.source,
                           row.position, row.detail, None, None, None)  # fmt: skip

    return decode
