"""Shared plumbing for the scenario scripts, which run under the OFFICIAL client's interpreter.

The scripts are started with `python -I`, so neither our package nor this directory is on
`sys.path`; each script puts this directory there itself before importing this module. Nothing
here may import our own `danube` package: under that interpreter `danube` is the official
client, and mixing the two is exactly what the separate virtualenv prevents. (ruff files
`danube` under first-party imports because of our package; in these scripts it is not.)

Protocol with the pytest side:
- stdout carries one JSON object per line. Interactive scenarios emit `{"event": ...}` lines
  as they go; every script ends with one `{"event": "result", ...}` line.
- stdin (interactive scenarios only) carries one command word per line.
- on failure a script prints a readable message (and what it had collected so far) to stderr
  and exits with status 1, so the test shows why instead of a bare timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from danube import DanubeClient, DanubeClientBuilder
from danube.proto import DanubeApi_pb2

Message = DanubeApi_pb2.StreamMessage


class ScenarioFailure(Exception):
    """A check inside a scenario failed; the message says what was expected and what came."""


class _CountingHandler(logging.Handler):
    """Counts the official client's log records instead of printing them.

    The client logs a warning for every failed receive-stream attempt and retries those
    without backoff, so while a broker is down it logs thousands of lines; printing them could
    fill the stderr pipe and stall the script. The counts go into the result instead, which
    also documents how the client behaved.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().replace("\n", " ")
        self.counts[f"{record.levelname} {record.name}: {text[:160]}"] += 1


_log_counter = _CountingHandler()
_client_logger = logging.getLogger("danube")
_client_logger.addHandler(_log_counter)
_client_logger.setLevel(logging.DEBUG)
_client_logger.propagate = False

report: dict[str, Any] = {}
"""What the running scenario has found so far; printed as the result, or on failure."""


def client_log() -> dict[str, int]:
    return dict(_log_counter.counts.most_common(20))


def emit(event: str, **fields: Any) -> None:
    """Writes one event line for the pytest side."""
    print(json.dumps({"event": event, "time": time.time(), **fields}), flush=True)


def describe(message: Message) -> dict[str, Any]:
    """The parts of a delivered message the tests assert on, JSON-safe (payload as hex)."""
    return {
        "payload": message.payload.hex(),
        "attributes": dict(message.attributes),
        "topic": message.msg_id.topic_name,
        "producer_id": message.msg_id.producer_id,
        "topic_offset": message.msg_id.topic_offset,
        "request_id": message.request_id,
        "producer_name": message.producer_name,
        "routing_key": message.routing_key if message.HasField("routing_key") else None,
    }


async def receive_n(
    queue: asyncio.Queue[Message], count: int, timeout: float, what: str
) -> list[Message]:
    """Exactly `count` messages from the official consumer's queue, or a readable failure."""
    received: list[Message] = []
    try:
        async with asyncio.timeout(timeout):
            while len(received) < count:
                received.append(await queue.get())
    except TimeoutError:
        raise ScenarioFailure(
            f"{what}: received {len(received)} of {count} messages within {timeout} s; "
            f"last payloads {[m.payload[:16] for m in received[-3:]]}"
        ) from None
    return received


async def receive_for(queue: asyncio.Queue[Message], seconds: float) -> list[Message]:
    """Everything that arrives within `seconds` (to show that nothing more comes)."""
    received: list[Message] = []
    try:
        async with asyncio.timeout(seconds):
            while True:
                received.append(await queue.get())
    except TimeoutError:
        return received


class Commands:
    """Command words from stdin, read by a daemon thread so a blocked read never keeps the
    interpreter alive and never blocks the event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line.strip())
        self._loop.call_soon_threadsafe(self._queue.put_nowait, "<eof>")

    async def expect(self, word: str, timeout: float) -> None:
        try:
            got = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise ScenarioFailure(f"no {word!r} command from the test within {timeout} s") from None
        if got != word:
            raise ScenarioFailure(f"expected command {word!r} from the test, got {got!r}")


def main(scenario: Callable[[list[str]], Awaitable[None]], timeout: float) -> None:
    """Runs `scenario(argv)` with an overall deadline and prints `report` as the result.

    Exits 1 with a readable message on any failure, 2 on a usage error."""

    async def bounded() -> None:
        await asyncio.wait_for(scenario(sys.argv[1:]), timeout)

    try:
        asyncio.run(bounded())
    except ScenarioFailure as failure:
        _fail(f"scenario check failed: {failure}")
    except TimeoutError:
        _fail(f"scenario did not finish within {timeout} s\n{traceback.format_exc()}")
    except Exception:
        _fail(f"scenario raised an exception:\n{traceback.format_exc()}")
    report["client_log"] = client_log()
    emit("result", **report)
    sys.exit(0)


def _fail(message: str) -> None:
    report["client_log"] = client_log()
    print(message, file=sys.stderr)
    print("collected so far: " + json.dumps(report, default=repr)[:4000], file=sys.stderr)
    sys.stderr.flush()
    sys.exit(1)


async def build_client(url: str) -> DanubeClient:
    """A plain official client (no TLS, no token), as an application would build it."""
    return await DanubeClientBuilder().service_url(url).build()
