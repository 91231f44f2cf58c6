"""The metadata key space as a pure, deterministic state machine.

No clock, no I/O, no concurrency: time comes in as arguments and every effect comes out as a
return value. That keeps the etcd-like semantics (revisions, versions, transactions, leases,
history) testable in isolation and lets the simulator drive the same code the brokers run.
"""

from __future__ import annotations

import bisect
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from danube.metadata.model import (
    CompactedError,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    JSONValue,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    TxnResult,
    WatchEvent,
)
from danube.values.frozen import fast_init

SNAPSHOT_FORMAT = 1

_COMPARE_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}


def encode_value(value: JSONValue) -> str:
    """The canonical JSON text of a value.

    Stored instead of the object so nobody can mutate the store through a reference they
    passed in or got back, so value compares are exact text compares (as etcd's byte compares
    will be), and so non-JSON values fail at the put rather than at the next snapshot.
    """
    if _c_encoder is None:  # a Python built without the C accelerator
        return _CANONICAL.encode(value)
    return "".join(_c_encoder({}, _default, _ascii, None, ":", ",", True, False, False)(value, 0))


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
"""`json.dumps` with these options builds an encoder per call (a fifth of its time here)."""
_default = _CANONICAL.default
_ascii = json.encoder.encode_basestring_ascii
_c_encoder: Any = json.encoder.c_make_encoder
"""`_CANONICAL.encode` builds this C encoder on each call, through two Python frames and a
closure it does not use: called directly (a fresh circular-reference table each time, as
`encode` gives it) the text and the errors are the same, 40 % sooner (the simulated
cluster encodes about two values a message, bench/RESULTS.md issue 22 round 10)."""


def decode_value(text: str) -> JSONValue:
    """A fresh copy of the value a stored text (`encode_value`'s) holds. The decoder's
    scanner is called directly: canonical text has no whitespace around the value and
    nothing after it, which is all `json.loads`' three Python layers check (they took half
    of each decode, and the simulated cluster decodes every value put for its watchers)."""
    return _SCAN(text, 0)[0]


_SCAN = json.JSONDecoder().scan_once


@fast_init
@dataclass(frozen=True, slots=True)
class _Entry:
    text: str
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None

    def key_value(self, key: str) -> KeyValue:
        return KeyValue(
            key,
            decode_value(self.text),
            self.create_revision,
            self.mod_revision,
            self.version,
            self.lease,
        )

    def stored_key_value(self, key: str) -> KeyValue:
        """`key_value`, its value decoded when first read (a put's previous value, which
        hardly anyone reads: `StoredKeyValue`)."""
        return StoredKeyValue(
            key, self.text, self.create_revision, self.mod_revision, self.version, self.lease
        )


_KV_VALUE = KeyValue.__dict__["value"]


def _decoded(slot: Any, owner: Any, text: str | None) -> JSONValue:
    """The value in `slot` of `owner`, decoded from `text` and kept there at the first read
    (None for no text): how the stored events and key-values decode lazily."""
    try:
        return slot.__get__(owner, type(owner))  # type: ignore[no-any-return]
    except AttributeError:  # not read yet
        found = None if text is None else decode_value(text)
        slot.__set__(owner, found)
        return found


class StoredKeyValue(KeyValue):
    """A `KeyValue` of this state whose value is decoded from the stored text when first
    read (kept in its own field): each put answers its key's previous value (etcd's
    `prev_kv`), which few callers read. Equal to a `KeyValue` with the same fields."""

    __slots__ = ("_text",)

    def __init__(
        self,
        key: str,
        text: str,
        create_revision: int,
        mod_revision: int,
        version: int,
        lease: int | None,
    ) -> None:
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "create_revision", create_revision)
        object.__setattr__(self, "mod_revision", mod_revision)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "lease", lease)

    @property  # type: ignore[override]
    def value(self) -> JSONValue:
        return _decoded(_KV_VALUE, self, self._text)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyValue):
            return NotImplemented
        return _kv_fields(self) == _kv_fields(other)

    __hash__ = KeyValue.__hash__

    def __reduce__(self) -> tuple[Any, ...]:  # copied or pickled as the plain value
        return KeyValue, _kv_fields(self)


def _kv_fields(kv: KeyValue) -> tuple[Any, ...]:
    return (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


_VALUE = WatchEvent.__dict__["value"]
_PREV_VALUE = WatchEvent.__dict__["prev_value"]


class StoredEvent(WatchEvent):
    """A `WatchEvent` of this state: its values are decoded from the stored texts when first
    read (and kept in the event's own fields). A commit's events go to every watcher of their
    keys, and most read neither value nor previous value of most keys: decoding both for
    every put was 14,654 decodes in a 30-second cluster simulation (issue 22 round 11).
    Equal to a `WatchEvent` with the same fields."""

    __slots__ = ("_prev_text", "_text")

    def __init__(
        self,
        kind: str,
        key: str,
        text: str | None,
        mod_revision: int,
        prev_text: str | None,
        lease: int | None = None,
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "lease", lease)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "mod_revision", mod_revision)
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "_prev_text", prev_text)

    @property  # type: ignore[override]
    def value(self) -> JSONValue:
        return _decoded(_VALUE, self, self._text)

    @property  # type: ignore[override]
    def prev_value(self) -> JSONValue:
        return _decoded(_PREV_VALUE, self, self._prev_text)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WatchEvent):
            return NotImplemented
        return _fields(self) == _fields(other)

    __hash__ = WatchEvent.__hash__

    def __reduce__(self) -> tuple[Any, ...]:  # copied or pickled as the plain event
        return WatchEvent, _fields(self)


def _fields(event: WatchEvent) -> tuple[Any, ...]:
    return (event.kind, event.key, event.value, event.mod_revision, event.prev_value, event.lease)


@dataclass(slots=True)
class _Lease:
    ttl_s: float
    deadline_s: float
    keys: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class PreparedTxn:
    """A transaction evaluated against the state but not applied yet.

    Splitting evaluation from application lets a durable store write `durable_changes` to disk
    before anyone can observe the change. `durable_changes` is the transaction's effect on the
    durable key space (lease-bound keys are never durable): key → the KeyValue to install, or
    None to remove it. `changes` and `base_epoch` are for `MetadataState.commit` only.
    """

    result: TxnResult
    durable_changes: Mapping[str, KeyValue | None]
    changes: Mapping[str, _Entry | None]
    base_epoch: int


class MetadataState:
    """Keys, revisions, leases and a bounded change history.

    The revision starts at 0 and every transaction that changes at least one key takes the next
    one, however many keys it touches. Lease ids come from a counter that `restore` does not
    reset, so an id issued before a restore can never name a different lease afterwards.
    """

    def __init__(self, history_limit: int = 10_000) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self._history_limit = history_limit
        self._entries: dict[str, _Entry] = {}
        self._sorted_keys: list[str] = []
        self._revision = 0
        # Bumped by every change of keys or leases; a PreparedTxn is only valid for its epoch.
        self._epoch = 0
        self._history: list[WatchEvent] = []
        # Every event with mod_revision > _history_floor is still in _history.
        self._history_floor = 0
        self._leases: dict[int, _Lease] = {}
        self._next_lease_id = 1

    @property
    def revision(self) -> int:
        return self._revision

    def get(self, key: str) -> KeyValue | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.key_value(key)

    def scan(self, prefix: str) -> list[KeyValue]:
        return [self._entries[key].key_value(key) for key in self._keys_with_prefix(prefix)]

    # -- transactions -------------------------------------------------------------------------

    def txn(
        self,
        compares: Sequence[Compare],
        success_ops: Sequence[Op],
        failure_ops: Sequence[Op] = (),
    ) -> tuple[TxnResult, list[WatchEvent]]:
        """`prepare` and `commit` in one, without the durable change set nobody here reads (it
        decoded every value put: a sixth of the simulated etcd's transactions)."""
        result, changes = self._evaluate(compares, success_ops, failure_ops)
        return result, self._apply(result.revision, changes)

    def prepare(
        self,
        compares: Sequence[Compare],
        success_ops: Sequence[Op],
        failure_ops: Sequence[Op] = (),
    ) -> PreparedTxn:
        """Evaluates a transaction without changing anything.

        Raises ValueError when a branch puts one key twice or puts a key it also deletes (etcd
        rejects such requests, and accepting them here would make backends disagree), and
        LeaseNotFound when the executed branch puts with an unknown lease.
        """
        result, changes = self._evaluate(compares, success_ops, failure_ops)
        return PreparedTxn(
            result=result,
            durable_changes=self._durable_effect(changes),
            changes=changes,
            base_epoch=self._epoch,
        )

    def _evaluate(
        self,
        compares: Sequence[Compare],
        success_ops: Sequence[Op],
        failure_ops: Sequence[Op],
    ) -> tuple[TxnResult, dict[str, _Entry | None]]:
        """The transaction's result and its changes (key → new entry, None: removed)."""
        _check_no_duplicate_keys(success_ops)
        _check_no_duplicate_keys(failure_ops)
        succeeded = all(self._holds(compare) for compare in compares)
        ops = success_ops if succeeded else failure_ops
        for op in ops:
            if isinstance(op, Put) and op.lease is not None and op.lease not in self._leases:
                raise LeaseNotFound(f"lease {op.lease} does not exist (expired or revoked?)")

        revision = self._revision + 1
        changes: dict[str, _Entry | None] = {}

        def current(key: str) -> _Entry | None:
            return changes[key] if key in changes else self._entries.get(key)

        responses: list[Any] = []
        for op in ops:
            if isinstance(op, Get):
                entry = current(op.key)
                responses.append(None if entry is None else entry.key_value(op.key))
            elif isinstance(op, Put):
                prev = current(op.key)
                changes[op.key] = _Entry(
                    encode_value(op.value),
                    revision if prev is None else prev.create_revision,
                    revision,
                    1 if prev is None else prev.version + 1,
                    op.lease,
                )
                responses.append(None if prev is None else prev.stored_key_value(op.key))
            elif isinstance(op, Delete):
                existed = current(op.key) is not None
                if existed:
                    changes[op.key] = None
                responses.append(existed)
            else:
                # A put under this prefix in the same branch was rejected above, so only
                # committed keys can match.
                doomed = [k for k in self._keys_with_prefix(op.prefix) if current(k) is not None]
                changes.update(dict.fromkeys(doomed))
                responses.append(len(doomed))

        result = TxnResult(succeeded, revision if changes else self._revision, tuple(responses))
        return result, changes

    def commit(self, prepared: PreparedTxn) -> list[WatchEvent]:
        """Applies a transaction prepared against the current state; returns its events."""
        if prepared.base_epoch != self._epoch:
            raise RuntimeError("the state changed between prepare and commit")
        return self._apply(prepared.result.revision, prepared.changes)

    def replay(self, revision: int, durable_changes: Mapping[str, KeyValue | None]) -> None:
        """Re-applies one durable change set, as `prepare` computed it, at its original revision.

        Used to rebuild the state from a log. The revision may skip numbers: transactions that
        only touched lease-bound keys were never logged.
        """
        if revision <= self._revision:
            raise ValueError(f"revision {revision} is not after the current {self._revision}")
        changes = {
            key: None
            if kv is None
            else _Entry(encode_value(kv.value), kv.create_revision, revision, kv.version, None)
            for key, kv in durable_changes.items()
        }
        self._apply(revision, changes)
        self._revision = revision

    def put(self, key: str, value: JSONValue, lease: int | None = None) -> int:
        """Single-key helpers for callers that fan out no events (stores go through `txn`)."""
        return self.txn((), (Put(key, value, lease),))[0].revision

    def delete(self, key: str) -> bool:
        deleted: bool = self.txn((), (Delete(key),))[0].responses[0]
        return deleted

    def delete_prefix(self, prefix: str) -> int:
        count: int = self.txn((), (DeletePrefix(prefix),))[0].responses[0]
        return count

    # -- leases -------------------------------------------------------------------------------

    def grant_lease(self, ttl_s: float, now_s: float) -> int:
        if ttl_s <= 0:
            raise ValueError(f"a lease needs a positive TTL, got {ttl_s}")
        lease_id = self._next_lease_id
        self._next_lease_id += 1
        self._leases[lease_id] = _Lease(ttl_s, now_s + ttl_s)
        return lease_id

    def keepalive(self, lease_id: int, now_s: float) -> None:
        """Restarts the lease's TTL. A lease past its deadline is gone even before `expire`
        collects its keys: reviving it would resurrect keys other nodes may consider dead."""
        lease = self._leases.get(lease_id)
        if lease is None or lease.deadline_s <= now_s:
            raise LeaseNotFound(f"lease {lease_id} does not exist (expired or revoked?)")
        lease.deadline_s = now_s + lease.ttl_s

    def revoke(self, lease_id: int) -> list[WatchEvent]:
        """Ends the lease and deletes its keys in one revision (none if it had no keys)."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            raise LeaseNotFound(f"lease {lease_id} does not exist (expired or revoked?)")
        self._epoch += 1
        return self._apply(self._revision + 1, dict.fromkeys(sorted(lease.keys)))

    def expire(self, now_s: float) -> list[WatchEvent]:
        """Revokes every lease whose deadline has passed, oldest deadline first, one revision
        per lease with keys (as etcd revokes leases one by one)."""
        expired = sorted(
            (lease.deadline_s, lease_id)
            for lease_id, lease in self._leases.items()
            if lease.deadline_s <= now_s
        )
        events: list[WatchEvent] = []
        for _, lease_id in expired:
            events.extend(self.revoke(lease_id))
        return events

    # -- history ------------------------------------------------------------------------------

    def events_since(self, revision: int, prefix: str = "") -> list[WatchEvent]:
        """Events after `revision` for keys under `prefix`, oldest first."""
        if revision < 0:
            raise ValueError(f"revisions are not negative, got {revision}")
        if revision < self._history_floor:
            raise CompactedError(
                f"revision {revision} is compacted: history only holds changes after revision "
                f"{self._history_floor}; re-read the keys and watch from the current revision"
            )
        start = bisect.bisect_right(self._history, revision, key=_event_revision)
        return [event for event in self._history[start:] if event.key.startswith(prefix)]

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The durable part of the state as a JSON-serialisable dict.

        Leases and lease-bound keys are left out: an ephemeral key says "its owner is alive",
        and the owner (a broker process, a session) does not survive a restart of the store's
        process, so restoring the key would advertise a dead owner until someone noticed.
        """
        return {
            "format": SNAPSHOT_FORMAT,
            "revision": self._revision,
            "entries": [
                {
                    "key": key,
                    "value": decode_value(entry.text),
                    "create_revision": entry.create_revision,
                    "mod_revision": entry.mod_revision,
                    "version": entry.version,
                }
                for key in self._sorted_keys
                if (entry := self._entries[key]).lease is None
            ],
        }

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Replaces the keys and revision counter with a snapshot's; drops all leases and the
        history (watching from before the snapshot raises CompactedError).

        Raises ValueError for anything that is not a snapshot this class wrote.
        """
        if snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unsupported snapshot format {snapshot.get('format')!r}")
        revision = _count(snapshot.get("revision"), "snapshot revision")
        items = snapshot.get("entries")
        if not isinstance(items, list):
            raise ValueError("snapshot entries must be a list")
        entries: dict[str, _Entry] = {}
        for item in items:
            key, entry = _snapshot_entry(item, revision)
            if key in entries:
                raise ValueError(f"snapshot key {key!r} appears twice")
            entries[key] = entry
        self._entries = entries
        self._sorted_keys = sorted(entries)
        self._revision = revision
        self._epoch += 1
        self._history = []
        self._history_floor = revision
        self._leases = {}

    # -- internals ----------------------------------------------------------------------------

    def _keys_with_prefix(self, prefix: str) -> list[str]:
        start = bisect.bisect_left(self._sorted_keys, prefix)
        end = start
        while end < len(self._sorted_keys) and self._sorted_keys[end].startswith(prefix):
            end += 1
        return self._sorted_keys[start:end]

    def _holds(self, compare: Compare) -> bool:
        entry = self._entries.get(compare.key)
        if compare.target == "value":
            if entry is None:
                return False  # etcd: a value compare on a missing key never holds
            actual: Any = entry.text
            expected: Any = encode_value(compare.operand)
        else:
            actual = 0 if entry is None else getattr(entry, compare.target)
            expected = compare.operand
        return _COMPARE_OPS[compare.op](actual, expected)

    def _durable_effect(self, changes: Mapping[str, _Entry | None]) -> dict[str, KeyValue | None]:
        effect: dict[str, KeyValue | None] = {}
        for key, new in changes.items():
            if new is not None and new.lease is None:
                effect[key] = new.key_value(key)
            else:
                old = self._entries.get(key)
                if old is not None and old.lease is None:
                    # Also when a lease-bound put replaces a durable key: after a restart the
                    # lease is gone, so the key must be absent, not back at its old value.
                    effect[key] = None
        return effect

    def _apply(self, revision: int, changes: Mapping[str, _Entry | None]) -> list[WatchEvent]:
        events: list[WatchEvent] = []
        for key, new in changes.items():
            old = self._entries.get(key)
            if old is None and new is None:
                continue
            if old is not None and old.lease is not None and old.lease in self._leases:
                self._leases[old.lease].keys.discard(key)
            if new is None:
                del self._entries[key]
                del self._sorted_keys[bisect.bisect_left(self._sorted_keys, key)]
            else:
                if old is None:
                    bisect.insort(self._sorted_keys, key)
                self._entries[key] = new
                if new.lease is not None:
                    self._leases[new.lease].keys.add(key)
            events.append(
                StoredEvent(
                    "delete" if new is None else "put",
                    key,
                    None if new is None else new.text,
                    revision,
                    None if old is None else old.text,
                    None if new is None else new.lease,
                )
            )
        if events:
            self._revision = revision
            self._epoch += 1
            self._remember(events)
        return events

    def _remember(self, events: Iterable[WatchEvent]) -> None:
        history = self._history
        history.extend(events)
        excess = len(history) - self._history_limit
        if excess <= 0:
            return
        # Drop whole revisions only: a watcher resuming after revision R must get all of R+1.
        cut = excess
        while cut < len(history) and history[cut].mod_revision == history[cut - 1].mod_revision:
            cut += 1
        self._history_floor = history[cut - 1].mod_revision
        del history[:cut]


def _event_revision(event: WatchEvent) -> int:
    return event.mod_revision


def _check_no_duplicate_keys(ops: Sequence[Op]) -> None:
    puts: set[str] = set()
    deleted_keys: set[str] = set()
    deleted_prefixes: list[str] = []
    for op in ops:
        if isinstance(op, Put):
            if op.key in puts:
                raise ValueError(f"key {op.key!r} is put twice in one transaction")
            puts.add(op.key)
        elif isinstance(op, Delete):
            deleted_keys.add(op.key)
        elif isinstance(op, DeletePrefix):
            deleted_prefixes.append(op.prefix)
    for key in puts:
        if key in deleted_keys or any(key.startswith(p) for p in deleted_prefixes):
            raise ValueError(f"key {key!r} is both put and deleted in one transaction")


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"bad {what} {value!r}")
    return value


def _snapshot_entry(item: object, revision: int) -> tuple[str, _Entry]:
    if not isinstance(item, dict) or not isinstance(key := item.get("key"), str) or not key:
        raise ValueError(f"bad snapshot entry {item!r}")
    create, mod, version = (
        _count(item.get(field), f"{field} of snapshot key {key!r}")
        for field in ("create_revision", "mod_revision", "version")
    )
    if not (0 < create <= mod <= revision and version > 0):
        raise ValueError(f"inconsistent revisions for snapshot key {key!r}")
    return key, _Entry(encode_value(item.get("value")), create, mod, version, None)
