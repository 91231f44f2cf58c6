"""The etcd backend of `MetadataStore` (danube.metadata.etcd.store), with its asyncio loop
(.loop) and watch streams (.watch) in modules of their own."""

from __future__ import annotations

from danube.metadata.etcd.store import EtcdStore, EtcdUnavailable

__all__ = ["EtcdStore", "EtcdUnavailable"]
