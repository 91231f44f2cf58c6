"""Broker metadata (namespaces, topics, producers, subscriptions, assignments) as JSON values
under slash-separated keys, behind one etcd-shaped interface with in-memory, embedded durable
and etcd backends."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    from danube.metadata.embedded import EmbeddedStore
    from danube.metadata.etcd import EtcdStore, EtcdUnavailable
    from danube.metadata.memory import MemoryStore

_LAZY = {
    "EmbeddedStore": "danube.metadata.embedded",
    "EtcdStore": "danube.metadata.etcd",
    "EtcdUnavailable": "danube.metadata.etcd",
    "MemoryStore": "danube.metadata.memory",
}
"""The backends, imported on first use (PEP 562), so that the pure modules importing the
values (`danube.metadata.model`, `danube.metadata.state`) load no trio: importing any module
of a package runs the package's `__init__` first. The etcd backend also loads grpclib,
trio-asyncio and its generated etcd types (danube.metadata.etcd), which standalone brokers and
the simulator need not pay for. tests/core/test_purity.py reads this table to follow these
imports."""

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
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
