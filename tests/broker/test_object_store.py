"""The fsspec object store the broker's object tier writes through: the same calls on
`file://` and `memory://` (and on S3 in test_tiered.py), and the failure classes the uploader
acts on."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from danube.machines.tiering import UploadError
from danube.machines.wal.format import WalFormatError
from danube.runtime.object_store import ObjectStore, classify


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "file":
        return ObjectStore(f"file://{tmp_path / 'objects'}")
    return ObjectStore(f"memory://bucket-{uuid.uuid4().hex[:8]}/danube")


def test_put_get_list_delete(store: ObjectStore) -> None:
    key = "storage/topics/default/t/segments/00000000000000000000-00000000000000000010.wal"
    store.put(key, b"0123456789")
    store.put(key, b"abcdefghij")  # an upload repeated after a crash overwrites
    assert store.get_range(key, 2, 5) == b"cde"
    listed = store.list("storage/topics/default/t/segments/")
    assert [k for k, _ in listed] == [key]
    assert all(modified > 0 for _, modified in listed)
    assert store.list("storage/topics/default/other/") == []
    store.delete(key)
    assert store.list("storage/topics/default/t/segments/") == []


def test_file_store_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = ObjectStore(f"file://{tmp_path}")
    store.put("a/b/c.wal", b"x" * 100)
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["c.wal"]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (FileNotFoundError("no such bucket"), UploadError.FATAL),
        (PermissionError("denied"), UploadError.FATAL),
        (WalFormatError("frame at 64 does not verify"), UploadError.FATAL),
        (OSError("An error occurred (SlowDown) when calling PutObject"), UploadError.THROTTLED),
        (OSError("503 Service Unavailable"), UploadError.THROTTLED),
        (ConnectionResetError("reset by peer"), UploadError.SERVER_ERROR),
        (TimeoutError("read timed out"), UploadError.SERVER_ERROR),
    ],
)
def test_failures_are_classified_for_the_uploader(error: BaseException, kind: UploadError) -> None:
    assert classify(error) is kind


def test_s3fs_slowdown_is_throttling_through_its_cause() -> None:
    """Regression: s3fs raises OSError(EBUSY, "Reduce your request rate.") from S3's
    SlowDown; the text alone names neither, and it was taken for a transient error."""
    import errno

    try:
        try:
            raise RuntimeError("An error occurred (SlowDown) when calling the PutObject")
        except RuntimeError as original:
            raise OSError(errno.EBUSY, "Reduce your request rate.") from original
    except OSError as translated:
        assert classify(translated) is UploadError.THROTTLED
    assert classify(OSError(errno.EBUSY, "busy")) is UploadError.THROTTLED
