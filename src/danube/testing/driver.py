"""`CoreDriver`: a `BrokerCore`, the interpreter and the instant memory port together, so a
test drives reliable and tiered topics through the flows production runs (load, append,
group commit, reads, uploads, index commits, drops) with every effect answered at once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from danube.effects import ObjectPut
from danube.interpreter import Interpreter
from danube.machines.node.core import (
    BrokerCore,
    DropWal,
    LoadWal,
    PublishAcked,
    PublishFailed,
    ReadObject,
    ReadWal,
    RepairWal,
    TierHalted,
    TierIo,
    TopicStopped,
    WalIo,
)
from danube.testing.memory import MemoryPort, WaiterResult


class CoreDriver:
    """Runs the core's effects to their end: `run(effects)` returns the effects a test may
    care about (metadata changes, acknowledgements, failures, stream wake-ups, halts) in the
    order the core made them, including those made by completions."""

    def __init__(
        self,
        core: BrokerCore,
        files: dict[str, dict[int, bytearray]] | None = None,
        objects: dict[str, bytes] | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        port: MemoryPort | None = None,
    ) -> None:
        self.core = core
        self.port = port or MemoryPort()
        if files is not None:
            self.port.files = files
        if objects is not None:
            self.port.objects = objects
        if metadata is not None:
            self.port.metadata = metadata
        self.port.hold = self._held
        self.hold_uploads = False
        """Keep object puts in `port.held` (an upload still under way) until
        `finish_uploads`."""
        self.interpreter = Interpreter(core, self.port, objects=True, observe=self._observe)
        self.halted: list[TierHalted] = []
        self.acked: dict[str, int] = {}
        self.stopped: dict[str, str] = {}
        self._out: list[Any] = []

    @property
    def files(self) -> dict[str, dict[int, bytearray]]:
        return self.port.files

    @property
    def objects(self) -> dict[str, bytes]:
        return self.port.objects

    @property
    def metadata(self) -> dict[str, Any]:
        return self.port.metadata

    @property
    def now_ms(self) -> int:
        return self.port.clock_ms

    @now_ms.setter
    def now_ms(self, value: int) -> None:
        self.port.clock_ms = value

    def run(self, effects: Iterable[Any]) -> list[Any]:
        self._out = []
        self.port.sleeps = 0
        self.interpreter.apply(effects)
        out, self._out = self._out, []
        return out

    def finish_uploads(self) -> list[Any]:
        """Completes the held uploads (and what follows from them)."""
        self._out = []
        self.port.sleeps = 0
        self.interpreter.perform_now(self.port.release)
        out, self._out = self._out, []
        return out

    def wait_stored(self, topic: str, through: int) -> WaiterResult:
        """A waiter for offsets up to `through` of `topic` (see `Interpreter.wait_stored`)."""
        waiter = WaiterResult()
        self.interpreter.wait_stored(topic, through, waiter)
        return waiter

    def _held(self, effect: Any) -> bool:
        return self.hold_uploads and isinstance(effect, ObjectPut)

    def _observe(self, effect: Any) -> None:
        if isinstance(effect, TierHalted):
            self.halted.append(effect)
        elif isinstance(effect, PublishAcked):
            self.acked[effect.topic] = max(self.acked.get(effect.topic, -1), effect.through_offset)
        elif isinstance(effect, (PublishFailed, TopicStopped)):
            self.stopped[effect.topic] = effect.reason
        elif isinstance(effect, DropWal):
            self.acked.pop(effect.topic, None)
        if _reported(effect):
            self._out.append(effect)


def _reported(effect: Any) -> bool:
    return not isinstance(effect, (WalIo, LoadWal, RepairWal, DropWal, ReadWal, ReadObject, TierIo))
