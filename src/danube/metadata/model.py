"""Values, operations and errors shared by every metadata backend.

The shapes follow etcd's v3 API on purpose: the embedded store, the in-memory store and the
etcd backend must be interchangeable behind `MetadataStore`, so nothing here may promise a
behaviour that etcd cannot provide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from danube.values.frozen import fast_init

JSONValue: TypeAlias = Any
"""A value that survives a JSON round trip (None, bool, int, float, str, list, dict with str keys).

Spelled `Any` because a recursive JSON type rejects ordinary `dict[str, int]` arguments
(dict is invariant), which would push casts into every caller.
"""

CompareTarget: TypeAlias = Literal["value", "version", "create_revision", "mod_revision"]
CompareOp: TypeAlias = Literal["==", "!=", "<", ">"]

_TARGETS = frozenset({"value", "version", "create_revision", "mod_revision"})
_OPS = frozenset({"==", "!=", "<", ">"})


@fast_init
@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as read from the store.

    `version` counts puts since the key was (re)created and resets on delete, `create_revision`
    and `mod_revision` are store revisions: together they let callers do optimistic
    concurrency without reading the value twice. `lease` is None for durable keys.
    """

    key: str
    value: JSONValue
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None


@fast_init
@dataclass(frozen=True, slots=True)
class Compare:
    """A guard of a transaction, evaluated against the state before any of its operations.

    A missing key compares as etcd's empty KeyValue: version, create_revision and mod_revision
    are 0, and every value compare on it is false, whatever the operator (etcd 3.4 checked:
    even `!=`); test `version == 0` for absence. Values compare as their canonical JSON text
    (sorted keys, compact, ASCII), which is what an etcd backend stores and compares
    byte-wise.
    """

    key: str
    target: CompareTarget
    op: CompareOp
    operand: JSONValue

    def __post_init__(self) -> None:
        # Literal types are not enforced at runtime and a typo would silently compare false.
        if self.target not in _TARGETS:
            raise ValueError(f"unknown compare target {self.target!r}")
        if self.op not in _OPS:
            raise ValueError(f"unknown compare operator {self.op!r}")
        if self.target != "value" and (
            not isinstance(self.operand, int) or isinstance(self.operand, bool)
        ):
            raise TypeError(f"{self.target} compares against an int, got {self.operand!r}")


@fast_init
@dataclass(frozen=True, slots=True)
class Put:
    """Sets `key`. With `lease`, the key is ephemeral: it disappears when the lease ends."""

    key: str
    value: JSONValue
    lease: int | None = None

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("a key must not be empty")


@dataclass(frozen=True, slots=True)
class Delete:
    """Removes `key`; deleting a missing key changes nothing and uses no revision."""

    key: str


@dataclass(frozen=True, slots=True)
class DeletePrefix:
    """Removes every key that starts with `prefix` (a plain string prefix, not a path match)."""

    prefix: str


@dataclass(frozen=True, slots=True)
class Get:
    """Reads `key` inside a transaction, seeing the transaction's earlier operations."""

    key: str


Op: TypeAlias = Put | Delete | DeletePrefix | Get


@fast_init
@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of a transaction.

    `revision` is the store revision after the transaction (unchanged if nothing changed).
    `responses` has one entry per executed operation, in order: Put gives the previous
    KeyValue or None (etcd's prev_kv), Delete gives whether the key existed, DeletePrefix the
    number of keys removed, Get the KeyValue or None.
    """

    succeeded: bool
    revision: int
    responses: tuple[Any, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change of one key.

    A delete has `value` None and the removed value in `prev_value`. A put carries the `lease`
    it was put with (None for none): a key's value alone cannot tell this broker's own key from
    one its past incarnation put before a crash. The same event object is handed to every
    watcher of the change and kept in the replay history, so treat its values as read-only.
    """

    kind: Literal["put", "delete"]
    key: str
    value: JSONValue
    mod_revision: int
    prev_value: JSONValue
    lease: int | None = None


class MetadataError(Exception):
    """Base of every error the metadata layer raises on purpose."""


class CompactedError(MetadataError):
    """The requested revision is older than the retained history, or a watcher fell too far
    behind; the caller must re-read the current state and watch again from there."""


class LeaseNotFound(MetadataError):
    """The lease was never granted, was revoked, or has expired."""


class StoreClosed(MetadataError):
    """The store was closed, or shut itself down after a write it could not make durable."""


class MetadataCorrupted(MetadataError):
    """The on-disk metadata cannot be trusted; raised instead of guessing what was lost."""
