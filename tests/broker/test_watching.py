"""Shared pieces of the cluster drivers (danube.runtime.watching)."""

from __future__ import annotations

import trio

from danube.metadata import MetadataError
from danube.runtime.watching import failure_text


def test_a_deadline_without_a_message_reads_as_a_timeout() -> None:
    """`error or "timeout"` printed an empty string for our own deadline: an exception is
    truthy even when its text is empty."""
    assert failure_text(trio.TooSlowError()) == "timeout"
    assert failure_text(MetadataError("etcd unavailable")) == "etcd unavailable"
