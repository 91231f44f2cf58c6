"""Merging queued metadata changes into one transaction (`persist_batches`): the merged
transaction leaves the store exactly as the changes applied one after the other would, and a
batch ends only where one transaction could not express the next change."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from danube.machines.node.persist_batches import merge_persists
from danube.metadata import Delete, DeletePrefix, MetadataState, Op, Put
from danube.metadata.state import _check_no_duplicate_keys

KEYS = ["/a", "/a/b", "/a/c", "/ab", "/b", "/b/a"]
OPS = st.one_of(
    st.builds(Put, st.sampled_from(KEYS), st.integers(0, 3)),
    st.builds(Delete, st.sampled_from(KEYS)),
    st.builds(DeletePrefix, st.sampled_from(["/a", "/a/", "/b", "/z"])),
)


def _valid(ops: list[Op]) -> bool:
    try:
        _check_no_duplicate_keys(ops)
    except ValueError:
        return False
    return True


CHANGE = st.lists(OPS, min_size=1, max_size=3).filter(_valid)
CHANGES = st.lists(CHANGE, max_size=12)
INITIAL = st.dictionaries(st.sampled_from(KEYS), st.integers(0, 3), max_size=4)


def _apply(state: MetadataState, ops: tuple[Op, ...] | list[Op]) -> None:
    state.commit(state.prepare((), ops))


def _values(state: MetadataState) -> dict[str, object]:
    return {kv.key: kv.value for kv in state.scan("")}


def _state(initial: dict[str, int]) -> MetadataState:
    state = MetadataState()
    for key, value in initial.items():
        _apply(state, [Put(key, value)])
    return state


@given(INITIAL, CHANGES, st.integers(1, 5))
def test_merged_batches_leave_the_store_as_the_changes_one_by_one(
    initial: dict[str, int], changes: list[list[Op]], most: int
) -> None:
    one_by_one, merged = _state(initial), _state(initial)
    for ops in changes:
        _apply(one_by_one, ops)
    rest = changes
    while rest:
        count, ops = merge_persists(rest, most)
        assert 1 <= count <= most
        _apply(merged, ops)  # a valid transaction: prepare would raise otherwise
        rest = rest[count:]
    assert _values(merged) == _values(one_by_one)


@given(CHANGES)
def test_a_batch_ends_only_where_the_next_change_cannot_join(changes: list[list[Op]]) -> None:
    rest = changes
    while rest:
        count, _ = merge_persists(rest)
        if count < len(rest):
            deleted = [
                op.prefix for ops in rest[:count] for op in ops if isinstance(op, DeletePrefix)
            ]
            puts = [op.key for op in rest[count] if isinstance(op, Put)]
            assert any(key.startswith(prefix) for key in puts for prefix in deleted)
        rest = rest[count:]


def test_repeated_writes_of_one_key_become_one_put() -> None:
    changes = [[Put("/cursor", n)] for n in range(5)] + [[Put("/other", 1), Delete("/gone")]]
    assert merge_persists(changes) == (6, (Put("/cursor", 4), Put("/other", 1), Delete("/gone")))


def test_a_leased_put_goes_alone() -> None:
    leased = [Put("/e", 1, lease=7)]
    assert merge_persists([leased, [Put("/x", 1)]]) == (1, (Put("/e", 1, lease=7),))
    assert merge_persists([[Put("/x", 1)], leased])[0] == 1
    assert merge_persists([]) == (0, ())
