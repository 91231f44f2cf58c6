"""`runtime.replication_port`: how replicas values and this broker's assignments seen on
`/cluster/` reach the core, and the port's effects. The core and interpreter are stand-ins
that record the calls; the decisions behind them are the machines' (`BrokerCore.
replica_set_seen`, `replica_follower.still_follows`, tests/node/test_replication_pair.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from danube import keys
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node.core import ReplicaAnswer, ReplicaSend, Step
from danube.machines.node.replica_follower import still_follows
from danube.machines.node.replica_owner import replica_config
from danube.machines.replication import messages as rm
from danube.metadata import WatchEvent
from danube.runtime.replication_port import ReplicationPort

ME = "111"
TOPIC = "/default/t"


class _Followers:
    def __init__(self) -> None:
        self.replicas: dict[str, object] = {}

    def serves(self, topic: str) -> bool:
        return topic in self.replicas


class _Core:
    """Records what the port hands it; `replica_set_seen` routes as `BrokerCore`'s does,
    with the machine's own decision (`still_follows`) on what these stand-ins hold."""

    publish_pool = None

    def __init__(self) -> None:
        self.owned: set[str] = set()
        self.followers = _Followers()
        self.released: list[str] = []
        self.changed: list[tuple[str, Any]] = []
        self.seen: list[tuple[str, ReplicaSet | None, int, bool]] = []

    def serves(self, topic: str) -> bool:
        return topic in self.owned

    def replica_set_seen(
        self, topic: str, record: ReplicaSet | None, version: int, *,
        assigned_here: bool, now_ms: int,
    ) -> Step[None]:  # fmt: skip
        self.seen.append((topic, record, version, assigned_here))
        if self.serves(topic):
            if record is not None:
                self.changed.append((topic, replica_config(record, version)))
        elif self.followers.serves(topic) and not still_follows(ME, record, assigned_here):
            self.released.append(topic)
        return Step(None)


class _Replication:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return lambda *args: self.calls.append((name, args))


class _Host:
    def now_ms(self) -> int:
        return 0


class _Interpreter:
    def __init__(self) -> None:
        self.replication = _Replication()
        self.host = _Host()


class _Runtime:
    def __init__(self) -> None:
        self.core = _Core()
        self.interpreter = _Interpreter()
        self.claims: dict[str, int] = {}

    def apply(self, effects: Any) -> int:
        return 0


class _Loop:
    """Runs what is posted at once (the port posts watch events to the asyncio loop)."""

    def call_soon_threadsafe(self, call: Callable[[], None]) -> None:
        call()


def _port() -> tuple[ReplicationPort, _Runtime]:
    runtime = _Runtime()
    port = ReplicationPort(runtime, ME, store=None, loop=_Loop())  # type: ignore[arg-type]
    return port, runtime


def _put(record: ReplicaSet, revision: int = 7) -> WatchEvent:
    return WatchEvent("put", keys.replicas_key(TOPIC), record.to_json(), revision, None)


@pytest.mark.parametrize(
    ("record", "released"),
    [
        (ReplicaSet(5, "222", ("333",), ("333",)), True),  # named nowhere: released
        (ReplicaSet(5, "222", (ME,), ()), False),  # a follower (catching up)
        (ReplicaSet(5, "222", ("333",), (ME,)), False),  # replaced, still a candidate
        (ReplicaSet(9, ME, ("333",), ()), False),  # this broker just claimed it
    ],
)
def test_a_follower_copy_is_released_only_when_the_value_names_this_broker_nowhere(
    record: ReplicaSet, released: bool
) -> None:
    port, runtime = _port()
    runtime.core.followers.replicas[TOPIC] = object()
    port.observe(_put(record))
    assert runtime.core.released == ([TOPIC] if released else [])
    assert runtime.interpreter.replication.calls == []


def test_a_deleted_value_releases_the_copy() -> None:
    port, runtime = _port()
    runtime.core.followers.replicas[TOPIC] = object()
    port.observe(WatchEvent("delete", keys.replicas_key(TOPIC), None, 8, None))
    assert runtime.core.released == [TOPIC]


def test_the_owner_hears_every_value_with_its_revision() -> None:
    port, runtime = _port()
    runtime.core.owned.add(TOPIC)
    port.observe(_put(ReplicaSet(9, ME, ("333",), ("333",)), revision=12))
    [(topic, config)] = runtime.core.changed
    assert topic == TOPIC
    assert (config.epoch, config.followers, config.in_sync, config.version) == (
        9,
        ("333",),
        ("333",),
        12,
    )
    assert runtime.core.released == []


def test_an_assignment_here_keeps_the_copy_the_claim_is_about_to_load() -> None:
    """The leader dropped this broker from `followers` as it assigned it the topic: the
    copy is its log once the claim lands (the watch may show the one before the other)."""
    port, runtime = _port()
    runtime.core.followers.replicas[TOPIC] = object()
    port.observe(WatchEvent("put", keys.assignment_key(ME, TOPIC), None, 6, None))
    port.observe(_put(ReplicaSet(5, "222", ("333",), ())))
    assert runtime.core.released == []
    assert runtime.core.seen[-1][3] is True
    port.observe(WatchEvent("delete", keys.assignment_key(ME, TOPIC), None, 8, None))
    port.observe(_put(ReplicaSet(5, "222", ("333",), ()), revision=9))
    assert runtime.core.released == [TOPIC]


def test_registrations_give_the_addresses_and_a_snapshot_replaces_them() -> None:
    port, _ = _port()
    register = {"admin_addr": "http://127.0.0.1:5001"}
    port.observe(WatchEvent("put", keys.register_key("333"), register, 3, None))
    assert port.addresses == {"333": "http://127.0.0.1:5001"}
    port.observe(WatchEvent("delete", keys.register_key("333"), None, 4, register))
    assert port.addresses == {}


def test_answers_go_to_the_outbox_of_the_owners_stream_and_sends_to_the_links() -> None:
    async def run() -> None:
        port, runtime = _port()
        port._loop = asyncio.get_running_loop()
        sent: list[tuple[str, Any]] = []
        port.links.send = lambda follower, message: sent.append((follower, message)) or True  # type: ignore[method-assign]
        done: list[tuple[Any, Any]] = []
        answer = rm.Replicated(TOPIC, 5, 10)
        # no stream from that owner: dropped, answered
        port.perform(ReplicaAnswer("222", answer), lambda v, e: done.append((v, e)))

        class _Outbox:
            def __init__(self) -> None:
                self.put_answers: list[Any] = []

            def put(self, value: Any) -> bool:
                self.put_answers.append(value)
                return True

        outbox = _Outbox()
        message = rm.Replicate(TOPIC, 5, 0, b"", 0, 0)
        await port.replicate("222", message, outbox)  # type: ignore[arg-type]
        assert runtime.interpreter.replication.calls == [("received", ("222", message))]
        port.perform(ReplicaAnswer("222", answer), lambda v, e: done.append((v, e)))
        assert outbox.put_answers == [answer]
        port.stream_closed("222", outbox)  # type: ignore[arg-type]
        port.perform(ReplicaAnswer("222", answer), lambda v, e: done.append((v, e)))
        assert outbox.put_answers == [answer]
        port.perform(ReplicaSend("333", message), lambda v, e: done.append((v, e)))
        assert sent == [("333", message)]
        assert done == [(None, None)] * 4

    asyncio.run(run())
