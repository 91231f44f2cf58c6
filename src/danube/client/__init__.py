"""Python client for Danube brokers (asyncio, grpclib).

The names below load on first use (PEP 562): a tool that imports one submodule, as
`danube-admin` imports `danube.client.connection`, does not pay for the producer, the consumer
and their wire types (issue 26: `--help` of each tool under 0.3 s).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from danube.client.batching import Batching
    from danube.client.client import DanubeClient
    from danube.client.connection import RetryPolicy
    from danube.client.consumer import Consumer, Message, SubType
    from danube.client.errors import DanubeClientError
    from danube.client.producer import Producer, Receipt
    from danube.client.schemas import SchemaRef, WriterSchema
    from danube.client.security import ClientSecurity
    from danube.values.config import DispatchStrategy

_WHERE = {
    "Batching": "danube.client.batching",
    "ClientSecurity": "danube.client.security",
    "Consumer": "danube.client.consumer",
    "DanubeClient": "danube.client.client",
    "DanubeClientError": "danube.client.errors",
    "DispatchStrategy": "danube.values.config",
    "Message": "danube.client.consumer",
    "Producer": "danube.client.producer",
    "Receipt": "danube.client.producer",
    "RetryPolicy": "danube.client.connection",
    "SchemaRef": "danube.client.schemas",
    "SubType": "danube.client.consumer",
    "WriterSchema": "danube.client.schemas",
}

__all__ = [
    "Batching",
    "ClientSecurity",
    "Consumer",
    "DanubeClient",
    "DanubeClientError",
    "DispatchStrategy",
    "Message",
    "Producer",
    "Receipt",
    "RetryPolicy",
    "SchemaRef",
    "SubType",
    "WriterSchema",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
