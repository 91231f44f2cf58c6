"""The state's watch events and a put's previous value decode their values when first read
(`StoredEvent`, `StoredKeyValue`; issue 22 round 11): they read, compare, copy and pickle as
the plain `WatchEvent` and `KeyValue` with the same fields."""

from __future__ import annotations

import copy
import pickle

from danube.metadata.model import Delete, KeyValue, Put, WatchEvent
from danube.metadata.state import MetadataState, StoredEvent, StoredKeyValue


def test_events_and_previous_values_read_as_the_plain_ones() -> None:
    state = MetadataState()
    state.txn((), (Put("/a", {"n": 1}),))
    result, events = state.txn((), (Put("/a", {"n": 2}), Put("/b", [1, "x"])))

    assert all(isinstance(event, StoredEvent) for event in events)
    assert events == [
        WatchEvent("put", "/a", {"n": 2}, result.revision, {"n": 1}),
        WatchEvent("put", "/b", [1, "x"], result.revision, None),
    ]
    assert WatchEvent("put", "/b", [1, "x"], result.revision, None) == events[1]
    assert events[0] != WatchEvent("put", "/a", {"n": 3}, result.revision, {"n": 1})
    assert events[0].value is events[0].value  # decoded once, then kept

    previous = result.responses[0]
    assert isinstance(previous, StoredKeyValue)
    assert previous == KeyValue("/a", {"n": 1}, 1, 1, 1, None)
    assert previous.value == {"n": 1} and result.responses[1] is None

    for plain in (copy.deepcopy(events[0]), pickle.loads(pickle.dumps(events[0]))):
        assert type(plain) is WatchEvent and plain == events[0]
    assert type(copy.copy(previous)) is KeyValue and copy.copy(previous) == previous


def test_a_delete_has_its_removed_value_as_the_previous_one() -> None:
    state = MetadataState()
    state.txn((), (Put("/a", "kept"),))
    result, events = state.txn((), (Delete("/a"),))
    assert events == [WatchEvent("delete", "/a", None, result.revision, "kept")]
    assert events[0].value is None and events[0].prev_value == "kept"
