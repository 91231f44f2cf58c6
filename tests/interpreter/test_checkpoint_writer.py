"""The interpreter's checkpoint writer (`Interpreter._checkpoints`): at most one mark per
`checkpoint_interval_ms`, the pause taken before a mark that comes too soon and never after a
mark with nothing left to mark (an idle topic's writer used to wake up for nothing after each
mark: an event per message in the cluster simulator, issue 22 round 7)."""

from __future__ import annotations

from danube.interpreter.interpreter import CHECKPOINT_INTERVAL_MS
from danube.machines.wal.machine import Durability, WalConfig
from tests.node.test_core_reliable import TOPIC, Broker


def test_the_writer_pauses_only_before_a_mark_that_comes_too_soon() -> None:
    broker = Broker(WalConfig(durability=Durability.FSYNC))
    port = broker.driver.port
    producer = broker.producer()
    broker.driver.now_ms = 1_000

    broker.publish(producer, "a")  # the first mark goes at once, and nothing is left
    first = port.checkpoints[TOPIC]
    assert first > 0 and port.sleeps == 0

    broker.publish(producer, "b")  # at the same instant: within the interval
    assert port.checkpoints[TOPIC] > first and port.sleeps == 1
    second = port.checkpoints[TOPIC]

    broker.driver.now_ms += CHECKPOINT_INTERVAL_MS  # the interval has passed: no pause
    broker.publish(producer, "c")
    assert port.checkpoints[TOPIC] > second and port.sleeps == 0
