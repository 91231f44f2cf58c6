"""Python client for Danube brokers (asyncio, grpclib)."""

from danube.client.batching import Batching
from danube.client.client import DanubeClient
from danube.client.connection import RetryPolicy
from danube.client.consumer import Consumer, Message, SubType
from danube.client.errors import DanubeClientError
from danube.client.producer import Producer, Receipt
from danube.client.schemas import SchemaRef, WriterSchema
from danube.client.security import ClientSecurity
from danube.values.config import DispatchStrategy

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
