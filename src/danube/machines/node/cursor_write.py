"""What a reliable subscription's cursor move writes to the metadata store: the cursor and,
when they changed, its messages' failure counts, in one atomic write (moved out of
`reliable_log`, which drives the reads and the WAL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube import keys
from danube.machines.dispatch import reliable as rd
from danube.machines.node import paths
from danube.machines.node.effects import PersistMeta

if TYPE_CHECKING:
    from danube.machines.node.records import TopicRecord


def persist_cursor(record: TopicRecord, sub: str, effect: rd.PersistCursor) -> PersistMeta:
    """The cursor, and the failure counts when they changed, in one atomic write: a count
    never outlives the cursor that passed its offset (spec/failure-policies.md)."""
    puts: tuple[tuple[str, object], ...] = ((paths.cursor(record.name, sub), effect.cursor),)
    if effect.attempts is None:
        return PersistMeta(puts=puts)
    key = keys.attempts(record.name, sub)
    if not effect.attempts:
        return PersistMeta(puts=puts, deletes=(key,))
    return PersistMeta(puts=(*puts, (key, [list(pair) for pair in effect.attempts])))
