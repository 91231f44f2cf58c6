"""Key-Shared routing: glob key filters, the consistent-hash ring, and the hashes under it."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.dispatch import HashRing, KeyFilter, NonReliableSubscription, QueueLimits
from danube.machines.dispatch import SubscriptionType as T
from danube.machines.dispatch.keyshared import VIRTUAL_NODES_PER_CONSUMER, accepts
from danube.values.hashing import fmix32, fnv1a_64, partition_for_key, ring_hash
from tests.dispatch.reference import glob_match

KEYS = [f"key-{i}".encode() for i in range(1000)]


# -- hashes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"b", 0xAF63DF4C8601F1A5),
        (b"foo", 0xDCB27518FED9D577),
        (b"foob", 0xDD120E790C2512AF),
        (b"fooba", 0xCAC165AFA2FEF40A),
        (b"foobar", 0x85944171F73967E8),
    ],
)
def test_fnv1a_64_known_vectors(data: bytes, expected: int) -> None:
    assert fnv1a_64(data) == expected


def test_fmix32_known_vectors() -> None:
    assert fmix32(0) == 0
    assert fmix32(1) == 0x514E28B7  # murmur3 finaliser reference value
    assert all(0 <= fmix32(v) < 2**32 for v in (1, 2**31, 2**32 - 1))


@given(st.binary(max_size=64))
@settings(max_examples=50)
def test_ring_hash_is_folded_fnv_then_fmix32(data: bytes) -> None:
    wide = fnv1a_64(data)
    assert ring_hash(data) == fmix32((wide >> 32) ^ (wide & 0xFFFFFFFF))
    assert 0 <= ring_hash(data) < 2**32


@given(st.text(st.sampled_from("ab-_é€😀 0"), max_size=20), st.integers(1, 64))
@settings(max_examples=50)
def test_partition_for_key(key: str, partitions: int) -> None:
    index = partition_for_key(key, partitions)
    assert 0 <= index < partitions
    assert index == fnv1a_64(key.encode("utf-8")) % partitions


def test_partition_for_key_example() -> None:
    assert partition_for_key("foobar", 7) == 0x85944171F73967E8 % 7
    assert partition_for_key("anything", 1) == 0


# -- glob filters -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("*", b"", True),
        ("*", b"anything at all", True),
        ("", b"", True),
        ("", b"a", False),
        ("a*", b"a", True),
        ("a*", b"abc", True),
        ("a*", b"ba", False),
        ("*a", b"ba", True),
        ("*a", b"ab", False),
        ("a*c", b"ac", True),
        ("a*c", b"abbbc", True),
        ("a*c", b"abcd", False),
        ("**", b"xyz", True),
        ("?", b"x", True),
        ("?", b"", False),
        ("?", b"xy", False),
        ("??", b"xy", True),
        ("a?c", b"abc", True),
        ("a?c", b"ac", False),
        ("abc", b"abc", True),
        ("abc", b"abcd", False),  # full match, not a prefix
        ("abc", b"xabc", False),  # full match, not a search
        ("ABC", b"abc", False),  # case-sensitive
        ("abc", b"ABC", False),
        ("a.c", b"abc", False),  # regex metacharacters are literal
        ("a.c", b"a.c", True),
        ("[ab]", b"a", False),
        ("[ab]", b"[ab]", True),
        ("a+", b"aa", False),
        ("a+", b"a+", True),
        ("^a$", b"^a$", True),
        ("\\d", b"\\d", True),
        ("\\d", b"1", False),
        ("(a|b)", b"a", False),
        ("a*b", b"a\nb", True),  # `*` crosses newlines
        ("?", b"\n", True),
        ("?", "é".encode(), False),  # `?` is one *byte*; é is two in UTF-8
        ("??", "é".encode(), True),
        ("é", "é".encode(), True),
        ("caf?", "café".encode(), False),
        ("caf*", "café".encode(), True),
        ("?", b"\xff", True),
        ("order-*", b"order-42", True),
        ("order-*", b"Order-42", False),
    ],
)
def test_key_filter_examples(pattern: str, key: bytes, expected: bool) -> None:
    assert KeyFilter(pattern).matches(key) is expected
    assert glob_match(pattern.encode(), key) is expected, "reference matcher disagrees"


def test_accepts_no_filters_means_every_key() -> None:
    assert accepts((), b"")
    assert accepts((), b"\x00\xff")
    filters = (KeyFilter("a*"), KeyFilter("b?"))
    assert accepts(filters, b"abc")
    assert accepts(filters, b"bx")
    assert not accepts(filters, b"bxx")
    assert not accepts(filters, b"c")


GLOB_ALPHABET = st.sampled_from(list("ab*?.[]\\+^$(|)é\n"))
KEY_BYTES = st.sampled_from([*b"ab.[]\\+^$(|)*?\n", *"é".encode(), 0, 255])


@settings(max_examples=250)
@given(
    pattern=st.lists(GLOB_ALPHABET, max_size=8).map("".join),
    key=st.lists(KEY_BYTES, max_size=10).map(bytes),
)
def test_key_filter_agrees_with_reference(pattern: str, key: bytes) -> None:
    assert KeyFilter(pattern).matches(key) == glob_match(pattern.encode(), key)


@settings(max_examples=200)
@given(
    pattern=st.lists(st.sampled_from(list("ab*?é")), max_size=6).map("".join),
    key=st.lists(KEY_BYTES, max_size=8).map(bytes),
)
def test_reference_agrees_with_fnmatch_on_bracket_free_patterns(pattern: str, key: bytes) -> None:
    """Cross-checks the reference itself: with no `[`, fnmatch over latin-1 (one char per
    byte) is the same glob."""
    expected = fnmatch.fnmatchcase(key.decode("latin-1"), pattern.encode().decode("latin-1"))
    assert glob_match(pattern.encode(), key) == expected


@settings(max_examples=100)
@given(key=st.binary(max_size=12))
def test_key_matches_itself_when_it_has_no_wildcards(key: bytes) -> None:
    text = key.decode("utf-8", errors="ignore").replace("*", "").replace("?", "")
    assert KeyFilter(text).matches(text.encode())
    assert KeyFilter("*").matches(key)
    assert KeyFilter("?" * len(key)).matches(key)
    assert not KeyFilter("?" * (len(key) + 1)).matches(key)


# -- the ring ---------------------------------------------------------------------------------


def mapping(ring: HashRing, keys: list[bytes] = KEYS) -> dict[bytes, int | None]:
    return {key: ring.owner(key) for key in keys}


NAME_SETS = [
    ("c1", "c2", "c3"),
    ("a", "b", "c"),
    ("consumer-a", "consumer-b", "consumer-c"),
    ("x", "y", "z"),
    ("orders-0", "orders-1", "orders-2"),
    ("alpha", "beta", "gamma"),
    ("1", "2", "3"),
    ("worker_east", "worker_west", "worker_north"),
]


@pytest.mark.parametrize("names", NAME_SETS)
def test_adding_a_third_consumer_moves_a_bounded_share_only_to_it(
    names: tuple[str, str, str],
) -> None:
    two = HashRing([(1, names[0]), (2, names[1])])
    three = HashRing([(1, names[0]), (2, names[1]), (3, names[2])])
    before, after = mapping(two), mapping(three)
    moved = [key for key in KEYS if before[key] != after[key]]
    assert 150 <= len(moved) <= 550, f"{len(moved)} of 1000 keys moved"
    assert all(after[key] == 3 for key in moved), "a key may only move to the new consumer"
    shares = [list(after.values()).count(member) for member in (1, 2, 3)]
    assert min(shares) >= 150, shares


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(
        st.text(st.sampled_from("abcxyz-_019"), min_size=1, max_size=6),
        min_size=2,
        max_size=5,
        unique=True,
    ),
    leaving=st.integers(0, 4),
)
def test_removing_a_consumer_moves_only_its_keys(names: list[str], leaving: int) -> None:
    keys = KEYS[:300]
    ring = HashRing(enumerate(names))
    before = mapping(ring, keys)
    gone = leaving % len(names)
    ring.remove(gone)
    assert gone not in ring and len(ring) == len(names) - 1
    after = mapping(ring, keys)
    for key in keys:
        if before[key] != gone:
            assert after[key] == before[key]
        else:
            assert after[key] not in (gone, None)
    ring.add(gone, names[gone])
    assert mapping(ring, keys) == before, "re-adding restores the mapping"


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(
        st.text(st.sampled_from("abcxyz-_019"), min_size=1, max_size=6),
        min_size=1,
        max_size=5,
        unique=True,
    ),
    perm=st.randoms(use_true_random=False),
)
def test_mapping_depends_only_on_names(names: list[str], perm) -> None:
    """Same names, different ids and insertion order: every key lands on the same name."""
    keys = KEYS[:200]
    first = HashRing((i, name) for i, name in enumerate(names))
    shuffled = list(names)
    perm.shuffle(shuffled)
    second = HashRing((1000 + i, name) for i, name in enumerate(shuffled))
    name_of_first = dict(enumerate(names))
    name_of_second = {1000 + i: name for i, name in enumerate(shuffled)}
    for key in keys:
        assert name_of_first[first.owner(key)] == name_of_second[second.owner(key)]


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, max_size=5, unique=True),
    eligible=st.sets(st.integers(0, 4)),
    key=st.binary(max_size=8),
)
def test_owner_among_eligible_is_owner_on_the_filtered_ring(
    names: list[str], eligible: set[int], key: bytes
) -> None:
    ring = HashRing(enumerate(names))
    allowed = frozenset(i for i in eligible if i < len(names))
    filtered = HashRing((i, names[i]) for i in sorted(allowed))
    assert ring.owner(key, allowed) == filtered.owner(key)
    assert ring.owner(key, frozenset(range(len(names)))) == ring.owner(key)


def test_ring_edge_cases() -> None:
    assert HashRing().owner(b"k") is None
    ring = HashRing([(7, "solo")])
    assert all(ring.owner(key) == 7 for key in KEYS[:50])
    assert ring.owner(b"k", frozenset()) is None
    ring.remove(99)  # unknown: no-op
    assert len(ring) == 1
    assert len(ring._positions) == VIRTUAL_NODES_PER_CONSUMER == 100


def test_virtual_nodes_are_placed_by_name() -> None:
    """100 virtual nodes per consumer, at ring_hash of name-derived labels; the member id plays
    no part (a key keeps its consumer across reconnects with a new id)."""
    a = HashRing([(1, "worker")])
    b = HashRing([(2, "worker")])
    assert a._positions == b._positions
    assert len(set(a._positions)) == 100
    assert a._positions != HashRing([(1, "other")])._positions


def test_subscription_mapping_is_deterministic_across_instances_and_reconnects() -> None:
    def build(ids: list[int]) -> tuple[NonReliableSubscription, dict[int, str]]:
        sub = NonReliableSubscription(T.KEY_SHARED, QueueLimits(10_000, 10**9))
        names = {}
        for consumer_id, name in zip(ids, ["east", "west", "north"], strict=True):
            sub.add_consumer(consumer_id, name, ())
            sub.connect(consumer_id)
            names[consumer_id] = name
        return sub, names

    def route(sub: NonReliableSubscription, names: dict[int, str]) -> dict[bytes, str]:
        for key in KEYS[:300]:
            sub.publish(key, 1, key)
        return {key: names[c] for c in names for key in sub.take(c, 10_000)}

    sub_a, names_a = build([1, 2, 3])
    sub_b, names_b = build([30, 20, 10])
    first = route(sub_a, names_a)
    assert len(first) == 300
    assert route(sub_b, names_b) == first
    sub_a.disconnect(2)
    sub_a.connect(2)
    assert route(sub_a, names_a) == first, "a reconnect gives a consumer its keys back"
