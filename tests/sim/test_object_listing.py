"""The simulated object store keeps each listed prefix's listing up to date (sim/objects.py,
`_Objects`): whatever writes and deletes happen, and however they reach the dict, a listing
is the sorted (key, last-modified) pairs of the objects under the prefix."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sim.objects import StoredBlob, _Objects

KEYS = st.builds(lambda a, b, n: f"{a}/{b}/{n}", st.sampled_from("ab"), st.sampled_from("abc"),
                 st.integers(0, 9))  # fmt: skip
PREFIXES = st.sampled_from(["", "a/", "a/b/", "b/c/", "c/"])
STEPS = st.one_of(
    st.tuples(st.just("set"), KEYS, st.integers(0, 99)),
    st.tuples(st.just("pop"), KEYS, st.just(0)),
    st.tuples(st.just("del"), KEYS, st.just(0)),
    st.tuples(st.just("setdefault"), KEYS, st.integers(0, 99)),
    st.tuples(st.just("update"), KEYS, st.integers(0, 99)),
    st.tuples(st.just("list"), PREFIXES, st.just(0)),
)


@settings(max_examples=300)
@given(st.lists(STEPS, max_size=80))
@example([("list", "", 0), ("set", "a/a/1", 1), ("set", "a/a/1", 2)])  # written again
@example([("list", "a/", 0), ("set", "a/a/1", 1), ("pop", "a/a/1", 0)])
def test_a_listing_is_always_the_sorted_objects_under_its_prefix(steps: list) -> None:
    objects = _Objects()
    for kind, key, ms in steps:
        if kind == "set":
            objects[key] = StoredBlob(b"", ms)
        elif kind == "pop":
            objects.pop(key, None)
        elif kind == "del" and key in objects:
            del objects[key]
        elif kind == "setdefault":
            objects.setdefault(key, StoredBlob(b"", ms))
        elif kind == "update":
            objects.update({key: StoredBlob(b"", ms)})
        elif kind == "list":
            naive = sorted((k, o.modified_ms) for k, o in objects.items() if k.startswith(key))
            assert objects.listing(key) == naive
    for prefix in ["", "a/", "a/b/", "b/c/", "c/"]:
        naive = sorted((k, o.modified_ms) for k, o in objects.items() if k.startswith(prefix))
        assert objects.listing(prefix) == naive
