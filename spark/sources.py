"""Which stored files an audit reads, and their decoding inside Spark tasks.

Only file names travel through the driver; each task opens its files with fsspec (local
paths, `file://`, `s3://` with s3fs, any fsspec filesystem), so the job never collects data
to the driver and works where s3a is not available (spec/audit.md)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import fsspec

from danube.audit.storage import SourceKind, StoredRecord, decode_source
from danube.machines.tiering import layout
from danube.machines.wal import format as wal_format

OBJECTS_PREFIX = "storage/topics/"

STORED_COLUMNS = (
    "row_type string, topic string, offset long, producer string, digest long, key string, "
    "source string, position long, detail string"
)
"""One row per stored record (`row_type` = record) or storage problem (its kind)."""


def wal_sources(root: str, options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every segment file under a broker's WAL root (`<root>/<ns>/<topic>/<base>.wal`), the
    newest of each topic marked as the one that may end torn."""
    fs, path = fsspec.core.url_to_fs(root, **options)
    newest: dict[str, tuple[int, str]] = {}
    found = []
    for file in fs.find(path):
        directory, _, name = file.rpartition("/")
        base = wal_format.segment_base(name)
        if base is None:
            continue
        found.append(file)
        if base > newest.get(directory, (-1, ""))[0]:
            newest[directory] = (base, file)
    last = {file for _, file in newest.values()}
    kinds = {True: SourceKind.WAL_NEWEST.value, False: SourceKind.WAL.value}
    return [(fs.unstrip_protocol(f), kinds[f in last]) for f in sorted(found)]


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
    return [(url, SourceKind.OBJECT.value) for url in sorted(found)]


def decoder(options: Mapping[str, Any]) -> Any:
    """The function a `mapPartitions` over (url, kind) pairs runs."""
    settings = dict(options)

    def decode(sources: Iterator[tuple[str, str]]) -> Iterator[tuple[Any, ...]]:
        for url, kind in sources:
            with fsspec.open(url, "rb", **settings) as handle:
                data = handle.read()
            for row in decode_source(data, url, SourceKind(kind)):
                if isinstance(row, StoredRecord):
                    yield ("record", row.topic, row.offset, row.producer, row.digest, row.key,
                           row.source, row.position, None)  # fmt: skip
                else:
                    yield (row.kind, row.topic, None, None, None, None, row.source,
                           row.position, row.detail)  # fmt: skip

    return decode
