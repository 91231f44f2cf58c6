"""The object tier's storage through fsspec (`file://`, `memory://`, `s3://` and the rest):
whole-object writes, ranged reads, listings and deletes. Every call blocks, so the production
port (`danube.runtime.io_port`) runs them in worker threads; nothing here decides anything
(`danube.machines.tiering` does). A deleted topic's objects are removed by the interpreter's
`flows.delete_objects`, in a drop or, for the cluster's DeleteTopic, through
`delete_topic_objects`.

Credentials are never passed through here: s3fs reads them from the environment and the
SDK's default chain, so they appear in no configuration dump and no log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import fsspec
import trio

from danube import keys
from danube.effects import ObjectDelete, ObjectList
from danube.effects.flow import drive
from danube.interpreter import flows
from danube.machines.tiering import UploadError
from danube.machines.wal.format import WalFormatError
from danube.values.names import parse_topic

log = logging.getLogger("danube.runtime")

_THROTTLING = ("SlowDown", "Throttl", "TooManyRequests", "503", "429")


class ObjectStore:
    def __init__(self, root: str, *, endpoint: str | None = None, region: str | None = None):
        options: dict[str, Any] = {}
        if root.startswith("s3://"):
            client: dict[str, Any] = {}
            if endpoint:
                client["endpoint_url"] = endpoint
            if region:
                client["region_name"] = region
            options["client_kwargs"] = client
            options["loop"] = io_loop()
        self.root = root
        self.fs, base = fsspec.core.url_to_fs(root, **options)
        self._base = base.rstrip("/")
        self._local = "file" in _protocols(self.fs)

    def describe(self) -> str:
        """For logs: the root URL without anything secret in it (credentials never are)."""
        return self.root

    def _path(self, key: str) -> str:
        return f"{self._base}/{key}"

    def put(self, key: str, data: bytes) -> None:
        """Writes the whole object atomically: readers and crashes see all of it or none."""
        path = self._path(key)
        if not self._local:
            self.fs.pipe_file(path, data)
            return
        final = Path(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.with_name(final.name + ".tmp")
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)
        directory = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(self._path(key), start=start, end=end))

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(key, last modified in ms) of every object under `prefix`."""
        try:
            found = self.fs.find(self._path(prefix), detail=True)
        except FileNotFoundError:
            return []
        listed = []
        for path, info in found.items():
            key = path[len(self._base) + 1 :] if path.startswith(self._base) else path
            listed.append((key, _modified_ms(info)))
        return sorted(listed)

    def delete(self, key: str) -> None:
        self.fs.rm_file(self._path(key))


def io_loop() -> asyncio.AbstractEventLoop:
    """A plain asyncio loop in a thread of its own for s3fs. fsspec would make one through
    the global event-loop policy, which under trio-asyncio yields a loop that cannot run in
    another thread."""
    loop = asyncio.SelectorEventLoop()
    threading.Thread(target=loop.run_forever, name="danube-object-io", daemon=True).start()
    return loop


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _modified_ms(info: dict[str, Any]) -> int:
    value = info.get("LastModified", info.get("mtime", info.get("created", 0)))
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(float(value or 0) * 1000)


def classify(error: BaseException) -> UploadError:
    """What an upload failure means for the uploader: throttling, a transient server or
    network error, or something only an operator fixes (missing bucket or segment, denied
    access, a segment that does not verify)."""
    if isinstance(error, (FileNotFoundError, PermissionError, WalFormatError)):
        return UploadError.FATAL
    # s3fs turns S3's SlowDown into OSError(EBUSY, "Reduce your request rate."), keeping the
    # original as the cause: look at the whole chain.
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno == errno.EBUSY:
            return UploadError.THROTTLED
        text = f"{type(cause).__name__} {cause}"
        if any(mark in text for mark in _THROTTLING) or "request rate" in text.lower():
            return UploadError.THROTTLED
        cause = cause.__cause__ or cause.__context__
    return UploadError.SERVER_ERROR


async def delete_topic_objects(objects: ObjectStore, topic: str) -> bool:
    """Deletes a deleted topic's uploaded objects (trio, in worker threads) by the
    interpreter's own flow (`flows.delete_objects`, what a dropped topic's objects go
    through); False when the store failed. A failure never fails the deletion: its metadata
    is gone, so the objects left are named by no index and never read again, and the log
    line says which remain."""
    prefix = keys.object_prefix(parse_topic(topic))

    async def perform(request: Any) -> Any:
        if isinstance(request, ObjectList):
            return await trio.to_thread.run_sync(objects.list, request.prefix)
        assert isinstance(request, ObjectDelete), request
        with contextlib.suppress(FileNotFoundError):  # what is not there is deleted
            await trio.to_thread.run_sync(objects.delete, request.key)
        return None

    deleted, error = await drive(flows.delete_objects(prefix), perform)
    if error is not None:
        log.warning(
            "event=objects_not_deleted topic=%s prefix=%s deleted=%d error=%r",
            topic, prefix, deleted, error,
        )  # fmt: skip
        return False
    log.info("event=objects_deleted topic=%s count=%d", topic, deleted)
    return True
