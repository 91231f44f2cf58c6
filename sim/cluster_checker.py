"""The invariants of the cluster control plane (spec/cluster.md), checked after every event
of a cluster run, at every commit of the simulated etcd, and once the run has settled.

a. at most one broker believes it leads at any instant, and the one that does is named by the
   leader key in the store;
b. a broker that believes it is unfenced has its lease alive in the store (the clocks drift
   within `drift_ms` per TTL, which self-fencing allows for);
c. a topic is never assigned to two brokers in the store;
d. once the faults stop, the cluster settles: every broker runs as an unfenced member, one of
   them leads, every created topic is assigned to a live broker's current incarnation, no
   assignment names a dead broker (or a past incarnation), and no marker is left;
e. an assignment is written only for a broker registered (and active) in the store when it is
   written;
f. only the leader's decisions land: every load-manager transaction that took effect was sent
   by the broker the leader key named when it was applied (spec/cluster.md, "Fencing of its
   writes");
n. no broker loops on the store: none sends more than `HOT_WRITES_PER_S` transactions that
   write one key within one simulated second, whether they commit or are refused (an owner
   whose replica set named another epoch rewrote it about 900 times a second, issue 27);
o. no broker posts a refused write again and again: none has more than
   `REFUSED_WRITES_PER_S` transactions writing one key refused within one simulated second
   (an owner whose claim was gone proposed its in-sync set at every tick; a deletion
   decided from a view that lagged the store posted the same refused step at every poll);
m. with `ClusterWorkload.quiet_s`, once settled the run goes on that long without faults, and
   no `Move` lands in the second half of that time: rebalancing stops in a quiet cluster
   (spec/cluster.md, "Rebalancing": a move never leaves its target heavier than its source).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from danube.machines.cluster import keys
from danube.machines.cluster.membership import Phase
from danube.metadata.model import Delete, Op, Put, WatchEvent
from sim.checker import Violation
from sim.cluster_node import SimNode
from sim.etcd import Origin, SimEtcd
from sim.world import US_PER_S, World

ONE_LEADER = "a one leader"
ALIVE = "b unfenced means alive"
ONE_OWNER = "c one owner per topic"
SETTLED = "d every topic on a live broker"
REGISTERED = "e assigned only to registered brokers"
LEADER_WRITES = "f only the leader's decisions land"
QUIET = "m the moves stop in a quiet cluster"
NO_HOT_LOOP = "n no broker loops on the store"
HOT_WRITES_PER_S = 100
"""(n): a broker's transactions writing one key within one simulated second. Correct runs
stay far below it (sim/README.md, "Cluster invariants", gives the highest seen); a loop that
answers itself at etcd's round trip goes far above."""
NO_REFUSED_LOOP = "o no broker repeats a refused write"
REFUSED_WRITES_PER_S = 12
"""(o): a broker's transactions writing one key refused within one simulated second. A step
repeated at every 50 ms tick or poll while what refused it stands is 20; correct runs peak at
7 (sim/README.md, "Cluster invariants")."""
NEVER = 1 << 62
DECISIONS = ("Assign", "Move", "FailOver", "Release", "MarkDrained", "SetFollowers")


class ClusterChecker:
    def __init__(self, world: World, etcd: SimEtcd, nodes: Sequence[SimNode]) -> None:
        self.world = world
        self.etcd = etcd
        self.nodes = nodes
        self.violations: list[Violation] = []
        self.landed: Counter[str] = Counter()
        """Writes that took effect, by kind (decisions, campaigns won, topics created...)."""
        self._records: dict[str, str] = {}
        """The topic record key a creation writes → its topic."""
        self.created: dict[str, int] = {}
        """Topics whose creation landed → at which revision."""
        self._owners: dict[str, dict[str, int]] = {}
        """topic → broker → revision of its assignment, as in the store."""
        self._due_us = NEVER
        """When `check` must run in full even if nothing it reads was written: the earliest
        lease deadline of an unfenced broker (simulated microseconds)."""
        self.moved: list[tuple[int, str]] = []
        """When each `Move` landed (simulated microseconds), and by whom."""
        self.others: list[list[Violation]] = []
        """The other checkers' violation lists, which `check` also tests."""
        self._second = -1
        self._writes: Counter[tuple[str, str]] = Counter()
        """(broker, key) → transactions of the broker writing the key in `_second`."""
        self._refused: Counter[tuple[str, str]] = Counter()
        """(broker, key) → those of them refused."""
        self.hottest = 0
        """The most transactions one broker sent writing one key within a second."""
        self.most_refused = 0
        """The most of them refused within a second."""
        etcd.txn_observer = self.attempted
        self._leader: str | None = None
        """The broker the leader key names, as in the store: every change of the store
        reaches `committed` (reading the key after every event cost a JSON decode each)."""
        etcd.observers.append(self)

    def _violate(self, invariant: str, detail: str) -> None:
        self.world.log(f"VIOLATION {invariant}: {detail}")
        self.violations.append(Violation(invariant, detail, self.world.now))

    def expect(self, topic: str, record: str) -> None:
        """The workload will create `topic` by writing `record`."""
        self._records[record] = topic

    # -- after every event ------------------------------------------------------------------------

    def check(self) -> bool:
        """After every event (a cluster run's hottest function). Returns whether any checker
        of the run has found a violation (`others`: the run stops there).

        (a) and (b) read the brokers' memberships and lives, the lease deadlines and the
        leader key, and the clock: the full check runs when one of them was written since
        the last (`SimEtcd.changed`, which the memberships, the brokers, the store and
        `committed` set) or when the clock reaches the earliest deadline it saw; otherwise
        it would find what it found last time, nothing."""
        etcd = self.etcd
        if etcd.changed or self.world.now >= self._due_us:
            etcd.changed = False
            self._check_members()
        return bool(self.violations) or any(self.others)

    def _check_members(self) -> None:
        """(a) and (b) in full: `SimEtcd.lease_alive` inlined, the clock read once, no list
        built unless a broker leads."""
        leader: str | None = None
        many = False
        deadlines = self.etcd._deadline_s
        now_s = self.world.now / US_PER_S
        stopped = Phase.STOPPED
        due_s = math.inf
        for node in self.nodes:
            process = node.process
            if process is None or not process.alive:
                continue
            m = process.membership
            if m.leading:
                if leader is None:
                    leader = node.name
                else:
                    many = True
            if m.fenced or m.phase is stopped:
                continue
            lease = m.lease_id
            deadline = None if lease is None else deadlines.get(lease)
            if deadline is None or deadline <= now_s:
                self._violate(
                    ALIVE,
                    f"broker {node.name} believes it is unfenced, but its lease {m.lease_id} is "
                    "not alive in the store",
                )
            elif deadline < due_s:
                due_s = deadline
        # A microsecond early at most (the float product may round up): a full check too
        # soon finds nothing, one too late would miss a violation's moment.
        self._due_us = NEVER if due_s == math.inf else math.floor(due_s * US_PER_S) - 1
        if leader is not None:
            self._leaders(leader, many)

    def _leaders(self, first: str, many: bool) -> None:
        leaders = [first]
        if many:
            leaders = [
                node.name
                for node in self.nodes
                if (p := node.process) is not None and p.alive and p.membership.leading
            ]
            self._violate(ONE_LEADER, f"brokers {', '.join(leaders)} all believe they lead")
        key = self._leader
        for name in leaders:
            if key is None or key != name:
                held = "no one" if key is None else key
                self._violate(
                    ONE_LEADER, f"broker {name} believes it leads, the leader key names {held}"
                )

    # -- at every transaction, and at every commit ------------------------------------------------

    def attempted(self, ops: Sequence[Op], origin: Origin, committed: bool) -> None:
        """(n, o): a transaction just applied, committed or refused."""
        second = self.world.now // US_PER_S
        if second != self._second:
            self._second = second
            self._writes.clear()
            self._refused.clear()
        for op in ops:
            if not isinstance(op, Put | Delete):
                continue
            counted = (origin.broker, op.key)
            writes = self._writes[counted] = self._writes[counted] + 1
            self.hottest = max(self.hottest, writes)
            if writes == HOT_WRITES_PER_S + 1:
                self._violate(
                    NO_HOT_LOOP,
                    f"broker {origin.broker} sent more than {HOT_WRITES_PER_S} transactions "
                    f"writing {op.key} ({origin.kind}) within simulated second {second}: a loop "
                    "on the store",
                )
            if committed:
                continue
            refused = self._refused[counted] = self._refused[counted] + 1
            self.most_refused = max(self.most_refused, refused)
            if refused == REFUSED_WRITES_PER_S + 1:
                self._violate(
                    NO_REFUSED_LOOP,
                    f"broker {origin.broker} had more than {REFUSED_WRITES_PER_S} transactions "
                    f"writing {op.key} ({origin.kind}) refused within simulated second "
                    f"{second}: a refused write posted again and again",
                )

    def committed(self, events: list[WatchEvent], origin: Origin | None) -> None:
        for event in events:  # first: `_leader_wrote` reads the key as this commit left it
            if event.key == keys.LEADER_KEY:
                self._leader = None if event.kind == "delete" else str(event.value)
                self.etcd.changed = True  # `check` compares it with who believes it leads
        if origin is not None and events:
            self.landed[origin.kind] += 1
            if origin.kind == "Move":
                self.moved.append((self.world.now, origin.broker))
            if origin.kind in DECISIONS:
                self._leader_wrote(origin)
        for event in events:
            if (pair := keys.parse_assignment_key(event.key)) is not None:
                self._assignment(event, *pair)
            elif event.key in self._records and event.kind == "put":
                self.created.setdefault(self._records[event.key], event.mod_revision)

    def _leader_wrote(self, origin: Origin) -> None:
        leader = self.etcd.get(keys.LEADER_KEY)
        if leader is None or str(leader.value) != origin.broker:
            held = "no one" if leader is None else str(leader.value)
            self._violate(
                LEADER_WRITES,
                f"a {origin.kind} of broker {origin.broker} took effect while the leader key "
                f"named {held}",
            )

    def _assignment(self, event: WatchEvent, broker: str, topic: str) -> None:
        owners = self._owners.setdefault(topic, {})
        if event.kind == "delete":
            owners.pop(broker, None)
            return
        owners[broker] = event.mod_revision
        if len(owners) > 1:
            brokers = ", ".join(sorted(owners))
            self._violate(ONE_OWNER, f"{topic} is assigned to {brokers} at r{event.mod_revision}")
        registration = self.etcd.get(keys.register_key(broker))
        state = self.etcd.get(keys.state_key(broker))
        mode = None if state is None else keys.broker_mode(state.value)
        if registration is None or mode not in (None, "active"):
            why = "not registered" if registration is None else f"in mode {mode}"
            self._violate(
                REGISTERED,
                f"{topic} was assigned to broker {broker} at r{event.mod_revision}, which is "
                f"{why} in the store",
            )

    # -- once the faults stopped -----------------------------------------------------------------

    def unsettled(self, wanted: Sequence[str], excused: Sequence[str] = ()) -> list[str]:
        """What keeps the cluster from being settled (d); empty once it is. `excused`:
        topics that may stay unassigned (replicated, every replica that may take them over
        died for good)."""
        problems = []
        running = {}
        for node in self.nodes:
            process = node.running
            if node.lost:
                continue
            if process is None:
                problems.append(f"broker {node.name} is not running")
                continue
            running[node.name] = process
            m = process.membership
            if m.phase is not Phase.MEMBER or m.fenced:
                problems.append(
                    f"broker {node.name} is not an unfenced member ({m.phase.value}, "
                    f"fenced={m.fenced}, lease {m.lease_id})"
                )
        leaders = sorted(name for name, p in running.items() if p.membership.leading)
        if len(leaders) != 1:
            key = self.etcd.get(keys.LEADER_KEY)
            held = "no one" if key is None else str(key.value)
            problems.append(f"{len(leaders)} brokers lead ({leaders}); the leader key names {held}")
        problems += [f"{topic} was never created" for topic in wanted if topic not in self.created]
        for topic in sorted(set(self.created) - set(excused)):
            owners = self._owners.get(topic, {})
            if not owners:
                problems.append(f"{topic} is not assigned")
            for broker, revision in sorted(owners.items()):
                registration = self.etcd.get(keys.register_key(broker))
                process = running.get(broker)
                if (
                    process is None
                    or registration is None
                    or registration.lease != process.membership.lease_id
                    or revision < registration.mod_revision
                ):
                    problems.append(
                        f"{topic} is assigned (r{revision}) to broker {broker}, which is dead "
                        "or a later incarnation of it"
                    )
        markers = [
            kv
            for kv in self.etcd.scan(keys.UNASSIGNED_PREFIX)
            if keys.parse_unassigned_key(kv.key) not in excused
        ]
        if markers:
            problems.append(f"markers left: {', '.join(kv.key for kv in markers[:5])}")
        return problems

    def quiet(self, began: int, ended: int) -> None:
        """(m) The cluster settled at `began` and ran on without faults until `ended`: the
        moves stop within the first half of that window. Rebalancing is a move a second at
        most (the runs' cooldown): a cluster still moving topics after half of a quiet window
        moves them back and forth (a move that left its target heavier than its source: the
        next one undoes it). The hourly cap (`max_moves_per_hour`) is what an operator has
        against that; the runs' cap is 10,000, so this invariant looks for it instead."""
        half = began + (ended - began) // 2
        late = [(t, broker) for t, broker in self.moved if t >= half]
        if late:
            during = sum(1 for t, _ in self.moved if t >= began)
            self._violate(
                QUIET,
                f"{during} moves in the {(ended - began) / US_PER_S:g} s after the cluster "
                f"settled without faults, {len(late)} of them in the second half (the last "
                f"at {late[-1][0] / US_PER_S:.3f} s, by broker {late[-1][1]})",
            )

    def unsettled_for_good(self, problems: list[str]) -> None:
        shown = "; ".join(problems[:6]) + ("; ..." if len(problems) > 6 else "")
        self._violate(SETTLED, f"the cluster did not settle after the faults stopped: {shown}")
