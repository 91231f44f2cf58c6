"""Broker metadata (namespaces, topics, producers, subscriptions, assignments) as JSON values
under slash-separated keys, behind one etcd-shaped interface with in-memory, embedded durable
and etcd backends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from danube.metadata.embedded import EmbeddedStore
from danube.metadata.memory import MemoryStore
from danube.metadata.model import (
    CompactedError,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    JSONValue,
    KeyValue,
    LeaseNotFound,
    MetadataCorrupted,
    MetadataError,
    Op,
    Put,
    StoreClosed,
    TxnResult,
    WatchEvent,
)
from danube.metadata.state import MetadataState, PreparedTxn
from danube.metadata.store import MetadataStore

if TYPE_CHECKING:
    from danube.metadata.etcd import EtcdStore, EtcdUnavailable

__all__ = [
    "CompactedError",
    "Compare",
    "Delete",
    "DeletePrefix",
    "EmbeddedStore",
    "EtcdStore",
    "EtcdUnavailable",
    "Get",
    "JSONValue",
    "KeyValue",
    "LeaseNotFound",
    "MemoryStore",
    "MetadataCorrupted",
    "MetadataError",
    "MetadataState",
    "MetadataStore",
    "Op",
    "PreparedTxn",
    "Put",
    "StoreClosed",
    "TxnResult",
    "WatchEvent",
]


def __getattr__(name: str) -> Any:
    # The etcd backend is imported on first use: it loads grpc and etcd3 and pins protobuf to
    # its pure-Python implementation for the whole process (see danube.metadata.etcd), which
    # standalone brokers and the simulator should not pay for by importing this package.
    if name in ("EtcdStore", "EtcdUnavailable"):
        from danube.metadata import etcd

        return getattr(etcd, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
