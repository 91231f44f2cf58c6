"""One connection to a broker's admin port, and the three ways a call can fail, each with
its own exit status so scripts can tell a refusal from a broker that is not there."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.protocol import H2Protocol

from danube.client.connection import BrokerChannel, parse_address
from danube.client.errors import TRANSPORT_ERRORS, DanubeClientError
from danube.client.security import ClientSecurity
from danube.proto import danube_admin as admin_pb
from danube.proto import danube_ext as ext_pb
from danube.proto import danube_schema as schema_pb

T = TypeVar("T")

DEFAULT_ENDPOINT = "http://127.0.0.1:50051"
ENDPOINT_ENV = "DANUBE_ADMIN_ENDPOINT"

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

LONG_CALL_MARGIN_S = 10.0


class AdminError(Exception):
    """A one-line message for stderr and the exit status that goes with it."""

    exit_code = EXIT_REFUSED


def require_success(what: str, success: bool, message: str = "") -> None:
    """Danube's mutating replies carry `success`: false is a refusal without a status."""
    if not success:
        raise AdminError(f"{what}: {message or 'the broker reported failure'}")


class Refused(AdminError):
    """The broker answered with an error status."""

    def __init__(self, what: str, status: Status, message: str) -> None:
        super().__init__(f"{what}: {status.name}: {message}")
        self.status = status


class Unreachable(AdminError):
    exit_code = EXIT_UNREACHABLE


class BadUsage(AdminError):
    """Input argparse cannot check (a topic name, an endpoint, a missing --confirm)."""

    exit_code = EXIT_USAGE


class _AdminChannel(BrokerChannel):
    """Remembers whether the broker was ever reached, so a deadline can tell a broker that
    is not there from one that is slow to finish."""

    reached = False

    async def __connect__(self) -> H2Protocol:
        protocol = await super().__connect__()
        self.reached = True
        return protocol


class AdminClient:
    """The admin services of one broker: Danube's (`danube_admin`), the schema registry
    (served on the admin port too) and our policy extension."""

    def __init__(
        self, endpoint: str, timeout_s: float, security: ClientSecurity | None = None
    ) -> None:
        try:
            host, port = parse_address(endpoint)
        except DanubeClientError as error:
            raise BadUsage(str(error)) from None
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.security = security
        """The TLS settings and token the admin port is called with (the metrics pages of a
        secured broker are served over TLS with the same CA)."""
        try:
            self._channel = _AdminChannel(host, port, security)
        except (OSError, ValueError) as error:  # an unreadable CA or client certificate
            raise BadUsage(f"TLS settings: {error}") from None
        self.brokers = admin_pb.BrokerAdminStub(self._channel, timeout=timeout_s)
        self.cluster = admin_pb.ClusterAdminStub(self._channel, timeout=timeout_s)
        self.namespaces = admin_pb.NamespaceAdminStub(self._channel, timeout=timeout_s)
        self.topics = admin_pb.TopicAdminStub(self._channel, timeout=timeout_s)
        self.schemas = schema_pb.SchemaRegistryStub(self._channel, timeout=timeout_s)

    @property
    def policies(self) -> ext_pb.PolicyAdminStub:
        return ext_pb.PolicyAdminStub(self._channel, timeout=self.timeout_s)

    @property
    def replication(self) -> ext_pb.ReplicationAdminStub:
        return ext_pb.ReplicationAdminStub(self._channel, timeout=self.timeout_s)

    def long_call(self, server_wait_s: float) -> float:
        """The deadline of a call the broker may work on for `server_wait_s` seconds before
        it answers (a drain, a topic's move): long enough to hear that answer."""
        return max(self.timeout_s, server_wait_s + LONG_CALL_MARGIN_S)

    async def call(self, what: str, request: Awaitable[T], *, timeout_s: float | None = None) -> T:
        """Awaits one RPC; `what` names it in the error ("create namespace orders").
        `timeout_s`: the deadline the request was made with, when not `--timeout`'s."""
        deadline = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await request
        except GRPCError as error:
            raise Refused(what, error.status, error.message or "(no message)") from None
        except (ValueError, TypeError) as error:
            raise AdminError(
                f"{what}: the broker's answer could not be decoded ({error})"
            ) from None
        except TimeoutError:
            if self._channel.reached:
                raise AdminError(
                    f"{what}: {self.endpoint} did not finish within {deadline:g} s; it may "
                    "still be under way (check, or raise --timeout)"
                ) from None
            raise Unreachable(
                f"{what}: no answer from {self.endpoint} within {deadline:g} s "
                "(raise --timeout, or check the broker)"
            ) from None
        except TRANSPORT_ERRORS as error:
            raise Unreachable(
                f"{what}: cannot reach the admin port at {self.endpoint} ({error}); "
                f"pass --endpoint or set {ENDPOINT_ENV} (a broker with TLS needs --tls or "
                "DANUBE_ADMIN_TLS)"
            ) from None

    def close(self) -> None:
        self._channel.close()
