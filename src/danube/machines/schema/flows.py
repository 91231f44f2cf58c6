"""The registry's conversations with the metadata store, as sans-I/O flows: generators that
yield what they need (`Read` a key, `Write` a compare-and-put, `Work` to run CPU-bound
parsing or comparing wherever the driver runs such work) and get the answers sent back.

The broker's schema service drives them over etcd with trio, the simulator over its
simulated etcd, so the read–decide–commit loop, its retry after a lost race and the choice
of the version a message names are the same code in both, and the simulator checks them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeAlias, TypeVar

from danube.machines.schema import records, registry
from danube.machines.schema.formats import ParsedSchema
from danube.machines.schema.registry import Reader, Registration, SchemaVersion, Subject
from danube.metadata.model import Compare, KeyValue, Op
from danube.values.errors import DanubeError, ErrorCode, not_found, quoted

T = TypeVar("T")

NAMED_TTL_S = 10.0
"""How long a driver trusts what it read of the schema a message names: a version never
changes, but it can be deleted through another broker."""


@dataclass(frozen=True, slots=True)
class Read:
    """Answered with the key's `KeyValue`, or None."""

    key: str


@dataclass(frozen=True, slots=True)
class Write:
    """Answered with whether the transaction's compares held (and its ops were applied)."""

    compares: list[Compare]
    ops: list[Op]


@dataclass(frozen=True, slots=True)
class Work:
    """Answered with what `run()` returns; the broker runs it in a worker thread."""

    run: Callable[[], Any]


Step: TypeAlias = Read | Write | Work
Flow: TypeAlias = Generator[Step, Any, T]


def subject(name: str) -> Flow[tuple[Subject | None, KeyValue | None]]:
    """The subject and the key it was read from (for the compare of a later write)."""
    registry.check_subject_name(name)
    found = yield Read(records.subject_key(name))
    if found is None:
        return None, None
    return records.decoded(found.key, partial(records.subject_from_json, found.value)), found


def existing(name: str) -> Flow[tuple[Subject, KeyValue]]:
    found, seen = yield from subject(name)
    if found is None or seen is None:
        raise not_found(f"schema subject {quoted(name)} is not registered")
    return found, seen


def register(
    name: str,
    parsed: ParsedSchema,
    read: Reader,
    *,
    now_ms: int,
    created_by: str,
    description: str,
    tags: Collection[str],
) -> Flow[Registration]:
    """Reads, decides (`registry.register`) and commits under a compare on what it read; a
    new subject also takes the next id. A lost race reads and decides again."""
    for _ in range(records.RACE_ATTEMPTS):
        found, seen = yield from subject(name)
        candidate = yield Work(partial(registry.as_the_subject_reads, found, parsed))
        counter = None
        if found is None:
            counter = yield Read(records.NEXT_ID)
        new_id = 1 if counter is None else records.decoded(counter.key, partial(int, counter.value))
        outcome: Registration = yield Work(
            partial(
                registry.register, found, name, candidate, read, new_id=new_id, now_ms=now_ms,
                created_by=created_by, description=description, tags=tuple(tags),
            )
        )  # fmt: skip
        if outcome.is_new:
            compares, ops = records.commit(
                outcome.subject,
                None if seen is None else seen.mod_revision,
                None if counter is None else counter.mod_revision,
            )
            if not (yield Write(compares, ops)):
                continue
        return outcome
    raise DanubeError(
        ErrorCode.UNAVAILABLE,
        f"subject {quoted(name)} kept changing under concurrent registrations; retry",
    )


def update(name: str, change: Callable[[Subject], Subject]) -> Flow[Subject]:
    """Applies `change` (a mode, a deletion) under a compare on the revision read, again
    after a lost race."""
    for _ in range(records.RACE_ATTEMPTS):
        found, seen = yield from existing(name)
        changed = change(found)
        compares, ops = records.commit(changed, seen.mod_revision, None)
        if (yield Write(compares, ops)):
            return changed
    raise DanubeError(ErrorCode.UNAVAILABLE, f"subject {quoted(name)} kept changing; retry")


def named(schema_id: int, version: int | None) -> Flow[tuple[Subject, SchemaVersion] | None]:
    """The subject and live version a message's (schema id, version) names (the latest
    without a version), None when the registry has none."""
    index = yield Read(records.id_key(schema_id))
    if index is None:
        return None
    name = records.decoded(index.key, lambda: str(index.value["subject"]))
    found, _ = yield from subject(name)
    chosen = None if found is None else found.named(version)
    return None if found is None or chosen is None else (found, chosen)
