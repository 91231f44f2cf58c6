"""One broker of the cluster run: its `Membership` and `LoadManager` machines, driven as
`danube.runtime.membership.MembershipDriver` and `danube.runtime.load_manager.LoadManagerDriver`
drive them, against `sim.etcd.SimEtcd`, plus the least of a data plane.

What the drivers do, done here with simulated time:

- every request runs with the drivers' timeout (3 s); an error or no answer is the failure
  input (`request_failed`, `renew_failed`, `lease_lost` for an unknown lease, a lost campaign);
  the load manager's decisions wait for slots and go in batches as the driver's do
  (`sim.cluster_slots.DecisionLanes`, `danube.machines.cluster.request_batching`);
- `WakeAt` and `ScheduleTick` arm one timer each, a later one replacing the earlier;
- the load manager's view is a watch of `/cluster/` opened before a scan of it (`resync`), then
  the watch's events above the snapshot's newest revision (`observe`); the membership's view
  of the leader is a watch of the leader key opened before a get of it; a broken watch is
  opened again after 0.5 s;
- leadership changes from the membership machine go straight into the load manager, and the
  load manager's decisions run as transactions whose outcome is only logged;
- as in the control-plane test, the membership starts once the view is synced.

Without a data plane (`NodeSettings.data` None) the broker only does what the load manager
waits for (spec/cluster.md, "Topic moves"): a not-ready `unload`/`rebalance` marker that names
this broker and was written after it registered is rewritten `ready: true` (compared on the
marker's revision) a moment later. With one, `sim.cluster_data.DataPlane` runs the real
ownership machine and broker core instead, fed by the same `/cluster/` watch; its fencing
follows the membership's `Fenced`/`Unfenced`.

A broker's clock has its own origin and a rate that drifts from etcd's within the configured
skew; a crash ends the incarnation (its timers, requests and watches die with it) and the next
one starts from nothing but the clock (and, with a data plane, the machine's disk).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from danube.effects.flow import Finished
from danube.machines.cluster import decisions, keys
from danube.machines.cluster import load_manager as lm
from danube.machines.cluster import membership as ms
from danube.machines.cluster import membership_flows as ms_flows
from danube.machines.cluster.keys import CLUSTER_PREFIX, LEADER_KEY, Marker
from danube.machines.cluster.load_manager import LoadManager, LoadManagerConfig
from danube.machines.cluster.membership import Membership, MembershipConfig
from danube.machines.cluster.placement import creation
from danube.machines.cluster.ranking import LoadReport
from danube.machines.node import paths
from danube.metadata.model import Compare, KeyValue, Put, WatchEvent
from danube.runtime.watching import REQUEST_TIMEOUT_S, WATCH_RETRY_S
from danube.values.config import DispatchStrategy
from danube.values.names import parse_topic
from sim.cluster_data import DataPlane
from sim.cluster_slots import DecisionLanes
from sim.disk import SimDisk
from sim.etcd import Origin, SimEtcd, failed
from sim.faults import Injected
from sim.flow_runner import Answer, run_flow
from sim.network import Network, Stream
from sim.objects import SimObjectStore
from sim.replica_streams import ReplicaStreams
from sim.world import US_PER_MS, US_PER_S, Timeouts, World

REQUEST_TIMEOUT_US = int(REQUEST_TIMEOUT_S * US_PER_S)
WATCH_RETRY_US = int(WATCH_RETRY_S * US_PER_S)
EPOCH_S = 1_795_000_000
"""The brokers' wall clock (audit records of moves) starts at a realistic date."""
SEAL_US = (5_000, 150_000)
"""How long a broker takes to unload a topic before it marks the marker ready."""
DATA_RETRY_US = 500_000
TIMEOUT = TimeoutError("no answer within the request timeout")


@dataclass(frozen=True, slots=True)
class Clock:
    """A broker machine's monotonic clock in µs: its own origin, and a rate against etcd's."""

    origin_us: int
    rate: float

    def us(self, world_us: int) -> int:
        return self.origin_us + int(world_us * self.rate)

    def delay(self, target_us: int, world_us: int) -> int:
        """World µs from `world_us` until this clock reads at least `target_us`."""
        return max(0, math.ceil((target_us - self.origin_us) / self.rate) + 1 - world_us)


@dataclass(frozen=True, slots=True)
class NodeSettings:
    membership: MembershipConfig
    manager: LoadManagerConfig
    objects: SimObjectStore | None = None
    """The cluster's object store: set, the brokers run data planes."""
    in_flight: int = 1
    """With data planes: the producers' window (`ClusterWorkload.in_flight`), which sizes
    each broker's publish pool (`sim.cluster_data.data_memory`)."""


@dataclass(slots=True)
class _Follow:
    """One watch opened before a read of what it watches (the drivers' pattern)."""

    stream: Stream
    seen: int | None = None
    """The revision the read covered; None until it is answered (events wait meanwhile)."""
    backlog: list[list[WatchEvent]] = field(default_factory=list)


_CHECKED = frozenset({"phase", "lease_id", "fenced", "leading"})
"""The membership's fields `ClusterChecker.check` reads."""


class WatchedMembership(Membership):
    """The broker's membership machine, unchanged, telling the cluster checker when a field
    it checks after every event is written (`SimEtcd.changed`): the check then runs in full
    only after such a write, or once a lease deadline may have passed."""

    __slots__ = ("_changes",)

    def __init__(self, config: MembershipConfig, changes: SimEtcd) -> None:
        object.__setattr__(self, "_changes", changes)
        super().__init__(config)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _CHECKED:
            self._changes.changed = True
        object.__setattr__(self, name, value)


class BrokerProcess:
    """One incarnation of a broker."""

    def __init__(self, node: SimNode, incarnation: int) -> None:
        self.node = node
        self.name = node.name
        self.world = node.world
        self.etcd = node.etcd
        self.network = node.network
        self.incarnation = incarnation
        self.alive = True
        self.stopping = False
        self.membership: Membership = WatchedMembership(node.settings.membership, node.etcd)
        self.manager = LoadManager(node.name, node.settings.manager)
        self._member_started = False
        self._wake = 0
        self._tick = 0
        self._follows: dict[str, _Follow] = {}
        self._timeouts = Timeouts(self.world, REQUEST_TIMEOUT_US)
        """The timeouts of this incarnation's requests to the store (`call`)."""
        self._registration: int | None = None
        """`mod_revision` of this broker's registration in the view (the data plane's)."""
        self._markers: dict[str, tuple[Marker, int]] = {}
        self._sealing: dict[str, int] = {}
        """topic → marker revision being (or already) marked ready."""
        self.decision_lanes = DecisionLanes(self)
        """The load manager's decisions, slotted and batched as the driver does."""
        self.assignments: dict[str, str] = {}
        """topic → broker, as this broker's view of the store has it (what a lookup reads)."""
        objects = node.settings.objects
        self.data = (
            None
            if objects is None
            else DataPlane(self, node.disk, objects, node.injected, node.settings.in_flight)
        )

    # -- clocks ------------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.node.clock.us(self.world.now) // US_PER_MS

    def now_ns(self) -> int:
        return self.node.clock.us(self.world.now) * 1_000

    def unix_s(self) -> int:
        return EPOCH_S + self.node.clock.us(self.world.now) // US_PER_S

    def at_clock(self, target_us: int, action: Callable[[], None]) -> None:
        self.world.at(self.node.clock.delay(target_us, self.world.now), action)

    # -- life --------------------------------------------------------------------------------------

    def start(self) -> None:
        self.world.log(f"broker {self.name} starts (incarnation {self.incarnation})")
        if self.data is not None:
            self.data.start()
        self._follow("cluster")

    def die(self, *, power: bool = False) -> None:
        self.alive = False
        self.etcd.changed = True  # what `ClusterChecker.check` reads
        if self.data is not None:
            self.data.die(power=power)
        for follow in self._follows.values():
            follow.stream.alive = False
        self._follows.clear()

    def stop(self, exited: Callable[[], None]) -> None:
        """A graceful stop: give up leadership, revoke the lease, exit."""
        self.stopping = True
        self._membership(self.membership.stop())
        lease = self.membership.lease_id

        def done(_: Any) -> None:
            self.die()
            exited()

        if lease is None:
            done(None)
            return
        origin = Origin(self.name, "revoke")
        self.call(f"revoke lease {lease}", lambda: self.etcd.revoke(lease, origin), done)

    def call(self, what: str, run: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """One request with the drivers' timeout: `done` gets the answer, the error, or
        `TIMEOUT`, once, and only while this incarnation lives."""
        answered = False

        def finish(result: Any) -> None:
            nonlocal answered
            if answered or not self.alive:
                return
            answered = True
            if result is TIMEOUT:
                self.world.log(f"broker {self.name} timeout: {what}")
            else:
                timer.clear()
            done(result)

        timer = self._timeouts.start(lambda: finish(TIMEOUT))
        if self.node.lease_lane_cut_until > self.world.now and what.startswith("renew lease"):
            return  # `ClusterFaults.lease_lane`: the renewal vanishes, the call times out
        self.etcd.request(self.name, what, run, finish)

    # -- watches -----------------------------------------------------------------------------------

    def _follow(self, name: str) -> None:
        if not self.alive:
            return
        prefix = LEADER_KEY if name == "leader" else CLUSTER_PREFIX
        follow = _Follow(self.node.network.open_stream(self.name))
        self._follows[name] = follow

        def current() -> bool:
            return self.alive and self._follows.get(name) is follow

        def deliver(events: list[WatchEvent]) -> None:
            if not current():
                return
            if follow.seen is None:
                follow.backlog.append(events)
            else:
                self._events(name, follow.seen, events)

        def broken() -> None:
            if current():
                self._refollow(name, follow, "stream broken")

        def read() -> Any:
            if name == "leader":
                return self.etcd.get(LEADER_KEY)
            return self.etcd.scan(CLUSTER_PREFIX)

        def snapshot(result: Any) -> None:
            if not current():
                return
            if failed(result):
                self._refollow(name, follow, "read failed")
                return
            follow.seen = self._synced(name, result)
            for events in follow.backlog:
                self._events(name, follow.seen, events)
            follow.backlog.clear()

        def opened(result: Any) -> None:
            if not current():
                return
            if failed(result):
                self._refollow(name, follow, "watch not opened")
                return
            self.call(f"read {prefix}", read, snapshot)

        self.call(
            f"watch {prefix}",
            lambda: self.etcd.watch(prefix, follow.stream, deliver, broken),
            opened,
        )

    def _refollow(self, name: str, follow: _Follow, why: str) -> None:
        follow.stream.alive = False
        del self._follows[name]
        self.world.log(f"broker {self.name} watch {name} restarts: {why}")
        self.world.at(WATCH_RETRY_US, lambda: self._follow(name))

    def _synced(self, name: str, result: Any) -> int:
        """Applies a watch's read; returns the revision its events must be above."""
        if name == "leader":
            current: KeyValue | None = result
            leader = None if current is None else str(current.value)
            lease = None if current is None else current.lease
            self._membership(self.membership.leader_seen(leader, self.now_ms(), lease=lease))
            return 0 if current is None else current.mod_revision
        snapshot: list[KeyValue] = result
        self._manager(self.manager.resync(snapshot, self.now_ns()))
        self._registration = None
        self._markers.clear()
        self.assignments.clear()
        for kv in snapshot:
            self._see(kv.key, kv.value, kv.mod_revision)
        if self.data is not None:
            self.data.resync(snapshot)
        self._seal()
        if not self._member_started:
            self._member_started = True
            self._follow("leader")
            self._membership(self.membership.start(self.now_ms()))
        return max((kv.mod_revision for kv in snapshot), default=0)

    def _events(self, name: str, seen: int, events: list[WatchEvent]) -> None:
        for event in events:
            if not self.alive or event.mod_revision <= seen:
                continue
            if name == "leader":
                if event.key == LEADER_KEY:
                    leader = None if event.kind == "delete" else str(event.value)
                    self._membership(
                        self.membership.leader_seen(leader, self.now_ms(), lease=event.lease)
                    )
            else:
                self._manager(self.manager.observe(event, self.now_ns()))
                revision = event.mod_revision if event.kind == "put" else None
                self._see(event.key, event.value, revision)
                if self.data is not None:
                    self.data.seen(event.key, event.value, revision)
                self._seal()

    # -- membership driver -------------------------------------------------------------------------

    def _membership(self, effects: list[ms.Effect]) -> None:
        for effect in effects:
            if not self.alive:
                return
            if isinstance(effect, ms.WakeAt):
                self._wake += 1
                token = self._wake
                self.at_clock(effect.at_ms * US_PER_MS, lambda t=token: self._woken(t))
            elif isinstance(effect, ms.Fenced | ms.Unfenced):
                self.world.log(f"broker {self.name} {type(effect).__name__.lower()}")
                if self.data is None:
                    continue
                if isinstance(effect, ms.Fenced):
                    self.data.fenced()
                else:
                    assert self.membership.lease_id is not None
                    self.data.unfenced(
                        self.membership.lease_id, self.membership.registered_revision
                    )
            elif isinstance(effect, ms.LeadershipGained):
                self.world.log(f"broker {self.name} leads")
                self._manager(self.manager.became_leader(self.now_ns()))
            elif isinstance(effect, ms.LeadershipLost):
                self.world.log(f"broker {self.name} no longer leads: {effect.reason}")
                self._manager(self.manager.lost_leadership(self.now_ns()))
            else:
                self._membership_request(effect)

    def _woken(self, token: int) -> None:
        if self.alive and token == self._wake:
            self._membership(self.membership.tick(self.now_ms()))

    def _membership_request(self, effect: ms.Effect) -> None:
        """Runs the request's flow (`danube.machines.cluster.membership_flows`), as the broker's
        membership driver does, over the simulated etcd."""
        flow = ms_flows.flow_of(self.membership, effect, self.now_ms)
        assert flow is not None, effect
        run_flow(self, flow, self._measure_load, self._membership_done)

    def _measure_load(self, request: Any, answer: Answer) -> None:
        assert isinstance(request, ms_flows.MeasureLoad), request
        answer(LoadReport(self.name, timestamp=self.unix_s()).to_json())

    def _membership_done(self, end: Finished) -> None:
        if end.error is not None:
            raise end.error  # a flow's bug: the run fails loudly
        if self.alive:
            self._membership(end.value)

    # -- load manager driver -----------------------------------------------------------------------

    def _manager(self, effects: list[lm.Effect]) -> None:
        for effect in effects:
            if not self.alive:
                return
            if isinstance(effect, lm.ScheduleTick):
                self._tick += 1
                token = self._tick
                self.at_clock(-(-effect.at // 1_000), lambda t=token: self._ticked(t))
            elif isinstance(effect, lm.Log):
                self.world.log(f"broker {self.name} {effect.event}: {effect.detail}")
            else:
                self._transact(effect)
        self.decision_lanes.start()

    def _ticked(self, token: int) -> None:
        if self.alive and token == self._tick:
            self._manager(self.manager.tick(self.now_ns(), unix_s=self.unix_s()))

    def _transact(self, txn: lm.Txn) -> None:
        self.world.log(f"broker {self.name} decides {type(txn).__name__} {decisions.describe(txn)}")
        self.decision_lanes.offer(txn)

    # -- data plane and workload -------------------------------------------------------------------

    def create_topic(self, topic: str) -> None:
        """As a broker creating a topic: the namespace's topic record and a null marker (with
        a data plane, a reliable topic as `danube.machines.cluster.placement.creation` writes it),
        once (a retried creation finds the record and changes nothing)."""
        name = parse_topic(topic)
        record = paths.namespace_topic(name)
        compares: tuple[Compare, ...] = (Compare(record, "version", "==", 0),)
        ops: tuple[Any, ...] = (Put(record, {}), Put(keys.unassigned_key(topic), None))
        if self.data is not None:
            compares, ops = creation([name], DispatchStrategy.RELIABLE)
        origin = Origin(self.name, "create")
        self.call(f"create {topic}", lambda: self.etcd.txn(compares, ops, origin), _ignore)

    def _see(self, key: str, value: Any, revision: int | None) -> None:
        """The data plane's view: its own registration and the markers (None: deleted)."""
        if (pair := keys.parse_assignment_key(key)) is not None:
            if revision is None:
                if self.assignments.get(pair[1]) == pair[0]:
                    del self.assignments[pair[1]]
            else:
                self.assignments[pair[1]] = pair[0]
        elif keys.parse_register_key(key) == self.name:
            self._registration = revision
        elif (topic := keys.parse_unassigned_key(key)) is not None:
            if revision is None:
                self._markers.pop(topic, None)
                self._sealing.pop(topic, None)
            else:
                self._markers[topic] = (Marker.from_json(value), revision)

    def _seal(self) -> None:
        if self.data is not None:
            return
        for topic, (marker, revision) in sorted(self._markers.items()):
            if (
                marker.ready
                or marker.from_broker != self.name
                or self._registration is None
                or revision <= self._registration
                or self._sealing.get(topic) == revision
            ):
                continue
            self._sealing[topic] = revision
            delay = self.world.rng.randint(*SEAL_US)
            self.world.at(delay, lambda t=topic, m=marker, r=revision: self._mark_ready(t, m, r))

    def _mark_ready(self, topic: str, marker: Marker, revision: int) -> None:
        if not self.alive:
            return
        key = keys.unassigned_key(topic)
        ready = dataclasses.replace(marker, ready=True).to_json()
        origin = Origin(self.name, "ready")

        def done(result: Any) -> None:
            if failed(result) or not result.succeeded:
                self._sealing.pop(topic, None)
                self.world.at(DATA_RETRY_US, self._seal)

        self.call(
            f"mark {topic} ready",
            lambda: self.etcd.txn(
                (Compare(key, "mod_revision", "==", revision),), (Put(key, ready),), origin
            ),
            done,
        )


class SimNode:
    """A broker machine: its name, its clock, and its current incarnation (if running)."""

    def __init__(
        self,
        name: str,
        world: World,
        network: Network,
        etcd: SimEtcd,
        injected: Injected,
        settings: NodeSettings,
        clock: Clock,
    ) -> None:
        self.name = name
        self.world = world
        self.network = network
        self.etcd = etcd
        self.injected = injected
        self.settings = settings
        self.clock = clock
        self.disk = SimDisk()
        """The machine's disk: it outlives crashes, not the machine."""
        self.process: BrokerProcess | None = None
        self.incarnations = 0
        self.lost = False
        """Dead for good: never restarts."""
        self.streams: ReplicaStreams | None = None
        """The replication streams between brokers (`--replicated`)."""
        self.poison: Any = None
        """The poison workload's ledger (`sim.cluster_poison.PoisonLedger`, `--poison`)."""
        self.data_checker: Any = None
        """The data checker (`sim.cluster_data_checker.DataChecker`) of a run with data."""
        self.lease_lane_cut_until = -1
        """World time until which this machine's lease renewals vanish (`lease_lane`)."""

    @property
    def running(self) -> BrokerProcess | None:
        """The live incarnation, unless it is stopping."""
        process = self.process
        return process if process is not None and process.alive and not process.stopping else None

    def boot(self) -> None:
        self.incarnations += 1
        self.process = BrokerProcess(self, self.incarnations)
        self.etcd.changed = True  # what `ClusterChecker.check` reads
        self.process.start()

    def crash(self, restart_us: int, *, power: bool = False) -> None:
        assert self.process is not None
        self.process.die(power=power)
        kind = "power_failure" if power else "crash"
        self.injected[kind] += 1
        self.world.log(f"fault {kind} broker {self.name}; restarts in {restart_us}us")
        self.world.at(restart_us, self.boot)

    def kill(self) -> None:
        assert self.process is not None
        self.process.die()
        self.lost = True
        self.injected["kill"] += 1
        self.world.log(f"fault broker {self.name} dies for good")

    def stop(self, restart_us: int) -> None:
        assert self.process is not None
        self.injected["stop"] += 1
        self.world.log(f"fault stop broker {self.name}; restarts {restart_us}us after exit")
        self.process.stop(lambda: self.world.at(restart_us, self.boot))


def _ignore(_: Any) -> None:
    """The drivers only log these outcomes; the store's trace line says it already."""
