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


QUOTE_LIMIT = 64
"""Characters of a client's string an error message may quote. Status messages travel in
HTTP/2 trailers, which grpclib HPACK-encodes in pure Python on the event loop, in time that
grows faster than their length: a message that echoed a 400 KB name stalled every client for
25 s (issue 20). A person needs only the start of the value and its length."""


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr` of a client-supplied value for an error message, cut to `limit` characters with
    its full length said, so a message stays short whatever the client sent."""
    if isinstance(value, str | bytes) and len(value) > limit:
        kind = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}… ({len(value)} {kind})"
    text = repr(value)
    if len(text) > limit + 2:
        return f"{text[: limit + 2]}… ({len(text)} characters as text)"
    return text


class ConfigError(ValueError):
    """A configuration value a person must fix; the message names the key."""
