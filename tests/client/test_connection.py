"""The client's channel: a connection that dies while it is being set up is a connection
error (retried like any other), not grpclib's AttributeError on the deleted transport."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from danube.client.connection import BrokerChannel
from danube.client.errors import TRANSPORT_ERRORS


def _protocol(lost: bool) -> Any:
    return SimpleNamespace(
        handler=SimpleNamespace(connection_lost=lost), processor=SimpleNamespace(close=lambda: None)
    )


def test_a_connection_lost_during_setup_raises_a_transport_error_and_is_replaced() -> None:
    async def scenario() -> None:
        channel = BrokerChannel("127.0.0.1", 1)
        made = iter([_protocol(lost=True), _protocol(lost=False)])

        async def create_connection() -> Any:
            return next(made)

        channel._create_connection = create_connection  # type: ignore[method-assign]
        with pytest.raises(TRANSPORT_ERRORS):
            await channel.__connect__()
        healthy = await channel.__connect__()
        assert healthy.handler.connection_lost is False
        channel.close()

    asyncio.run(scenario())


def test_a_broker_that_answers_with_an_error_goes_first_next_time() -> None:
    """Found in review: only a successful answer moved a service URL to the front, so after
    the first broker died and the second answered NOT_FOUND (a topic not created yet), the
    lookup fell back to the dead first URL."""
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError

    from danube.client.connection import Connections, RetryPolicy

    async def scenario() -> None:
        connections = Connections("http://127.0.0.1:1,http://127.0.0.1:2", RetryPolicy())
        answers: list[Exception] = [OSError("refused"), GRPCError(Status.NOT_FOUND, "no topic")]

        async def call(_: object) -> None:
            raise answers.pop(0)

        with pytest.raises(GRPCError):
            await connections._discover("lookup", call)
        assert connections.service_url == "http://127.0.0.1:2"
        assert connections.reached
        connections.close()

    asyncio.run(scenario())


def test_a_refused_lookup_raises_the_clients_own_error() -> None:
    """Found in review: DanubeClient.lookup let grpclib's GRPCError through, unlike every
    other call of the client."""
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError

    from danube.client import DanubeClient
    from danube.client.errors import DanubeClientError

    async def scenario() -> None:
        client = DanubeClient("http://127.0.0.1:1")

        async def refuse(what: str, call: object) -> None:
            raise GRPCError(Status.UNAVAILABLE, "moving")

        client._connections._discover = refuse  # type: ignore[method-assign,assignment]
        with pytest.raises(DanubeClientError, match="lookup of /default/t: UNAVAILABLE"):
            await client.lookup("/default/t")
        client._connections.close()

    asyncio.run(scenario())


def test_registry_calls_retry_a_retryable_answer_but_never_a_deletion() -> None:
    """A broker whose store did not answer says UNAVAILABLE; registering again is safe (an
    identical schema returns its version), deleting again is not."""
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError

    from danube.client.connection import Connections, RetryPolicy
    from danube.client.errors import DanubeClientError
    from danube.client.schemas import SchemaRegistry

    async def scenario() -> tuple[int, int]:
        connections = Connections("http://127.0.0.1:1", RetryPolicy(base_backoff_s=0.001))
        calls = {"register": 0, "delete": 0}

        async def on_any_broker(what: str, _: object) -> str:
            kind = what.split()[0]
            calls[kind] += 1
            if calls[kind] < 3:
                raise GRPCError(Status.UNAVAILABLE, "metadata store: no answer")
            return "answered"

        connections.on_any_broker = on_any_broker  # type: ignore[assignment,method-assign]
        registry = SchemaRegistry(connections)
        assert await registry.register("s", "string", b"") == "answered"  # type: ignore[comparison-overlap]
        with pytest.raises(DanubeClientError, match="UNAVAILABLE"):
            await registry.delete_version("s", 1)
        connections.close()
        return calls["register"], calls["delete"]

    assert asyncio.run(scenario()) == (3, 1)
