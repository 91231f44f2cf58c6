"""Errors that cross the broker's API boundary.

State machines raise `DanubeError` before mutating anything, so a rejected request never leaves
half-applied state behind; the gRPC layer turns the code into a status of the same name.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """The gRPC status codes the data plane uses (names match grpc/grpclib `Status`)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNAVAILABLE = "UNAVAILABLE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"


class DanubeError(Exception):
    """A request the broker refuses, with a message a person can act on."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"DanubeError({self.code.name}, {self.message!r})"


def invalid(message: str) -> DanubeError:
    return DanubeError(ErrorCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> DanubeError:
    return DanubeError(ErrorCode.NOT_FOUND, message)
