"""Broker metadata (namespaces, topics, producers, subscriptions, assignments) as JSON values
under slash-separated keys, behind one etcd-shaped interface with in-memory, embedded durable
and (later) etcd backends."""

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

__all__ = [
    "CompactedError",
    "Compare",
    "Delete",
    "DeletePrefix",
    "EmbeddedStore",
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
