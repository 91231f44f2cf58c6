"""MetadataState against a plain-dict model over random operation sequences."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from danube.metadata import (
    Compare,
    Delete,
    DeletePrefix,
    KeyValue,
    MetadataState,
    Op,
    Put,
)

KEYS = st.sampled_from(["/a", "/a/b", "/a/c", "/ab", "/b", "/b/a"])
PREFIXES = st.sampled_from(["", "/", "/a", "/a/", "/b", "/z"])
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text("xy", max_size=2),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text("kv", max_size=1), inner),
    max_leaves=4,
)


@dataclass(frozen=True)
class ModelEntry:
    value: Any
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class MetadataStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = MetadataState()
        # Fed only the durable changes, as the embedded store's log replay is.
        self.replica = MetadataState()
        self.model: dict[str, ModelEntry] = {}
        self.revision = 0
        self.now = 0.0
        # lease id → (ttl, deadline)
        self.leases: dict[int, tuple[float, float]] = {}

    # -- the model ----------------------------------------------------------------------------

    def model_holds(self, compare: Compare) -> bool:
        entry = self.model.get(compare.key)
        actual: object
        expected: object
        if compare.target == "value":
            if entry is None:
                return False  # etcd: no value compare holds on a missing key
            actual = canonical(entry.value)
            expected = canonical(compare.operand)
        else:
            actual = 0 if entry is None else getattr(entry, compare.target)
            expected = compare.operand
        return actual == expected if compare.op == "==" else actual != expected

    def model_apply(self, ops: list[Op]) -> None:
        revision = self.revision + 1
        changed = False
        for op in ops:
            if isinstance(op, Put):
                old = self.model.get(op.key)
                if old is None:
                    self.model[op.key] = ModelEntry(op.value, revision, revision, 1, op.lease)
                else:
                    self.model[op.key] = ModelEntry(
                        op.value, old.create_revision, revision, old.version + 1, op.lease
                    )
                changed = True
            else:
                if isinstance(op, Delete):
                    doomed = [op.key] if op.key in self.model else []
                else:
                    assert isinstance(op, DeletePrefix)
                    doomed = [k for k in self.model if k.startswith(op.prefix)]
                for key in doomed:
                    del self.model[key]
                changed = changed or bool(doomed)
        if changed:
            self.revision = revision

    def run(self, compares: list[Compare], success: list[Op], failure: list[Op]) -> None:
        before = self.state.revision
        prepared = self.state.prepare(compares, success, failure)
        if prepared.durable_changes:
            self.replica.replay(prepared.result.revision, prepared.durable_changes)
        self.state.commit(prepared)
        succeeded = all(self.model_holds(c) for c in compares)
        assert prepared.result.succeeded == succeeded
        self.model_apply(success if succeeded else failure)
        assert self.state.revision >= before

    def model_revoke(self, lease: int) -> None:
        del self.leases[lease]
        self.model_apply([Delete(k) for k, e in sorted(self.model.items()) if e.lease == lease])

    # -- rules --------------------------------------------------------------------------------

    @rule(key=KEYS, value=VALUES)
    def put(self, key: str, value: Any) -> None:
        self.run([], [Put(key, value)], [])

    @precondition(lambda self: self.leases)
    @rule(key=KEYS, value=VALUES, data=st.data())
    def put_with_lease(self, key: str, value: Any, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(sorted(self.leases)))
        self.run([], [Put(key, value, lease)], [])

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        self.run([], [Delete(key)], [])

    @rule(prefix=PREFIXES)
    def delete_prefix(self, prefix: str) -> None:
        self.run([], [DeletePrefix(prefix)], [])

    @rule(
        guard_key=KEYS,
        guard_version=st.integers(0, 3),
        guard_value=VALUES,
        on_value=st.booleans(),
        equal=st.booleans(),
        success=st.dictionaries(KEYS, st.none() | VALUES, max_size=3),
        failure=st.dictionaries(KEYS, st.none() | VALUES, max_size=2),
    )
    def txn(
        self,
        guard_key: str,
        guard_version: int,
        guard_value: Any,
        on_value: bool,
        equal: bool,
        success: dict[str, Any],
        failure: dict[str, Any],
    ) -> None:
        op: Literal["==", "!="] = "==" if equal else "!="
        if on_value:
            compare = Compare(guard_key, "value", op, guard_value)
        else:
            compare = Compare(guard_key, "version", op, guard_version)

        def ops(spec: dict[str, Any]) -> list[Op]:
            return [Delete(k) if v is None else Put(k, v) for k, v in spec.items()]

        self.run([compare], ops(success), ops(failure))

    @rule(ttl=st.integers(1, 5))
    def grant(self, ttl: int) -> None:
        self.leases[self.state.grant_lease(ttl, self.now)] = (ttl, self.now + ttl)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def keepalive(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(sorted(self.leases)))
        ttl, _ = self.leases[lease]
        self.state.keepalive(lease, self.now)
        self.leases[lease] = (ttl, self.now + ttl)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(sorted(self.leases)))
        self.state.revoke(lease)
        self.model_revoke(lease)

    @rule(seconds=st.sampled_from([0.5, 1, 2, 4]))
    def advance_time(self, seconds: float) -> None:
        self.now += seconds
        self.state.expire(self.now)
        expired = sorted((d, lease) for lease, (_, d) in self.leases.items() if d <= self.now)
        for _, lease in expired:
            self.model_revoke(lease)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def values_and_revision_match(self) -> None:
        assert self.state.revision == self.revision
        expected = [
            KeyValue(k, e.value, e.create_revision, e.mod_revision, e.version, e.lease)
            for k, e in sorted(self.model.items())
        ]
        actual = self.state.scan("")
        assert [replace(kv, value=canonical(kv.value)) for kv in actual] == [
            replace(kv, value=canonical(kv.value)) for kv in expected
        ]

    @invariant()
    def history_replays_to_the_state(self) -> None:
        rebuilt: dict[str, str] = {}
        last = 0
        for event in self.state.events_since(0):
            assert event.mod_revision >= last
            last = event.mod_revision
            if event.kind == "put":
                rebuilt[event.key] = canonical(event.value)
            else:
                assert rebuilt.pop(event.key) == canonical(event.prev_value)
        assert rebuilt == {k: canonical(e.value) for k, e in self.model.items()}

    @invariant()
    def log_replay_and_snapshot_agree_on_durable_keys(self) -> None:
        durable = [kv for kv in self.state.scan("") if kv.lease is None]
        assert self.replica.scan("") == durable
        restored = MetadataState()
        restored.restore(json.loads(json.dumps(self.state.snapshot())))
        assert restored.scan("") == durable
        assert restored.revision == self.state.revision


MetadataStateMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None
)
test_metadata_state_matches_a_dict_model = MetadataStateMachine.TestCase
