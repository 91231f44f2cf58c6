"""Which queued metadata changes of a standalone broker go to the store as one transaction
(issue 23, point 3: a topic's creation waited for one store write, and its fsync, per change,
one change at a time). Pure: op lists in, one op list out.

The interpreter writes the broker's `PersistMeta` changes in order, one write at a time. While
a write is under way more changes queue; `merge_persists` folds the leading ones into a single
transaction whose effect on the store is the effect of applying them one after the other: a
later put or delete of a key replaces an earlier one, a prefix deletion drops the earlier
changes under it. A change that this cannot express in one valid transaction (a put under a
prefix an earlier change deletes, a put bound to a lease) ends the batch, and goes first in the
next one. Only unfenced, unconditional changes are merged (standalone: a cluster's changes are
fenced on each topic's claim, and one refused claim must not refuse the others).
"""

from __future__ import annotations

from collections.abc import Sequence

from danube.metadata.model import Delete, DeletePrefix, Op, Put

MAX_MERGED = 256
"""Changes in one merged transaction at most: bounds one write's size and latency."""


def merge_persists(
    changes: Sequence[Sequence[Op]], max_merged: int = MAX_MERGED
) -> tuple[int, tuple[Op, ...]]:
    """How many of the leading `changes` (at least one, when there are any) go as one
    transaction, and that transaction's ops."""
    if not changes:
        return 0, ()
    first = changes[0]
    if any(isinstance(op, Put) and op.lease is not None for op in first):
        return 1, tuple(first)
    prefixes: list[str] = []
    by_key: dict[str, Put | Delete] = {}
    taken = 0
    for ops in changes[: max(1, max_merged)]:
        if taken and not _fits(ops, prefixes):
            break
        for op in ops:
            if isinstance(op, DeletePrefix):
                for key in [key for key in by_key if key.startswith(op.prefix)]:
                    del by_key[key]
                if op.prefix not in prefixes:
                    prefixes.append(op.prefix)
            else:
                by_key.pop(op.key, None)  # the later change replaces it, in its place
                by_key[op.key] = op
        taken += 1
    return taken, (*(DeletePrefix(prefix) for prefix in prefixes), *by_key.values())


def _fits(ops: Sequence[Op], prefixes: Sequence[str]) -> bool:
    """A later change joins unless it puts under a prefix the batch deletes (one transaction
    cannot put a key it also deletes) or puts with a lease."""
    for op in ops:
        if isinstance(op, Put):
            if op.lease is not None or any(op.key.startswith(p) for p in prefixes):
                return False
        elif not isinstance(op, (Delete, DeletePrefix)):
            return False
    return True
