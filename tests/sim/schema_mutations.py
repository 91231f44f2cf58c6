"""Planted bugs in the schema registry and publish check that the schema run must catch.
Each patches the real code for the length of a `with` block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from danube.core.errors import invalid
from danube.schema import policy, records, registry


@contextlib.contextmanager
def compatibility_unchecked() -> Iterator[None]:
    """Every schema joins its subject whatever the mode (Danube never compares Protobuf)."""
    with mock.patch.object(registry, "check", lambda *_args, **_kwargs: []):
        yield


@contextlib.contextmanager
def commit_without_compare() -> Iterator[None]:
    """A registration is written without checking the subject did not change since it was
    read, so two brokers can both give out one version number."""
    original = records.commit

    def commit(*args: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
        _, ops = original(*args, **kwargs)
        return [], ops

    with mock.patch.object(records, "commit", commit):
        yield


@contextlib.contextmanager
def payloads_never_checked() -> Iterator[None]:
    """Payload validation is switched on for a topic and never done."""
    with mock.patch.object(policy, "checks_payload", lambda *_args: False):
        yield


@contextlib.contextmanager
def registrations_refused() -> Iterator[None]:
    """Every registration is refused as invalid: a run that only counted what happened
    would report an empty run as a clean one."""

    def register(*_args: Any, **_kwargs: Any) -> Any:
        raise invalid("refused")

    with mock.patch.object(registry, "register", register):
        yield


SCHEMA_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "compatibility_unchecked": compatibility_unchecked,
    "commit_without_compare": commit_without_compare,
    "payloads_never_checked": payloads_never_checked,
    "registrations_refused": registrations_refused,
}
