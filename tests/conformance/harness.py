"""Pytest side of the conformance suite: runs scenario scripts under the OFFICIAL client's
interpreter and talks to our broker's admin port.

The official `danube-client` also imports as `danube`, so it lives in its own virtualenv and
its scenarios run as separate processes (`python -I`, so our PYTHONPATH cannot leak in). A
missing interpreter is a failure, never a skip: a silently skipped conformance suite would
report "compatible" without having checked anything.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpclib.client
import pytest

from danube.localcluster.broker_process import BrokerProcess
from danube.proto.danube_admin import (
    DispatchStrategy,
    NewTopicRequest,
    SetSubscriptionFailurePolicyRequest,
    SubscriptionFailurePolicy,
    TopicAdminStub,
    TopicRequest,
)
from tests.support.aio import run

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
OFFICIAL_CLIENT_VERSION = "0.5.0"
BOOTSTRAP_HINT = "run scripts/bootstrap.sh (it creates .venv-official with danube-client==0.5.0)"


@functools.cache
def _checked_official_python(path: str) -> str:
    probe = subprocess.run(
        [path, "-I", "-c", "import importlib.metadata as m; print(m.version('danube-client'))"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    version = probe.stdout.strip()
    if probe.returncode != 0 or version != OFFICIAL_CLIENT_VERSION:
        pytest.fail(
            f"{path} does not have danube-client=={OFFICIAL_CLIENT_VERSION} "
            f"(found {version or 'none'}: {probe.stderr.strip()[-300:]}); {BOOTSTRAP_HINT}",
            pytrace=False,
        )
    return path


def official_python() -> str:
    """The official client's interpreter: $DANUBE_OFFICIAL_PYTHON, else .venv-official."""
    configured = os.environ.get("DANUBE_OFFICIAL_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-official" / "bin" / "python"
    if not path.exists():
        pytest.fail(
            f"the official Danube client's python was not found at {path} "
            f"(set DANUBE_OFFICIAL_PYTHON or {BOOTSTRAP_HINT})",
            pytrace=False,
        )
    return _checked_official_python(str(path))


def _command(scenario: str, args: tuple[object, ...]) -> list[str]:
    return [official_python(), "-I", str(SCENARIOS / f"{scenario}.py"), *map(str, args)]


def broker_tail(broker: BrokerProcess | None, lines: int = 40) -> str:
    if broker is None:
        return ""
    return "\n--- broker log (tail) ---\n" + "\n".join(broker.log_lines[-lines:])


def _result_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "result":
            return event
    return None


def run_scenario(
    scenario: str, *args: object, timeout: float = 40.0, broker: BrokerProcess | None = None
) -> dict[str, Any]:
    """Runs a scenario script to completion and returns its result object."""
    try:
        completed = subprocess.run(
            _command(scenario, args), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"scenario {scenario} did not finish within {timeout} s\n"
            f"stderr: {expired.stderr!r}{broker_tail(broker)}",
            pytrace=False,
        )
    result = _result_line(completed.stdout)
    if completed.returncode != 0 or result is None:
        pytest.fail(
            f"scenario {scenario} failed (exit {completed.returncode}):\n"
            f"{completed.stderr[-4000:]}\nstdout tail: {completed.stdout[-1000:]}"
            f"{broker_tail(broker)}",
            pytrace=False,
        )
    return result


class ScenarioProcess:
    """An interactive scenario: JSON events on its stdout, command words on its stdin.

    Output is drained by threads so a chatty script can never block on a full pipe."""

    def __init__(self, scenario: str, *args: object, broker: BrokerProcess | None = None) -> None:
        self.scenario = scenario
        self.broker = broker
        self.events: list[dict[str, Any]] = []
        self.stderr_lines: list[str] = []
        self._pending: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.process = subprocess.Popen(
            _command(scenario, args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "raw", "line": line.rstrip("\n")}
            self._pending.put(event)
        self._pending.put(None)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def _fail(self, why: str) -> None:
        self.kill()
        pytest.fail(
            f"scenario {self.scenario}: {why}\nevents: {json.dumps(self.events)[-2000:]}\n"
            f"stderr:\n" + "\n".join(self.stderr_lines[-60:]) + broker_tail(self.broker),
            pytrace=False,
        )

    def wait_event(self, name: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next event called `name` (earlier other events are kept in `events`)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                event = self._pending.get(timeout=max(remaining, 0.0))
            except queue.Empty:
                self._fail(f"no {name!r} event within {timeout} s")
            if event is None:
                self.process.wait(5)
                time.sleep(0.1)  # let the stderr reader catch up
                self._fail(f"exited with {self.process.returncode} before a {name!r} event")
            self.events.append(event)
            if event.get("event") == name:
                return event

    def drain(self, name: str) -> list[dict[str, Any]]:
        """Every `name` event that arrived so far, without waiting."""
        while True:
            try:
                event = self._pending.get_nowait()
            except queue.Empty:
                break
            if event is None:
                self._pending.put(None)
                break
            self.events.append(event)
        return [e for e in self.events if e.get("event") == name]

    def send(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def result(self, timeout: float = 30.0) -> dict[str, Any]:
        """Waits for the final result and a clean exit."""
        result = self.wait_event("result", timeout)
        try:
            code = self.process.wait(10)
        except subprocess.TimeoutExpired:
            self._fail("printed its result but did not exit")
        if code != 0:
            self._fail(f"exited with {code} after its result")
        return result

    def kill(self) -> None:
        """SIGKILL: the client gets no chance to say goodbye, like a crashed application."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def __enter__(self) -> ScenarioProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.kill()


async def _with_topic_admin(
    broker: BrokerProcess, call: Callable[[TopicAdminStub], Awaitable[T]]
) -> T:
    host, port = broker.admin_addr.rsplit(":", 1)
    channel = grpclib.client.Channel(host, int(port))
    try:
        return await call(TopicAdminStub(channel))
    finally:
        channel.close()


def admin_create_topic(broker: BrokerProcess, topic: str) -> None:
    """CreateTopic (non-reliable) through our admin port, so consumers can subscribe before
    anything is produced."""
    run(lambda: _with_topic_admin(broker, lambda s: s.create_topic(NewTopicRequest(name=topic))))


def admin_create_reliable_topic(broker: BrokerProcess, topic: str) -> None:
    request = NewTopicRequest(name=topic, dispatch_strategy=DispatchStrategy.Reliable)
    run(lambda: _with_topic_admin(broker, lambda s: s.create_topic(request)))


def admin_set_failure_policy(
    broker: BrokerProcess, topic: str, subscription: str, policy: SubscriptionFailurePolicy
) -> None:
    """SetSubscriptionFailurePolicy through our admin port (Danube's RPC)."""
    request = SetSubscriptionFailurePolicyRequest(topic, subscription, policy)
    run(lambda: _with_topic_admin(broker, lambda s: s.set_subscription_failure_policy(request)))


def admin_delete_topic(broker: BrokerProcess, topic: str) -> None:
    run(lambda: _with_topic_admin(broker, lambda s: s.delete_topic(TopicRequest(name=topic))))
