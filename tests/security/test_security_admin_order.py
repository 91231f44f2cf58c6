"""SecurityAdmin applies the re-read after each write in the order the re-reads started: a
slow re-read of the state before a revocation, answered after a later one, is dropped (review
finding: it could put the revoked binding back in force until the next write)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from danube.runtime import security_admin


class SlowStore:
    """`scan` answers each call when the test says, with the state it was given."""

    def __init__(self) -> None:
        self.pending: list[tuple[asyncio.Event, str]] = []

    async def scan(self, _prefix: str) -> list[Any]:
        gate = asyncio.Event()
        state = f"state-{len(self.pending)}"
        self.pending.append((gate, state))
        await gate.wait()
        return [SimpleNamespace(key="/auth/x", value=state)]


def test_an_older_re_read_answered_late_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    async def direct(call: Any, *args: Any) -> Any:
        return await call(*args)

    monkeypatch.setattr(security_admin, "store_call_from_grpc", direct)
    monkeypatch.setattr(security_admin.records, "rbac_from", lambda entries, _: entries)
    applied: list[Any] = []
    store = SlowStore()
    service = security_admin.SecurityAdminService(store, None, applied.append)  # type: ignore[arg-type]

    async def run() -> None:
        first = asyncio.create_task(service._changed())  # before a revocation
        await asyncio.sleep(0)
        second = asyncio.create_task(service._changed())  # after it
        await asyncio.sleep(0)
        store.pending[1][0].set()
        await second
        store.pending[0][0].set()
        await first

    asyncio.run(run())
    assert applied == [{"/auth/x": "state-1"}]
