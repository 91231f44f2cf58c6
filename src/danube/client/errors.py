"""Client-side errors."""

from __future__ import annotations

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.exceptions import ProtocolError, StreamTerminatedError

RETRYABLE = frozenset({Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.DEADLINE_EXCEEDED})
"""Statuses that mean "try again, maybe elsewhere" (the official clients use the same set)."""


TRANSPORT_ERRORS = (OSError, StreamTerminatedError, ProtocolError)
"""Failures below gRPC: the broker went away or the connection broke."""


class DanubeClientError(Exception):
    """A request the broker refused, or a broker the client could not reach."""

    def __init__(self, message: str, status: Status | None = None) -> None:
        super().__init__(message)
        self.status = status

    @classmethod
    def from_grpc(cls, what: str, error: GRPCError) -> DanubeClientError:
        return cls(f"{what}: {error.status.name}: {error.message}", error.status)
