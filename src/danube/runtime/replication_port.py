"""The broker process's replication port (spec/replication.md, issue 27): what joins the core's
replication effects and inputs to the transport (`danube.runtime.replication_link`,
`replication_service`) and to the cluster's records.

- **Effects** (`perform`, called by `ProductionPort`): `ReplicaSend` is queued on the stream
  to the follower (`ReplicationLinks.send`) and answered at once; `ReplicaAnswer` is put on
  the answer outbox of the stream the owner opened to us (none: dropped, the owner resends
  after its break); `AskEpochEnd` asks the owner's admin port and answers its end only when
  the owner still writes the epoch asked about.
- **Inputs**: the links' answers and breaks, the service's `Replicate`s and `EpochEnd`
  questions go to `interpreter.replication` on the asyncio loop (where every core call is
  made). Calls from trio tasks (the watch) are posted there with `call_soon_threadsafe`, as
  `BrokerRuntime._in_loop` does, so they keep one order with the gRPC handlers'.
- **The view**: the load manager's watch of `/cluster/` feeds `snapshot`/`observe` here too;
  this keeps the brokers' admin addresses (to reach followers and owners) and routes
  replicas-value changes: to the core when this broker owns the topic (`replicas_changed`),
  `replica_released` when it follows the topic no more. After a topic is adopted,
  `adopted` reads its value and pushes it, so the owner starts replicating at once.

It decides nothing: which follower, when to resend, when to shrink are the machines'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from danube import keys
from danube.interpreter.host import Done
from danube.machines.cluster.replicas import ReplicaSet, ReplicaSetError
from danube.machines.node.core import AskEpochEnd, ReplicaAnswer, ReplicaSend
from danube.machines.replication.messages import FollowerAnswer, Replicate, Replicated
from danube.metadata import KeyValue, MetadataStore, WatchEvent
from danube.runtime.replication_link import TIMED_SENDS, ReplicationLinks, ask_epoch_end
from danube.runtime.replication_service import Outbox, ReplicationService
from danube.runtime.stage_metrics import StageLatency
from danube.values.errors import DanubeError, ErrorCode

if TYPE_CHECKING:
    from danube.runtime.broker import BrokerRuntime

log = logging.getLogger("danube.runtime")

PORT_EFFECTS = (ReplicaSend, ReplicaAnswer, AskEpochEnd)


class ReplicationPort:
    """Owner and follower side of one broker's replication (module docstring)."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        broker_id: str,
        store: MetadataStore,
        loop: asyncio.AbstractEventLoop,
        stages: StageLatency | None = None,
    ) -> None:
        """`stages`: the broker's stage histograms, where the replication stages are observed
        (`danube.runtime.stage_metrics`); None observes none."""
        self._runtime = runtime
        self.broker_id = broker_id
        self._store = store
        self._loop = loop
        self.addresses: dict[str, str] = {}
        """Broker id -> its registered admin address (`/cluster/register/<id>`)."""
        self.records: dict[str, tuple[ReplicaSet, int]] = {}
        """Topic -> its replicas value and that value's mod_revision, as last seen."""
        self.assigned: set[str] = set()
        """Topics the view assigns to this broker (`/cluster/brokers/<me>/...`)."""
        self._outboxes: dict[str, Outbox] = {}
        """Owner broker -> the answer outbox of the stream it opened to us."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._stages = stages
        self._received: dict[tuple[str, str], deque[tuple[int, float]]] = {}
        """(owner, topic) -> ends of `Replicate`s received and when, until their answer
        (the `replica_durable` stage; measurement only, at most `TIMED_SENDS` each)."""
        pool = runtime.core.publish_pool
        self.links = ReplicationLinks(
            self.addresses.get,
            self._answered,
            self._broke,
            from_broker=broker_id,
            loop=loop,
            charge=pool.replication_queued if pool is not None else None,
            fits=pool.replication_fits if pool is not None else None,
            stages=stages,
        )
        self.service = ReplicationService(self, stages=stages)

    # -- the core's effects (called on the asyncio loop) ----------------------------------------

    def perform(self, effect: ReplicaSend | ReplicaAnswer | AskEpochEnd, done: Done) -> None:
        if isinstance(effect, ReplicaSend):
            self.links.send(effect.follower, effect.message)
            done(None, None)
        elif isinstance(effect, ReplicaAnswer):
            outbox = self._outboxes.get(effect.owner)
            if outbox is not None:
                self._timed_answer(effect.owner, effect.answer)
                outbox.put(effect.answer)
            done(None, None)
        else:
            task = self._loop.create_task(self._ask(effect, done))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _ask(self, ask: AskEpochEnd, done: Done) -> None:
        address = self.addresses.get(ask.owner)
        if address is None:
            done(None, DanubeError(ErrorCode.UNAVAILABLE, f"broker {ask.owner} is not known"))
            return
        try:
            end, owner_epoch = await ask_epoch_end(address, ask.topic, ask.last_epoch)
        except Exception as error:
            done(None, error)
            return
        done(end if owner_epoch == ask.epoch else None, None)

    # -- owner side: the links' callbacks (on the asyncio loop) ---------------------------------

    def _answered(self, follower: str, answer: FollowerAnswer) -> None:
        self._runtime.interpreter.replication.answered(follower, answer)

    def _broke(self, follower: str) -> None:
        log.info("event=replication_stream_broke follower=%s", follower)
        self._runtime.interpreter.replication.stream_broke(follower)

    # -- follower side: `ReplicaHandler` of the service -----------------------------------------

    async def replicate(self, from_broker: str, message: Replicate, outbox: Outbox) -> None:
        self._outboxes[from_broker] = outbox
        if message.record_count and self._stages is not None:
            received = self._received.get((from_broker, message.topic))
            if received is None:
                received = self._received[from_broker, message.topic] = deque(maxlen=TIMED_SENDS)
            received.append((message.end, time.perf_counter()))
        self._runtime.interpreter.replication.received(from_broker, message)

    def stream_closed(self, from_broker: str, outbox: Outbox) -> None:
        if self._outboxes.get(from_broker) is outbox:
            del self._outboxes[from_broker]
            for key in [key for key in self._received if key[0] == from_broker]:
                del self._received[key]

    def _timed_answer(self, owner: str, answer: FollowerAnswer) -> None:
        """`replica_durable` of every `Replicate` this answer covers."""
        if self._stages is None or not isinstance(answer, Replicated):
            return
        received = self._received.get((owner, answer.topic))
        now = time.perf_counter()
        histogram = self._stages.histograms["replica_durable"]
        while received and received[0][0] <= answer.end:
            histogram.observe((now - received.popleft()[1]) * 1000)
        if received is not None and not received:
            del self._received[owner, answer.topic]  # topics come and go on a long stream

    async def epoch_end(self, topic: str, epoch: int) -> tuple[int, int]:
        end = self._runtime.interpreter.replication.epoch_end(topic, epoch)
        claims = self._runtime.claims or {}
        owner_epoch = claims.get(topic)
        if end is None or owner_epoch is None:
            raise DanubeError(ErrorCode.UNAVAILABLE, f"this broker does not own {topic} now")
        return end, owner_epoch

    # -- the view (called from trio tasks) -----------------------------------------------------

    def snapshot(self, kvs: list[KeyValue]) -> None:
        """A whole read of `/cluster/`: every address and replicas value now."""
        self.addresses.clear()
        self.assigned.clear()
        records: dict[str, tuple[ReplicaSet, int]] = {}
        for kv in kvs:
            self._address(kv.key, kv.value)
            self._assignment(kv.key, True)
            topic = keys.parse_replicas_key(kv.key)
            if topic is not None and (record := _record(topic, kv.value)) is not None:
                records[topic] = (record, kv.mod_revision)
        gone = set(self.records) - set(records)
        self.records = records
        self._post(lambda: self._resynced(gone))

    def observe(self, event: WatchEvent) -> None:
        """One change under `/cluster/`."""
        if event.kind == "put":
            self._address(event.key, event.value)
        elif (broker := _registered(event.key)) is not None:
            self.addresses.pop(broker, None)
        self._assignment(event.key, event.kind == "put")
        topic = keys.parse_replicas_key(event.key)
        if topic is None:
            return
        record = _record(topic, event.value) if event.kind == "put" else None
        if record is None:
            self.records.pop(topic, None)
        else:
            self.records[topic] = (record, event.mod_revision)
        self._post(lambda: self._route(topic))

    async def adopted(self, topic: str, written: tuple[Any, int] | None = None) -> None:
        """The topic was just adopted here: its replicas value goes to the core, so
        replication starts without a change: the value the load wrote (`written`: value,
        revision), else as the store holds it now (one read: issue 23's failover adopted
        hundreds at once)."""
        if written is not None:
            value, revision = written
        else:
            found = await self._store.get(keys.replicas_key(topic))
            if found is None:
                return
            value, revision = found.value, found.mod_revision
        if (record := _record(topic, value)) is None:
            return
        seen = self.records.get(topic)
        if seen is None or seen[1] < revision:
            self.records[topic] = (record, revision)
        self._post(lambda: self._route(topic))

    def _assignment(self, key: str, present: bool) -> None:
        pair = keys.parse_assignment_key(key)
        if pair is not None and pair[0] == self.broker_id:
            (self.assigned.add if present else self.assigned.discard)(pair[1])

    def _address(self, key: str, value: Any) -> None:
        broker = _registered(key)
        if broker is not None and isinstance(value, dict):
            address = value.get("admin_addr")
            if isinstance(address, str) and address:
                self.addresses[broker] = address

    def _post(self, call: Callable[[], None]) -> None:
        self._loop.call_soon_threadsafe(call)

    # -- routing (on the asyncio loop) ---------------------------------------------------------

    def _resynced(self, gone: set[str]) -> None:
        for topic in sorted(set(self.records) | gone):
            self._route(topic)
        core = self._runtime.core
        for topic in sorted(core.followers.replicas):
            if topic not in self.records:
                self._route(topic)

    def _route(self, topic: str) -> None:
        """A topic's replicas value to the core (`BrokerCore.replica_set_seen` decides: the
        owner's side adopts it, a replica no longer followed goes)."""
        runtime, core = self._runtime, self._runtime.core
        record, version = self.records.get(topic, (None, 0))
        assigned = topic in self.assigned
        seen = core.replica_set_seen(
            topic,
            record,
            version,
            assigned_here=assigned,
            now_ms=runtime.interpreter.host.now_ms(),
        )
        if seen.effects:
            runtime.apply(seen.effects)

    # -- stopping ------------------------------------------------------------------------------

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.links.close()


def _registered(key: str) -> str | None:
    if key.startswith(keys.REGISTER_PREFIX):
        broker = key[len(keys.REGISTER_PREFIX) :]
        return broker or None
    return None


def _record(topic: str, value: Any) -> ReplicaSet | None:
    try:
        return ReplicaSet.from_json(value)
    except ReplicaSetError as error:
        log.warning("event=replicas_unreadable topic=%s error=%s", topic, error)
        return None
