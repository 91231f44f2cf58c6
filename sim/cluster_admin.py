"""The operator of a cluster run: drains, activations, topic unloads, topic deletions and
namespace-policy changes at seed-chosen times, each run through the admin flows production
runs (`danube.machines.requests.admin`), on a random running broker, which forwards it to the broker
it believes leads as the admin services do. Store requests go to the simulated etcd with its
faults (`sim.flow_runner.run_flow`); the flows' admin requests are answered here from the
broker's own machines.

The topics it deletes are its own (`scratch-N`, created once each, without producers), so
the workload's topics stay for the data invariants. Once the faults stop (`calm`) it
finishes what it left undone: every drained broker is activated again, every deletion it
started is run again until it answers, so the cluster can settle.

The invariants its answers must keep (`AdminChecker`):
i. a deleted topic's metadata, marker and assignment are gone once the deletion answered,
   and it is never assigned again;
j. a drained broker owns none of the topics the drain counted moved once it answered;
k. every write of a namespace's policies is the merge of what the store held and the
   changes asked for;
l. with data planes: a topic's policy overrides, once a change of them answered, are what
   the broker serving the topic enforces after the cluster settled, across the moves and
   failovers in between (`flows.topic_policies`, routed to the owner by `flows.at_owner`),
   and what the store holds; a change answered UNAVAILABLE that reached a core may hold.
   Judged once no write of overrides is under way at a live broker (`Operator.writing`) or
   left to write again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from danube import keys as danube_keys
from danube.effects import Sleep, StoreUnreachable
from danube.effects.flow import Finished, Flow
from danube.machines.cluster import keys
from danube.machines.cluster.placement import creation
from danube.machines.node.settings import merged_policies
from danube.machines.requests import admin as flows
from danube.metadata.model import WatchEvent
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic
from sim.checker import Violation
from sim.cluster_node import BrokerProcess, SimNode
from sim.etcd import Origin, SimEtcd
from sim.flow_runner import Answer, run_flow
from sim.world import US_PER_MS, US_PER_S, World

DELETED = "i a deleted topic is gone for good"
DRAINED = "j a drained broker keeps none of its topics"
MERGED = "k policies are the merge of what was set"
OVERRIDES = "l a topic's overrides hold at its owner"

DRAINING = ("draining", "drained")
RETRY_US = US_PER_S
"""After the faults: a deletion or an activation that did not answer is asked again."""
TOPIC_POLICY_FIELDS = ("max_producers_per_topic", "max_subscriptions_per_topic")
"""Topic overrides the operator sets: high enough never to refuse the workload's clients."""
POLICY_FIELDS = (
    "max_subscriptions_per_topic",
    "max_consumers_per_topic",
    "max_consumers_per_subscription",
    "max_subscription_dispatch_rate",
)
"""Fields the operator changes: none of them limits the workload's producers."""

Local = Callable[[BrokerProcess], Flow[Any]]
"""The operation as the broker that answers it runs it (`me` is that broker)."""


class AdminChecker:
    """The invariants of the operator's answers (i, j, k), checked at each answer and at
    every commit of the simulated etcd."""

    def __init__(self, world: World, etcd: SimEtcd) -> None:
        self.world = world
        self.etcd = etcd
        self.violations: list[Violation] = []
        self.deleted: set[str] = set()
        self.asked: dict[str, Any] = {}
        """The policy changes under way: the namespace → changes."""
        self._policies: dict[str, Any] = {}
        """namespace policy key → its value in the store."""
        etcd.observers.append(self)

    def _violate(self, invariant: str, detail: str) -> None:
        self.world.log(f"VIOLATION {invariant}: {detail}")
        self.violations.append(Violation(invariant, detail, self.world.now))

    def committed(self, events: list[WatchEvent], origin: Origin | None) -> None:
        for event in events:
            if event.key.startswith("/topics/") and event.key.endswith("/policy"):
                by = "?" if origin is None else f"{origin.broker} {origin.kind}"
                self.world.log(f"stored {event.kind} {event.key} {event.value} by {by}")
            pair = keys.parse_assignment_key(event.key)
            if pair is not None and event.kind == "put" and pair[1] in self.deleted:
                self._violate(DELETED, f"{pair[1]} was assigned to {pair[0]} after its deletion")
            namespace = danube_keys.parse_namespace_policy(event.key)
            if namespace is None:
                continue
            before = self._policies.get(event.key)
            self._policies[event.key] = event.value if event.kind == "put" else None
            if origin is None or origin.kind != "policies" or event.kind != "put":
                continue
            changes = self.asked.get(namespace)
            wanted = None if changes is None else merged_policies(before, changes)
            # A write that changes nothing is an answered call's late copy: it compares the
            # revision its value was read at, so it lands only over that same value (seed 210
            # of `leases`, 5 brokers, 12 topics, admin 32: a call answered ok on its
            # read-back after a timeout; its copy landed under the next call's changes).
            if event.value != wanted and event.value != before:
                self._violate(
                    MERGED,
                    f"the policies of {namespace} were written {event.value} over {before}; "
                    f"asked {changes}",
                )

    def violate(self, invariant: str, detail: str) -> None:
        self._violate(invariant, detail)

    def overrides_answered(
        self, topic: str, changes: dict[str, int], answer: tuple[dict[str, int], list[str]]
    ) -> None:
        """The owner's answer says the changes are in force."""
        policies, overridden = answer
        wrong = {n: policies.get(n) for n, v in changes.items() if policies.get(n) != v}
        if wrong or not set(changes) <= set(overridden):
            self._violate(
                OVERRIDES,
                f"{topic}: asked {changes}, answered {policies} (overridden {overridden})",
            )

    def delete_answered(self, topic: str) -> None:
        self.deleted.add(topic)
        name = parse_topic(topic)
        left = [kv.key for kv in self.etcd.scan(danube_keys.topic_prefix(name))]
        for key in (danube_keys.namespace_topic(name), keys.unassigned_key(topic)):
            if self.etcd.get(key) is not None:
                left.append(key)
        for kv in self.etcd.scan(keys.BROKERS_PREFIX):
            pair = keys.parse_assignment_key(kv.key)
            if pair is not None and pair[1] == topic:
                left.append(kv.key)
        if left:
            self._violate(DELETED, f"the deletion of {topic} answered; still there: {left}")

    def drain_answered(self, broker: str, moved: Sequence[str]) -> None:
        """Unless the broker was activated meanwhile (it may take topics again)."""
        state = self.etcd.get(keys.state_key(broker))
        if keys.broker_mode(None if state is None else state.value) not in DRAINING:
            return
        kept = [
            topic
            for topic in moved
            if self.etcd.get(keys.assignment_key(broker, topic)) is not None
        ]
        if kept:
            self._violate(DRAINED, f"the drain of {broker} answered; it still owns {kept}")


class Operator:
    def __init__(
        self,
        world: World,
        nodes: Sequence[SimNode],
        checker: AdminChecker,
        topics: Sequence[str],
        *,
        operations: int,
        scratch: int,
        topic_policies: bool = False,
        dispatch_rate_floor: int = 1,
    ) -> None:
        """`topic_policies`: the brokers run data planes, so a topic's overrides can be set
        at its owner (`l`). `dispatch_rate_floor`: the lowest `max_subscription_dispatch_rate`
        it sets (the poison workload's consumers must drain their backlog before the run's
        settle limit, `sim.cluster_poison.dispatch_rate_floor`)."""
        self.world = world
        self.nodes = nodes
        self.checker = checker
        self.topics = list(topics)
        self.operations = operations
        self.scratch = [f"/default/scratch-{n}" for n in range(scratch)]
        self.drained: set[str] = set()
        """Brokers drained and not activated since."""
        self.deleting: set[str] = set()
        """Scratch topics whose deletion started and has not answered yet."""
        self.answers: dict[str, int] = {}
        """Operations answered, by kind and outcome (`unload ok`, `drain UNAVAILABLE`, ...)."""
        self._calm = False
        self._policy_busy = False
        self.topic_policies = topic_policies
        self._applied: dict[str, list[tuple[Local, dict[str, int]]]] = {}
        """Topic → the changes of its overrides its owners' cores took, in order, by call
        (a call whose caller gave up may still reach the core, late)."""
        self._answered: set[Local] = set()
        """The calls answered ok: their changes must be in force, unless a later one that
        reached a core changed the same field."""
        self._topic_busy: set[str] = set()
        self._writing: list[tuple[BrokerProcess, Any, int, str]] = []
        """Writes of overrides the calls' changes made: the broker, its interpreter, the
        metadata sequence number the change's write has, and the topic (`writing`)."""
        self.dispatch_rate_floor = dispatch_rate_floor

    # -- the schedule ------------------------------------------------------------------------------

    def start(self, end_us: int) -> None:
        rng = self.world.rng
        for topic in self.scratch:
            self.world.at(rng.randrange(end_us // 2 + 1), lambda t=topic: self._create(t))
        for _ in range(self.operations):
            self.world.at(end_us // 4 + rng.randrange(end_us * 3 // 5 + 1), self._operate)

    def calm(self) -> None:
        """The faults stopped: undo the drains and finish the deletions."""
        self._calm = True
        for broker in sorted(self.drained):
            self._activate(broker)
        for topic in sorted(self.deleting):
            self._delete(topic)

    def unsettled(self) -> list[str]:
        problems = [f"broker {b} is still drained by the operator" for b in sorted(self.drained)]
        problems += [f"the deletion of {t} has not answered" for t in sorted(self.deleting)]
        # A failed write of a topic's overrides is written again by its owner's tick
        # (`Catalogue.overrides_to_write_again`): the store holds them only once one lands,
        # so invariant l is checked once none is left to write (seed 27 at 3 % loss with
        # three replicas: the write failed 0.1 s before the end of a settle that ignored it).
        for node in self.nodes:
            process = node.running
            core = None if process is None or process.data is None else process.data.broker.core
            if core is not None and (unsaved := core.catalogue.overrides_unsaved()):
                problems.append(
                    f"broker {process.name} has overrides to write again: {sorted(unsaved)}"  # type: ignore[union-attr]
                )
        return problems + self.writing()

    def writing(self) -> list[str]:
        """The changes of overrides whose first write is still under way at a live broker:
        memory holds them, the store gets them (or the write fails, and the tick writes
        them again) once it ends, so invariant l waits for it (seed 73, replicated: the
        write queued behind one lost in a partition of etcd from the owner was sent 0.7 s
        before the faults stopped, and the run settled 0.1 s after with it in flight).
        A broker that died or restarted drops its writes: its next owner reads the store."""
        left = []
        for process, interpreter, target, topic in self._writing:
            data = process.data
            if (
                process.alive
                and data is not None
                and data.broker.interpreter is interpreter
                and not interpreter.closed
                and interpreter.metadata.durable < target
            ):
                left.append((process, interpreter, target, topic))
        self._writing = left
        return [f"broker {p.name} is writing the overrides of {t}" for p, _, _, t in left]

    def _create(self, topic: str) -> None:
        """As a broker creates a reliable topic (with or without data planes), once: a
        creation that landed late after the deletion would bring the topic back."""
        running = [node.running for node in self.nodes if node.running is not None]
        if not running:
            return
        process = self.world.rng.choice(running)
        compares, ops = creation([parse_topic(topic)], DispatchStrategy.RELIABLE)
        origin = Origin(process.name, "create")
        etcd = process.etcd
        process.call(f"create {topic}", lambda: etcd.txn(compares, ops, origin), _ignore)

    def _operate(self) -> None:
        rng = self.world.rng
        kinds = ("unload", "drain", "delete", "policy")
        kind = rng.choice((*kinds, "topic_policy") if self.topic_policies else kinds)
        if kind == "unload":
            self._unload(rng.choice(self.topics))
        elif kind == "drain":
            self._drain(rng.choice(self.nodes).name)
        elif kind == "delete":
            self._delete(rng.choice(self.scratch))
        elif kind == "topic_policy":
            topic = rng.choice(self.topics)
            if topic not in self._topic_busy:
                fields = rng.sample(TOPIC_POLICY_FIELDS, rng.randint(1, 2))
                self._topic_policy(topic, {name: rng.randint(50, 1_000) for name in fields})
        elif not self._policy_busy:
            fields = rng.sample(POLICY_FIELDS, rng.randint(1, 2))
            changes = {name: rng.randint(1, 1_000) for name in fields}
            rate = changes.get("max_subscription_dispatch_rate")
            if rate is not None:  # drawn as always, so runs without a floor keep their schedule
                changes["max_subscription_dispatch_rate"] = max(rate, self.dispatch_rate_floor)
            self._policies(changes)

    # -- the operations --------------------------------------------------------------------------

    def _unload(self, topic: str) -> None:
        def local(p: BrokerProcess) -> Flow[None]:
            return flows.unload_topic(p.name, topic, p.now_ms)

        self._ask("unload", local, lambda _: None)

    def _drain(self, broker: str) -> None:
        if broker in self.drained:
            return

        def local(p: BrokerProcess) -> Flow[tuple[list[str], list[str]]]:
            self.drained.add(broker)  # marked draining, perhaps: activated after the faults
            plan = yield from flows.plan_drain(p.name, broker, (), (), dry_run=False)
            moved, failed = [], []
            for topic in plan.topics:
                done = yield from flows.drain_topic(p.name, broker, topic, p.now_ms)
                (moved if done else failed).append(topic)
            return moved, failed

        def answered(value: tuple[list[str], list[str]]) -> None:
            self.checker.drain_answered(broker, value[0])
            self.world.at(
                self.world.rng.randint(US_PER_S, 4 * US_PER_S), lambda: self._activate(broker)
            )

        def refused(_: BaseException) -> bool:
            # A drain that reached the leader only after the faults stopped (slow requests)
            # marked the broker after `calm` activated the drained ones: activate it now.
            if self._calm and broker in self.drained:
                self._activate(broker)
            return True

        self._ask("drain", local, answered, final=refused)

    def _activate(self, broker: str) -> None:
        def local(p: BrokerProcess) -> Flow[None]:
            return flows.activate(p.name, broker, "")

        def answered(_: Any) -> None:
            self.drained.discard(broker)

        def refused(error: BaseException) -> bool:
            gone = any(node.lost for node in self.nodes if node.name == broker)
            if gone and isinstance(error, DanubeError) and error.code is ErrorCode.NOT_FOUND:
                self.drained.discard(broker)  # dead for good: nothing to activate
                return True
            return False

        self._ask("activate", local, answered, retry=lambda: self._activate(broker), final=refused)

    def _delete(self, topic: str) -> None:
        def local(p: BrokerProcess) -> Flow[list[str]]:
            self.deleting.add(topic)
            return (yield from flows.delete_topic(p.name, topic, p.now_ms))

        def answered(_: Any) -> None:
            self.deleting.discard(topic)
            self.checker.delete_answered(topic)

        def refused(error: BaseException) -> bool:
            if isinstance(error, DanubeError) and error.code is ErrorCode.NOT_FOUND:
                self.deleting.discard(topic)  # never created, or deleted already
                return True
            return False

        self._ask("delete", local, answered, retry=lambda: self._delete(topic), final=refused)

    def _policies(self, changes: dict[str, int]) -> None:
        self._policy_busy = True
        self.checker.asked["default"] = changes

        def local(p: BrokerProcess) -> Flow[dict[str, int]]:
            return flows.namespace_policies("default", changes, clustered=True)

        def ended(_: Any = None) -> None:
            self._policy_busy = False

        self._ask("policy", local, ended, final=lambda _: ended() or True, direct=True)

    def _topic_policy(self, topic: str, changes: dict[str, int]) -> None:
        """SetTopicPolicies, asked of any broker: it runs the change where it serves the
        topic, else forwards it to the owner the store names (`flows.at_owner`)."""
        self._topic_busy.add(topic)

        def local(p: BrokerProcess) -> Flow[Any]:
            return flows.topic_policies(p.name, topic, changes)

        def answered(value: tuple[dict[str, int], list[str]]) -> None:
            self._topic_busy.discard(topic)
            self._answered.add(local)
            self.checker.overrides_answered(topic, changes, value)

        def refused(_: BaseException) -> bool:
            # Whether the change reached a core shows in `_applied` (`_at_core`).
            self._topic_busy.discard(topic)
            return True

        self.world.log(f"operator sets the overrides of {topic}: {changes}")
        self._ask("topic_policy", local, answered, final=refused, direct=True)

    def allowed_overrides(self, topic: str) -> dict[str, set[int]]:
        """Field → the values that may be in force: the last answered change of the field,
        or a change that reached a core after it (one answered UNAVAILABLE may be in force:
        its caller must not count on either outcome). Fields no answered change set are not
        checked."""
        allowed: dict[str, set[int]] = {}
        for call, changes in self._applied.get(topic, ()):
            for name, value in changes.items():
                if call in self._answered:
                    allowed[name] = {value}
                elif name in allowed:
                    allowed[name].add(value)
        return allowed

    def check_overrides(self) -> None:
        """After the cluster settled: at the broker serving each topic, the overrides in
        force are the answered ones (`allowed_overrides`), and are what the store holds, so
        the topic's next owner enforces them too (`l`)."""
        for topic in sorted(self._applied):
            allowed = self.allowed_overrides(topic)
            stored = self.checker.etcd.get(danube_keys.topic_policy(parse_topic(topic)))
            in_store = {} if stored is None else stored.value
            serving = [
                node.running
                for node in self.nodes
                if node.running is not None
                and node.running.data is not None
                and node.running.data.broker.core is not None
                and node.running.data.broker.core.serves(topic)
            ]
            for process in serving:
                core = process.data.broker.core  # type: ignore[union-attr]
                policies, overridden = core.topic_policies(topic)
                wrong = {
                    name: policies.get(name)
                    for name, values in allowed.items()
                    if name not in overridden or policies.get(name) not in values
                }
                if wrong:
                    self.checker.violate(
                        OVERRIDES,
                        f"{topic} at broker {process.name}: overrides {wrong}, answered "
                        f"{allowed} (overridden {sorted(overridden)})",
                    )
                if core.topic_overrides(topic) != in_store:
                    self.checker.violate(
                        OVERRIDES,
                        f"{topic} at broker {process.name}: overrides "
                        f"{core.topic_overrides(topic)} in force, {in_store} in the store",
                    )

    # -- running a call ----------------------------------------------------------------------------

    def _ask(
        self,
        kind: str,
        local: Local,
        answered: Callable[[Any], None],
        *,
        retry: Callable[[], None] | None = None,
        final: Callable[[BaseException], bool] | None = None,
        direct: bool = False,
    ) -> None:
        """Asks a random running broker; it forwards the leader's operations to the broker
        it believes leads (`direct`: any broker answers). Without an answer (the broker
        died) nothing more happens, as for a client whose call was cut; after the faults a
        `retry` asks again."""
        running = [node.running for node in self.nodes if node.running is not None]
        if not running:
            if retry is not None and self._calm:
                self.world.at(RETRY_US, retry)
            return
        process = self.world.rng.choice(running)
        self.world.log(f"operator asks broker {process.name}: {kind}")

        def done(end: Finished) -> None:
            outcome = "ok" if end.error is None else _code(end.error)
            self.answers[f"{kind} {outcome}"] = self.answers.get(f"{kind} {outcome}", 0) + 1
            self.world.log(f"operator {kind} answered: {outcome} {end.error or ''}")
            if end.error is None:
                answered(end.value)
                return
            if _code(end.error) == "bug":
                raise end.error
            if final is not None and final(end.error):
                return
            if retry is not None and self._calm:
                self.world.at(RETRY_US, retry)

        flow = local(process) if direct else flows.at_leader(process.name, lambda: local(process))
        run_flow(process, flow, self._handler(process, local), done)

    def _handler(self, process: BrokerProcess, local: Local) -> Callable[[Any, Answer], None]:
        def handle(request: Any, answer: Answer) -> None:
            if not process.alive:
                return  # the call dies with the broker
            if isinstance(request, flows.ReadView):
                m = process.membership
                leader = m.config.broker_id if m.leading else m.leader
                answer(flows.Seen(leader, process.manager))
            elif isinstance(request, Sleep):
                self.world.at(request.ms * US_PER_MS, lambda: _if_alive(process, answer))
            elif isinstance(request, flows.Forward):
                self._forwarded(request.admin_url, local, answer)
            elif isinstance(request, flows.DeleteObjects | flows.NamespaceSeen):
                answer(None)
            elif isinstance(request, flows.ServedHere):
                core = None if process.data is None else process.data.broker.core
                answer(core is not None and core.serves(request.topic))
            elif isinstance(request, flows.TopicPolicies):
                self._at_core(process, request, local, answer)
            else:
                answer(error=TypeError(f"unexpected admin request {request!r}"))

        return handle

    def _at_core(
        self, process: BrokerProcess, request: flows.TopicPolicies, call: Local, answer: Answer
    ) -> None:
        """The owner's core sets the overrides; answered once the change is stored, as
        `AdminServices._topic_policies` waits for its runtime."""
        assert process.data is not None and not request.clear and not request.read_only
        broker = process.data.broker
        core = broker.core
        if core is None:
            return  # the incarnation is gone: the call dies with it
        try:
            step = core.set_topic_policies(request.topic, request.changes)
        except DanubeError as error:
            answer(error=error)
            return
        self._applied.setdefault(request.topic, []).append((call, dict(request.changes)))
        interpreter = broker.interpreter
        assert interpreter is not None
        first = interpreter.metadata.submitted + 1
        target = interpreter.apply(step.effects)
        self._writing.append((process, interpreter, target, request.topic))

        def stored() -> None:
            if not process.alive or broker.core is not core:
                return
            try:  # the topic may have moved away (or gone) while the change was stored
                overrides = core.topic_policies(request.topic)[1]
            except DanubeError as error:
                answer(error=error)
                return
            answer((step.value, list(overrides)))

        def failed(error: DanubeError) -> None:
            answer(error=error)

        # As the runtime's reply: once the change is durable, an error when it is not
        # (a write that failed or whose answer was lost must not be answered ok). The core
        # writes a failed one again itself (`Catalogue.metadata_written`).
        interpreter.settle(first, target, step.effects, _Settled(stored, failed))

    def _forwarded(self, admin_url: str, local: Local, answer: Answer) -> None:
        """The leader answers a forwarded call itself, never forwarding it again."""
        target = next((n.running for n in self.nodes if f"broker-{n.name}:" in admin_url), None)
        if target is None:
            answer(error=flows.unavailable(f"{admin_url} does not answer"))
            return

        def done(end: Finished) -> None:
            if end.error is not None:
                answer(error=end.error)
            else:
                answer(end.value)

        run_flow(target, local(target), self._handler(target, local), done)


def _code(error: BaseException) -> str:
    """The status the admin services would answer with; "bug" for anything else."""
    if isinstance(error, StoreUnreachable):
        return "UNAVAILABLE"
    if isinstance(error, DanubeError):
        return error.code.name
    return "bug"


def _ignore(_: Any) -> None:
    """The creation's outcome shows in the store (a deletion of a topic never created
    answers NOT_FOUND)."""


def _if_alive(process: BrokerProcess, answer: Answer) -> None:
    if process.alive:
        answer(None)


class _Settled:
    """The waiter of `Interpreter.settle` for a call answered here."""

    __slots__ = ("failed", "stored")

    def __init__(self, stored: Callable[[], None], failed: Callable[[DanubeError], None]) -> None:
        self.stored = stored
        self.failed = failed

    def ok(self) -> None:
        self.stored()

    def fail(self, error: DanubeError) -> None:
        self.failed(error)
