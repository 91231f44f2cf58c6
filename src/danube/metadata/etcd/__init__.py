"""The etcd backend of `MetadataStore`: the store (.store), the asyncio loop it runs grpclib on
(.loop), its watch streams (.watch) and the hand codec of its KV and Watch messages (.wire)."""

from __future__ import annotations

from danube.metadata.etcd import wire
from danube.metadata.etcd.store import EtcdStore, EtcdUnavailable

__all__ = ["EtcdStore", "EtcdUnavailable", "wire"]
