"""Planted bugs in the schema registry and publish check that the schema run must catch.
Each patches the real code for the length of a `with` block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from danube.machines.requests.binding_cache import BindingCache
from danube.machines.schema import policy, records, registry
from danube.values.errors import invalid


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


@contextlib.contextmanager
def binding_cache_never_expires() -> Iterator[None]:
    """The gate's binding cache trusts a binding once read for ever: an operator's change
    made through another broker never reaches this one's publishes."""

    def fresh(self: BindingCache[Any], topic: str) -> tuple[bool, Any]:
        cached = self._entries.get(topic)
        return (True, cached[1]) if cached is not None else (False, None)

    with mock.patch.object(BindingCache, "fresh", fresh):
        yield


GATE_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "binding_cache_never_expires": binding_cache_never_expires,
}
"""Bugs of the publish gate's shared flow (`danube.machines.requests.schema_gate`), each caught
within 50 seeds by the invariant named."""

SCHEMA_MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "compatibility_unchecked": compatibility_unchecked,
    "commit_without_compare": commit_without_compare,
    "payloads_never_checked": payloads_never_checked,
    "registrations_refused": registrations_refused,
}
