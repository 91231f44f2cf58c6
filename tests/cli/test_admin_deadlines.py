"""`danube-admin`'s checks before and after a call: a drain with no time to move is a usage
error, long operations get a deadline that covers the broker's own wait, and a deadline on a
broker that was reached is not reported as unreachable (exit 1, not 3)."""

from __future__ import annotations

import asyncio

import grpclib.const
import pytest

from danube.cli.admin import main
from danube.cli.admin_call import EXIT_REFUSED, EXIT_USAGE, AdminClient, AdminError, Unreachable
from danube.cli.admin_topics import SERVER_MOVE_WAIT_S
from danube.proto import danube_admin as pb
from danube.runtime import cluster_admin
from danube.runtime.grpc_util import Server

NOWHERE = "http://127.0.0.1:1"


def test_a_broker_unload_without_time_to_move_is_refused() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--endpoint", NOWHERE, "brokers", "unload", "--broker-id", "1", "--timeout", "0"])
    assert caught.value.code == EXIT_USAGE


def test_long_calls_wait_beyond_the_brokers_own_wait() -> None:
    async def deadlines() -> tuple[float, float]:
        client = AdminClient(NOWHERE, 10)
        try:
            return client.long_call(60), client.long_call(SERVER_MOVE_WAIT_S)
        finally:
            client.close()

    unload, move = asyncio.run(deadlines())
    assert unload == 70
    assert move > cluster_admin.MOVE_WAIT_S
    assert SERVER_MOVE_WAIT_S == cluster_admin.MOVE_WAIT_S


class _Slow:
    """A BrokerAdmin whose UnloadBroker takes longer than the client waits."""

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        async def unload(stream: object) -> None:
            await asyncio.sleep(5)

        return {
            "/danube_admin.BrokerAdmin/UnloadBroker": grpclib.const.Handler(
                unload, grpclib.const.Cardinality.UNARY_UNARY,
                pb.UnloadBrokerRequest, pb.UnloadBrokerResponse,
            )
        }  # fmt: skip


def test_a_deadline_on_a_reached_broker_is_not_unreachable() -> None:
    async def run() -> AdminError:
        server = Server([_Slow()])
        await server.start("127.0.0.1", 0)
        assert server._server is not None
        port = server._server.sockets[0].getsockname()[1]
        client = AdminClient(f"http://127.0.0.1:{port}", 0.3)
        try:
            request = client.brokers.unload_broker(pb.UnloadBrokerRequest("1"))
            await client.call("unload broker 1", request)
        except AdminError as error:
            return error
        finally:
            client.close()
            server.close()
            await server.wait_closed()
        raise AssertionError("the call should have timed out")

    error = asyncio.run(run())
    assert not isinstance(error, Unreachable)
    assert error.exit_code == EXIT_REFUSED
    assert "may still be under way" in str(error)


def test_a_broker_never_reached_is_unreachable() -> None:
    async def run() -> AdminError:
        client = AdminClient(NOWHERE, 0.3)
        try:
            await client.call("list brokers", client.brokers.list_brokers(pb.Empty()))
        except AdminError as error:
            return error
        finally:
            client.close()
        raise AssertionError("the call should have failed")

    assert isinstance(asyncio.run(run()), Unreachable)
