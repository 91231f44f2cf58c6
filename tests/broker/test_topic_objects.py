"""Deleting a deleted topic's objects (danube.runtime.object_store.delete_topic_objects), the
routine the standalone runtime and the cluster's DeleteTopic share: it removes every object
under the topic's prefix and never raises, since the topic's metadata is gone already."""

from __future__ import annotations

from pathlib import Path

import trio

from danube.runtime.object_store import ObjectStore, delete_topic_objects


class _Failing(ObjectStore):
    """A store whose deletes fail after the first, as a throttled or unreachable S3 does."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.deletes = 0

    def delete(self, key: str) -> None:
        self.deletes += 1
        if self.deletes > 1:
            raise OSError("SlowDown")
        super().delete(key)


def _store_with_two_topics(store: ObjectStore) -> None:
    for topic in ("doomed", "kept"):
        for segment in range(2):
            store.put(f"storage/topics/default/{topic}/segments/{segment}.wal", b"x")


def test_every_object_of_the_topic_goes_and_no_other(tmp_path: Path) -> None:
    store = ObjectStore(f"file://{tmp_path}")
    _store_with_two_topics(store)
    assert trio.run(delete_topic_objects, store, "/default/doomed")
    assert store.list("storage/topics/default/doomed/") == []
    assert len(store.list("storage/topics/default/kept/")) == 2


def test_a_failing_store_is_reported_not_raised(tmp_path: Path) -> None:
    store = _Failing(f"file://{tmp_path}")
    _store_with_two_topics(store)
    assert not trio.run(delete_topic_objects, store, "/default/doomed")
    assert len(store.list("storage/topics/default/doomed/")) == 1
