"""The object-storage tier of reliable topics (spec/object-layout.md), pure: which sealed WAL
segments to upload and when (`uploader`), what the object index holds and when it is sound
(`index`), where objects and entries are named (`layout`), and which tier serves a read
(`reader`). The fsspec driver and the broker wiring execute the effects."""

from danube.machines.tiering.index import (
    IndexEntry,
    IndexFormatError,
    ObjectFacts,
    describe_object,
    validate_index,
)
from danube.machines.tiering.reader import (
    LocalRead,
    NotAvailable,
    ObjectRead,
    TieredRead,
    decode_object_read,
    plan_read,
)
from danube.machines.tiering.uploader import (
    AllowLocalDelete,
    CommitIndex,
    DeleteObject,
    Halted,
    ListObjects,
    SealedSegment,
    StoredObject,
    Uploader,
    UploaderConfig,
    UploadError,
    UploadSegment,
)

__all__ = [
    "AllowLocalDelete",
    "CommitIndex",
    "DeleteObject",
    "Halted",
    "IndexEntry",
    "IndexFormatError",
    "ListObjects",
    "LocalRead",
    "NotAvailable",
    "ObjectFacts",
    "ObjectRead",
    "SealedSegment",
    "StoredObject",
    "TieredRead",
    "UploadError",
    "UploadSegment",
    "Uploader",
    "UploaderConfig",
    "decode_object_read",
    "describe_object",
    "plan_read",
    "validate_index",
]
