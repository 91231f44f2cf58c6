"""Where a topic's segment objects and their index entries live (spec/object-layout.md).

The keys themselves are built and parsed in `danube.keys` (re-exported here for the callers
that name them through this module); what stays here is the value of the `cur` pointer.

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

from danube.keys import (
    CURRENT,
    OBJECT_SUFFIX,
    current_path,
    index_path,
    index_prefix,
    index_start,
    is_index_entry,
    object_key,
    object_name,
    object_prefix,
    parse_object_key,
    parse_object_name,
)

__all__ = [
    "CURRENT",
    "OBJECT_SUFFIX",
    "current_path",
    "current_value",
    "index_path",
    "index_prefix",
    "index_start",
    "is_index_entry",
    "object_key",
    "object_name",
    "object_prefix",
    "parse_object_key",
    "parse_object_name",
]


def current_value(start_offset: int) -> dict[str, str]:
    """Danube's `cur` pointer value: the padded start of the newest entry."""
    return {"start": f"{start_offset:020d}"}
