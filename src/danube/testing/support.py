"""Small helpers every test of a Danube broker needs: a core built with defaults, a fake
clock, waiting for a condition, free ports."""

from __future__ import annotations

import random
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from danube.machines.dispatch import QueueLimits
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.values.config import Policies

URL = "http://127.0.0.1:6650"


def make_core(
    *,
    url: str = URL,
    seed: int = 1,
    policies: Policies | None = None,
    limits: QueueLimits | None = None,
    namespaces: tuple[str, ...] | None = None,
    **options: Any,
) -> BrokerCore:
    """A `BrokerCore` with deterministic randomness and default policies; `namespaces`
    are bootstrapped (their metadata effects are dropped: run them through a `CoreDriver`
    when they matter). Other keyword arguments go to `BrokerCore`."""
    core = BrokerCore(
        BrokerIdentity(url, url),
        rng=random.Random(seed),
        default_policies=policies or Policies(),
        queue_limits=limits or QueueLimits(),
        **options,
    )
    if namespaces:
        core.bootstrap(list(namespaces))
    return core


@dataclass
class FakeClock:
    """Milliseconds that move only when told."""

    now: int = 1_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


async def wait_until(
    check: Callable[[], Awaitable[bool] | bool], timeout: float = 15.0, poll: float = 0.01
) -> None:
    """Polls `check` (sync or async) under trio until it holds; fails after `timeout` s."""
    import trio

    with trio.fail_after(timeout):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await trio.sleep(poll)


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 (it may be taken before the caller binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports (held open together while chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
