"""MetadataState on its own: the etcd semantics every backend inherits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from danube.metadata import (
    CompactedError,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    KeyValue,
    LeaseNotFound,
    MetadataState,
    Put,
    WatchEvent,
)


def test_revisions_and_versions_follow_etcd() -> None:
    state = MetadataState()
    assert state.revision == 0
    assert state.get("/a") is None
    assert state.put("/a", 1) == 1
    assert state.put("/a", 2) == 2
    assert state.put("/b", 3) == 3
    assert state.get("/a") == KeyValue("/a", 2, 1, 2, 2, None)
    assert state.delete("/a") is True
    assert state.revision == 4
    assert state.delete("/a") is False
    assert state.revision == 4, "deleting a missing key changes nothing"
    assert state.put("/a", 5) == 5
    assert state.get("/a") == KeyValue("/a", 5, 5, 5, 1, None), "version restarts after delete"


def test_scan_is_a_sorted_plain_string_prefix() -> None:
    state = MetadataState()
    for key in ["/t/b", "/t/a", "/tx", "/s", "/t/a/c"]:
        state.put(key, key)
    assert [kv.key for kv in state.scan("/t/")] == ["/t/a", "/t/a/c", "/t/b"]
    assert [kv.key for kv in state.scan("/t")] == ["/t/a", "/t/a/c", "/t/b", "/tx"]
    assert [kv.key for kv in state.scan("")] == ["/s", "/t/a", "/t/a/c", "/t/b", "/tx"]
    assert state.delete_prefix("/t/") == 3
    assert [kv.key for kv in state.scan("")] == ["/s", "/tx"]


def test_values_are_copied_in_and_out() -> None:
    state = MetadataState()
    value: dict[str, Any] = {"b": [1], "a": None}
    state.put("/k", value)
    value["b"].append(2)
    read = state.get("/k")
    assert read is not None and read.value == {"a": None, "b": [1]}
    read.value["b"].append(3)
    assert state.get("/k") == KeyValue("/k", {"a": None, "b": [1]}, 1, 1, 1, None)


def test_values_must_be_json() -> None:
    state = MetadataState()
    with pytest.raises(TypeError):
        state.put("/k", {1, 2})
    with pytest.raises(ValueError):
        state.put("/k", float("nan"))
    assert state.revision == 0


def test_cas_success_runs_success_ops_in_one_revision() -> None:
    state = MetadataState()
    state.put("/lock", "free")
    result, events = state.txn(
        [Compare("/lock", "value", "==", "free"), Compare("/lock", "version", "==", 1)],
        [Put("/lock", "held"), Put("/owner", "b1"), Delete("/nothing"), Get("/owner")],
        [Get("/lock")],
    )
    assert result.succeeded
    assert result.revision == 2
    prev_lock = KeyValue("/lock", "free", 1, 1, 1, None)
    owner = KeyValue("/owner", "b1", 2, 2, 1, None)
    assert result.responses == (prev_lock, None, False, owner)
    assert events == [
        WatchEvent("put", "/lock", "held", 2, "free"),
        WatchEvent("put", "/owner", "b1", 2, None),
    ]


def test_cas_failure_runs_failure_ops() -> None:
    state = MetadataState()
    state.put("/lock", "held")
    result, events = state.txn(
        [Compare("/lock", "value", "==", "free")], [Put("/lock", "mine")], [Get("/lock")]
    )
    assert not result.succeeded
    assert result.revision == 1
    assert result.responses == (KeyValue("/lock", "held", 1, 1, 1, None),)
    assert events == []


def test_compare_on_missing_key_sees_etcd_zero_values() -> None:
    state = MetadataState()

    def holds(*compares: Compare) -> bool:
        return state.txn(compares, [])[0].succeeded

    assert holds(
        Compare("/m", "version", "==", 0),
        Compare("/m", "create_revision", "==", 0),
        Compare("/m", "mod_revision", "==", 0),
    )
    # As in etcd, no value compare holds on a missing key, not even `== None` or `!=`.
    for op in ("==", "!=", "<", ">"):
        assert not holds(Compare("/m", "value", op, None))  # type: ignore[arg-type]
    assert not holds(Compare("/m", "value", "<", "z"))
    assert not holds(Compare("/m", "value", ">", ""))
    state.put("/m", "x")
    assert holds(Compare("/m", "version", ">", 0), Compare("/m", "value", "!=", None))


def test_value_compares_use_canonical_json() -> None:
    state = MetadataState()
    state.put("/k", {"b": 1, "a": [True, None]})

    def holds(op: str, operand: object) -> bool:
        return state.txn([Compare("/k", "value", op, operand)], [])[0].succeeded  # type: ignore[arg-type]

    assert holds("==", {"a": [True, None], "b": 1})
    assert not holds("==", {"a": [1, None], "b": 1}), "true is not 1 in JSON"
    state.put("/n", 10)
    assert state.txn([Compare("/n", "value", "<", 9)], [])[0].succeeded, "byte order, as etcd"


def test_compare_rejects_typos_and_wrong_operands() -> None:
    with pytest.raises(ValueError):
        Compare("/k", "vesion", "==", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Compare("/k", "version", "=", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Compare("/k", "version", "==", "1")
    with pytest.raises(ValueError):
        Put("", 1)


def test_txn_rejects_what_etcd_rejects() -> None:
    state = MetadataState()
    state.put("/t/a", 1)
    with pytest.raises(ValueError, match="put twice"):
        state.txn([], [Put("/x", 1), Put("/x", 2)])
    with pytest.raises(ValueError, match="put and deleted"):
        state.txn([], [DeletePrefix("/t/"), Put("/t/b", 1)])
    with pytest.raises(ValueError, match="put and deleted"):
        state.txn([], [Get("/t/a")], [Delete("/x"), Put("/x", 1)])
    assert state.revision == 1
    result, _ = state.txn([], [Delete("/t/a"), DeletePrefix("/t/")])
    assert result.responses == (True, 0), "overlapping deletes are fine"


def test_history_replays_and_compacts() -> None:
    state = MetadataState(history_limit=4)
    state.put("/a", 1)
    state.txn([], [Put("/b", 1), Put("/c", 1)])
    state.put("/x", 1)
    assert [(e.key, e.mod_revision) for e in state.events_since(1, "/")] == [
        ("/b", 2),
        ("/c", 2),
        ("/x", 3),
    ]
    assert [e.key for e in state.events_since(0, "/b")] == ["/b"]
    assert state.events_since(3) == []
    assert state.events_since(99) == []
    state.put("/y", 1)  # 5 events: revision 1 must go
    with pytest.raises(CompactedError):
        state.events_since(0)
    assert len(state.events_since(1)) == 4
    state.put("/w", 1)  # 5 events again: revision 2 goes whole, both of its events
    with pytest.raises(CompactedError):
        state.events_since(1)
    assert [e.mod_revision for e in state.events_since(2)] == [3, 4, 5]
    state.delete_prefix("/")  # one revision larger than the whole history
    with pytest.raises(CompactedError):
        state.events_since(5)
    assert state.events_since(6) == []
    with pytest.raises(ValueError):
        state.events_since(-1)


def test_lease_lifecycle() -> None:
    state = MetadataState()
    lease = state.grant_lease(10, now_s=100)
    state.put("/eph/a", "a", lease=lease)
    state.put("/eph/b", "b", lease=lease)
    state.put("/durable", "d")
    assert state.expire(109.9) == []
    state.keepalive(lease, now_s=105)
    assert state.expire(114.9) == []
    events = state.expire(115)
    assert events == [
        WatchEvent("delete", "/eph/a", None, 4, "a"),
        WatchEvent("delete", "/eph/b", None, 4, "b"),
    ]
    assert [kv.key for kv in state.scan("/")] == ["/durable"]
    with pytest.raises(LeaseNotFound):
        state.keepalive(lease, now_s=115)
    with pytest.raises(LeaseNotFound):
        state.put("/eph/c", "c", lease=lease)
    with pytest.raises(LeaseNotFound):
        state.revoke(lease)


def test_a_put_event_carries_the_lease_it_was_put_with() -> None:
    """A watcher tells a broker's own leader key from its past incarnation's by the lease."""
    state = MetadataState()
    lease = state.grant_lease(10, now_s=0)
    state.put("/leased", "b1", lease=lease)
    state.put("/plain", "b1")
    state.delete("/leased")
    leased, plain, deleted = state.events_since(0)
    assert (leased.lease, plain.lease, deleted.lease) == (lease, None, None)
    assert leased == WatchEvent("put", "/leased", "b1", leased.mod_revision, None, lease)
    assert leased != WatchEvent("put", "/leased", "b1", leased.mod_revision, None)


def test_keepalive_cannot_revive_an_expired_lease() -> None:
    state = MetadataState()
    lease = state.grant_lease(1, now_s=0)
    state.put("/eph", 1, lease=lease)
    with pytest.raises(LeaseNotFound):
        state.keepalive(lease, now_s=1)
    assert len(state.expire(1)) == 1


def test_revoke_and_lease_moves() -> None:
    state = MetadataState()
    first = state.grant_lease(10, now_s=0)
    second = state.grant_lease(10, now_s=0)
    assert first != second
    state.put("/a", 1, lease=first)
    state.put("/b", 1, lease=first)
    state.put("/a", 2, lease=second)  # moves /a to the second lease
    state.put("/b", 2)  # detaches /b: it is durable now
    assert state.revoke(first) == []
    assert state.revision == 4, "revoking a lease without keys changes no key"
    assert state.revoke(second) == [WatchEvent("delete", "/a", None, 5, 2)]
    assert [kv.key for kv in state.scan("")] == ["/b"]
    with pytest.raises(ValueError):
        state.grant_lease(0, now_s=0)


def test_expiry_uses_one_revision_per_lease() -> None:
    state = MetadataState()
    late = state.grant_lease(5, now_s=0)
    early = state.grant_lease(2, now_s=0)
    state.put("/late", 1, lease=late)
    state.put("/early", 1, lease=early)
    events = state.expire(10)
    assert [(e.key, e.mod_revision) for e in events] == [("/early", 3), ("/late", 4)]


def test_snapshot_keeps_durable_keys_only() -> None:
    state = MetadataState()
    lease = state.grant_lease(10, now_s=0)
    state.put("/d", {"x": [1]})
    state.put("/d", {"x": [2]})
    state.put("/e", "ephemeral", lease=lease)
    state.put("/gone", 1)
    state.delete("/gone")
    snapshot = state.snapshot()
    assert json.loads(json.dumps(snapshot)) == snapshot

    restored = MetadataState()
    restored.grant_lease(1, now_s=0)
    restored.restore(snapshot)
    assert restored.revision == 5
    assert restored.scan("") == [KeyValue("/d", {"x": [2]}, 1, 2, 2, None)]
    with pytest.raises(CompactedError):
        restored.events_since(4)
    assert restored.events_since(5) == []
    assert restored.put("/d", 3) == 6
    assert restored.grant_lease(1, now_s=0) == 2, "lease ids are never reused"
    with pytest.raises(LeaseNotFound):
        restored.put("/x", 1, lease=1)


@pytest.mark.parametrize(
    "snapshot",
    [
        {"format": 2, "revision": 0, "entries": []},
        {"format": 1, "revision": -1, "entries": []},
        {"format": 1, "revision": 1, "entries": {}},
        {"format": 1, "revision": 1, "entries": [{"key": "/a", "value": 1}]},
        {
            "format": 1,
            "revision": 1,
            "entries": [{"key": "/a", "create_revision": 1, "mod_revision": 2, "version": 1}],
        },
    ],
)
def test_restore_rejects_malformed_snapshots(snapshot: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MetadataState().restore(snapshot)


def test_prepare_then_commit_and_stale_prepare() -> None:
    state = MetadataState()
    state.put("/eph", 1)
    prepared = state.prepare([], [Put("/a", 1)])
    assert state.get("/a") is None, "preparing changes nothing"
    assert dict(prepared.durable_changes) == {"/a": KeyValue("/a", 1, 2, 2, 1, None)}
    state.put("/b", 1)
    with pytest.raises(RuntimeError):
        state.commit(prepared)


def test_durable_changes_describe_the_restart_view() -> None:
    state = MetadataState()
    lease = state.grant_lease(10, now_s=0)
    state.put("/k", "durable")
    over = state.prepare([], [Put("/k", "ephemeral", lease=lease), Put("/e", 1, lease=lease)])
    assert dict(over.durable_changes) == {"/k": None}, "after a restart the lease is gone"
    state.commit(over)
    assert dict(state.prepare([], [Delete("/k"), Delete("/e")]).durable_changes) == {}
    back = state.prepare([], [Put("/k", "durable again")])
    assert dict(back.durable_changes) == {"/k": KeyValue("/k", "durable again", 1, 3, 3, None)}


def test_replay_reproduces_durable_keys() -> None:
    state = MetadataState()
    state.replay(3, {"/a": KeyValue("/a", [1], 1, 3, 2, None), "/b": None})
    assert state.revision == 3
    assert state.get("/a") == KeyValue("/a", [1], 1, 3, 2, None)
    assert state.events_since(0) == [WatchEvent("put", "/a", [1], 3, None)]
    with pytest.raises(ValueError):
        state.replay(3, {})


def test_decode_value_is_json_loads_of_canonical_text() -> None:
    """`decode_value` skips `json.loads`' checks of what canonical text never has; each decode
    is a fresh copy."""
    from danube.metadata.state import decode_value, encode_value

    values = [None, True, 0, -7, 2.5, "", 'é \\u2028 "q"', [], {}, [1, [2, {"b": 1, "a": [None]}]]]
    values.append({"key": "a/b", "offsets": [[5, 56], [6, 152]], "nested": {"x": "y"}})
    for value in values:
        text = encode_value(value)
        assert decode_value(text) == json.loads(text) == value
    one = {"a": [1]}
    first, second = decode_value(encode_value(one)), decode_value(encode_value(one))
    assert first == second and first is not second and first["a"] is not second["a"]


def test_encode_value_is_canonical_json_dumps_and_refuses_the_same() -> None:
    """`encode_value` calls the C encoder directly (not through `JSONEncoder.encode`): the
    same text as `json.dumps` with the canonical options, and the same refusals."""
    from danube.metadata.state import encode_value

    def dumps(value: object) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)

    values = [None, True, 0, -7, 2.5, 1e300, "", 'é \u2028 "q"', [], {}, {"b": 1, "a": [None]}]
    values += [{"key": "a/b", "offsets": [[5, 56], [6, 152]], "z": {"y": 1}}, {3: "int key"}]
    for value in values:
        assert encode_value(value) == dumps(value)
    circular: list[object] = []
    circular.append(circular)
    for bad, error in [(float("nan"), ValueError), ({"x": float("inf")}, ValueError),
                       ({"x": object()}, TypeError), ({(1, 2): 1}, TypeError),
                       (circular, ValueError)]:  # fmt: skip
        with pytest.raises(error):
            encode_value(bad)
