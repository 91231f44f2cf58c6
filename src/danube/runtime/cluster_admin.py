"""The admin operations that need the cluster (spec/cluster.md, "Administration"), for the
admin gRPC services (`danube.runtime.admin`) to delegate to in cluster mode.

Reads (brokers, a broker's topics, owners) are answered by any broker, from the store or its
own load manager's view, which every broker keeps current. Everything else is the leader's:
its writes compare the leader key, and the balance is the leader's view. A follower forwards
those calls to the leader's admin port (registered as `admin_addr`, `danube.runtime.forwarding`),
so a CLI needs one endpoint; a call forwarded once is never forwarded again, so two brokers
that each believe the other leads answer UNAVAILABLE at once.

A broker's drain runs in the cluster member's nursery, not the call's: it goes on after the
answer (whose deadline may end the call first) until every topic moved or failed.

Methods are called from grpclib handlers (asyncio); the work runs in trio, where the store
and the load manager live. The operations are the flows of `danube.machines.requests.admin` (the
simulator's operator runs the same ones); this module translates requests into flows and
their ends into replies, and answers the flows' admin requests.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio
import trio_asyncio

import danube.proto_compat  # noqa: F401  (ClusterBalanceResponse decodes)
from danube import keys
from danube.effects import Sleep, StoreUnreachable
from danube.effects.flow import Flow, answered, drive
from danube.machines.cluster import records
from danube.machines.cluster.load_manager import LoadManager
from danube.machines.cluster.ranking import Strategy
from danube.machines.requests import admin as flows
from danube.metadata import KeyValue, MetadataError, MetadataStore
from danube.proto import danube_admin as pb
from danube.runtime.cluster_member import ClusterMember
from danube.runtime.forwarding import forward
from danube.runtime.object_store import delete_topic_objects
from danube.runtime.store_port import STORE_EFFECTS, perform_store
from danube.runtime.watching import REQUEST_TIMEOUT_S, failure_text
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.values.names import TopicName, parse_topic

log = logging.getLogger("danube.runtime")

T = TypeVar("T")

DEFAULT_UNLOAD_TIMEOUT_S = 60
MOVE_WAIT_S = flows.MOVE_WAIT_MS / 1000
"""How long UnloadTopic and DeleteTopic wait for the topic to leave its broker before they
answer UNAVAILABLE ("under way"); `danube-admin` gives those calls a longer deadline
(`danube.cli.admin_topics.SERVER_MOVE_WAIT_S`)."""
FORWARD_TIMEOUT_S = 120.0
"""A forwarded leader call: longer than any wait of the leader's but UnloadBroker's, which is
the caller's `timeout_seconds` (`_forward_timeout`)."""
FORWARD_MARGIN_S = 30.0

_PATHS = {
    "unload_broker": ("/danube_admin.BrokerAdmin/UnloadBroker", pb.UnloadBrokerResponse),
    "activate_broker": ("/danube_admin.BrokerAdmin/ActivateBroker", pb.ActivateBrokerResponse),
    "get_cluster_balance": (
        "/danube_admin.BrokerAdmin/GetClusterBalance",
        pb.ClusterBalanceResponse,
    ),
    "trigger_rebalance": ("/danube_admin.BrokerAdmin/TriggerRebalance", pb.RebalanceResponse),
    "unload_topic": ("/danube_admin.TopicAdmin/UnloadTopic", pb.TopicResponse),
    "delete_topic": ("/danube_admin.TopicAdmin/DeleteTopic", pb.TopicResponse),
}

_STRATEGIES = {
    Strategy.FAIR: "Fair",
    Strategy.BALANCED: "Balanced",
    Strategy.WEIGHTED_LOAD: "WeightedLoad",
}


def _u64(broker_id: str) -> int:
    """Broker ids are u64 on the wire of GetClusterBalance and TriggerRebalance."""
    return int(broker_id) if broker_id.isascii() and broker_id.isdigit() else 0


def _topic(name: str) -> TopicName:
    if not name:
        raise invalid("a topic name is required (/namespace/topic)")
    return parse_topic(name)


def _broker_id(broker_id: str) -> str:
    if not broker_id:
        raise invalid("a broker id is required (see `danube-admin brokers list`)")
    if "/" in broker_id:
        raise invalid(f"invalid broker id {quoted(broker_id)}")
    return broker_id


class ClusterAdminOps:
    def __init__(self, store: MetadataStore, member: ClusterMember) -> None:
        self._store = store
        self._member = member
        self._me = member.broker_id
        self._drains: dict[str, _Drain] = {}
        """Drains running on this leader, by broker: a repeated UnloadBroker (a client that
        retried after its deadline) waits on the one under way instead of starting another."""

    @property
    def _view(self) -> LoadManager:
        return self._member.load_manager.machine

    # -- BrokerAdmin ----------------------------------------------------------------------------

    async def list_brokers(self, request: pb.Empty) -> pb.BrokerListResponse:
        return await self._trio(self._list_brokers)

    async def get_leader_broker(self, request: pb.Empty) -> pb.BrokerResponse:
        return pb.BrokerResponse(leader=self._member.leader() or "")

    async def unload_broker(self, request: pb.UnloadBrokerRequest) -> pb.UnloadBrokerResponse:
        _broker_id(request.broker_id)
        return await self._leader("unload_broker", request, self._unload_broker)

    async def activate_broker(self, request: pb.ActivateBrokerRequest) -> pb.ActivateBrokerResponse:
        _broker_id(request.broker_id)
        return await self._leader("activate_broker", request, self._activate_broker)

    async def get_cluster_balance(
        self, request: pb.ClusterBalanceRequest
    ) -> pb.ClusterBalanceResponse:
        return await self._leader(
            "get_cluster_balance", request, lambda r: answered(self._balance(r))
        )

    async def trigger_rebalance(self, request: pb.RebalanceRequest) -> pb.RebalanceResponse:
        if self._view.config.rebalancing is None:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                "rebalancing needs a load_manager.rebalancing section in the configuration",
            )
        if request.max_moves is not None and request.max_moves < 1:
            raise invalid(f"max_moves must be at least 1, got {request.max_moves}")
        return await self._leader(
            "trigger_rebalance", request, lambda r: answered(self._rebalance(r))
        )

    # -- TopicAdmin -----------------------------------------------------------------------------

    async def unload_topic(self, request: pb.TopicRequest) -> pb.TopicResponse:
        _topic(request.name)
        return await self._leader("unload_topic", request, self._unload_topic)

    async def delete_topic(self, request: pb.TopicRequest) -> pb.TopicResponse:
        name = _topic(request.name)
        partition = name.partition_of
        if partition is not None:
            raise invalid(
                f"{name.full} is a partition of {partition[0]}: delete the partitioned topic "
                f"by its base name {partition[0]}"
            )
        return await self._leader("delete_topic", request, self._delete_topic)

    async def list_broker_topics(self, request: pb.BrokerRequest) -> pb.TopicInfoListResponse:
        broker = _broker_id(request.broker_id)
        return await self._trio(self._broker_topics, broker)

    async def topic_owners(self, topics: list[str]) -> dict[str, str]:
        """topic → the broker it is assigned to, "" while unassigned (this broker's view)."""
        owners = {}
        for topic in topics:
            owner = self._view.owner(topic)
            owners[topic] = "" if owner is None else owner[0]
        return owners

    def replication_defaults(self) -> tuple[int | None, int]:
        """(`cluster.replication_factor`, active brokers) as this broker's view has them: what
        a factor in force is made of besides the policy records (GetReplicationFactor)."""
        return self._view.config.replication_factor, len(self._view.active())

    # -- driving the flows (`danube.machines.requests.admin`) --------------------------------------

    async def _trio(self, work: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Runs `work` in trio; a store that does not answer is UNAVAILABLE."""
        try:
            result: T = await trio_asyncio.trio_as_aio(work)(*args)
        except (MetadataError, trio.TooSlowError, StoreUnreachable) as error:
            raise DanubeError(
                ErrorCode.UNAVAILABLE, f"the metadata store did not answer ({failure_text(error)})"
            ) from None
        return result

    async def _run(self, flow: Flow[T]) -> T:
        """Drives an admin flow in trio: store effects against the store, admin requests
        answered here."""

        async def perform(request: Any) -> Any:
            if isinstance(request, STORE_EFFECTS):
                return await perform_store(self._store, request)
            if isinstance(request, Sleep):
                await trio.sleep(request.ms / 1000)
                return None
            if isinstance(request, flows.ReadView):
                return flows.Seen(self._member.leader(), self._view)
            if isinstance(request, flows.DeleteObjects):
                log.info("event=topic_deleted topic=%s", request.topic)
                try:
                    self._member.spawn(self._delete_objects, request.topic)
                except RuntimeError:  # stopping: the deletion happened, its objects stay
                    log.warning("event=objects_not_deleted topic=%s error=stopping", request.topic)
                return None
            if isinstance(request, _AwaitDrain):
                return await self._await_drain(request)
            raise TypeError(f"unexpected request of an admin flow: {request!r}")

        return await drive(flow, perform)

    async def _leader(self, method: str, request: Any, work: Callable[[Any], Flow[T]]) -> T:
        """Runs `work` here if this broker leads, else forwards the call to the leader
        (`danube.machines.requests.admin.at_leader`). The routing runs where grpclib does (asyncio),
        the work in trio."""
        path, reply_type = _PATHS[method]

        async def perform(asked: Any) -> Any:
            if isinstance(asked, flows.ReadView):
                return flows.Seen(self._member.leader(), self._view)
            if isinstance(asked, STORE_EFFECTS):
                return await self._trio(perform_store, self._store, asked)
            if isinstance(asked, flows.Forward):
                timeout = _forward_timeout(request)
                return await forward(asked.admin_url, path, request, reply_type, timeout=timeout)
            if isinstance(asked, flows.RunHere):
                return await self._trio(self._run, work(request))
            raise TypeError(f"unexpected request of a routing flow: {asked!r}")

        answer: T = await drive(flows.at_leader(self._me, flows.run_here), perform)
        return answer

    async def _get(self, key: str) -> KeyValue | None:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            return await self._store.get(key)

    async def _scan(self, prefix: str) -> list[KeyValue]:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            return await self._store.scan(prefix)

    def _now(self) -> int:
        return int(trio.current_time() * 1000)

    async def _list_brokers(self) -> pb.BrokerListResponse:
        """Any broker: from the store."""
        registrations = await self._scan(keys.REGISTER_PREFIX)
        leader = self._member.leader()
        brokers = []
        for kv in registrations:
            broker = keys.parse_register_key(kv.key)
            if broker is None:
                continue
            value = kv.value if isinstance(kv.value, dict) else {}
            state = await self._get(keys.state_key(broker))
            mode = records.broker_mode(state.value if state is not None else None)
            brokers.append(
                pb.BrokerInfo(
                    broker_id=broker,
                    broker_addr=str(value.get("broker_url", "")),
                    broker_role="Cluster_Leader" if broker == leader else "Cluster_Follower",
                    admin_addr=str(value.get("admin_addr", "")),
                    metrics_addr=str(value.get("metrics_addr", "")),
                    broker_status=mode or records.ACTIVE,
                )
            )
        return pb.BrokerListResponse(brokers=brokers)

    async def _broker_topics(self, broker: str) -> pb.TopicInfoListResponse:
        """Any broker: from the store."""
        assigned = await self._scan(f"{keys.BROKERS_PREFIX}{broker}/")
        topics = sorted(
            pair[1] for kv in assigned if (pair := keys.parse_assignment_key(kv.key)) is not None
        )
        if not topics and await self._get(keys.register_key(broker)) is None:
            raise not_found(f"no broker {broker} is registered (see `danube-admin brokers list`)")
        infos = []
        for topic in topics:
            delivery = await self._get(keys.topic_delivery(parse_topic(topic)))
            label = delivery.value if delivery is not None else ""
            infos.append(pb.TopicInfo(name=topic, broker_id=broker, delivery=str(label)))
        return pb.TopicInfoListResponse(topics=infos)

    def _unload_broker(self, request: pb.UnloadBrokerRequest) -> Flow[pb.UnloadBrokerResponse]:
        """The plan is the flow's; the drain runs in the member's nursery (`_drain`) and the
        answer counts what moved by `timeout_seconds`."""
        broker = request.broker_id
        dry_run = request.dry_run or broker in self._drains
        plan = yield from flows.plan_drain(
            self._me,
            broker,
            request.namespaces_include,
            request.namespaces_exclude,
            dry_run=dry_run,
        )
        if request.dry_run:
            total = len(plan.topics)
            return pb.UnloadBrokerResponse(started=False, total=total, pending=total)
        return (yield _AwaitDrain(plan, max(request.max_parallel, 1), request))

    async def _await_drain(self, wait: _AwaitDrain) -> pb.UnloadBrokerResponse:
        broker = wait.plan.broker
        drain = self._drains.get(broker)  # a drain leaves the map as it finishes
        if drain is None:
            drain = self._start_drain(broker, wait.plan.topics, wait.parallel)
        with trio.move_on_after(wait.request.timeout_seconds or DEFAULT_UNLOAD_TIMEOUT_S):
            await drain.done.wait()
        return pb.UnloadBrokerResponse(
            started=True,
            total=drain.total,
            succeeded=len(drain.succeeded),
            failed=len(drain.failed),
            pending=drain.total - len(drain.succeeded) - len(drain.failed),
            failed_topics=sorted(drain.failed),
        )

    def _start_drain(self, broker: str, topics: list[str], parallel: int) -> _Drain:
        drain = _Drain(len(topics))
        log.info("event=broker_unload broker=%s topics=%d", broker, len(topics))
        try:
            self._member.spawn(self._drain, drain, broker, topics, parallel)
        except RuntimeError:  # the member's nursery closed: the broker is stopping
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"this broker is stopping; {broker} is marked draining and the next leader "
                "will not move its topics: run the unload again, or activate it",
            ) from None
        self._drains[broker] = drain
        return drain

    async def _drain(self, drain: _Drain, broker: str, topics: list[str], parallel: int) -> None:
        """In the member's nursery: every topic moves, `parallel` at a time, whether or not
        anyone still waits for the answer. No failure of one topic may end the member."""
        limiter = trio.CapacityLimiter(parallel)
        try:
            async with trio.open_nursery() as nursery:
                for topic in topics:
                    nursery.start_soon(self._unload_one, limiter, broker, topic, drain)
            log.info(
                "event=broker_unload_done broker=%s succeeded=%d failed=%d",
                broker, len(drain.succeeded), len(drain.failed),
            )  # fmt: skip
        finally:
            drain.done.set()
            if self._drains.get(broker) is drain:
                del self._drains[broker]

    async def _unload_one(
        self, limiter: trio.CapacityLimiter, broker: str, topic: str, drain: _Drain
    ) -> None:
        async with limiter:
            try:
                moved = await self._run(flows.drain_topic(self._me, broker, topic, self._now))
            except Exception as error:  # the store, or a bug: the topic failed, the member lives
                log.warning(
                    "event=broker_unload_failed topic=%s error=%s", topic, failure_text(error)
                )
                drain.failed.append(topic)
                return
            (drain.succeeded if moved else drain.failed).append(topic)

    def _activate_broker(
        self, request: pb.ActivateBrokerRequest
    ) -> Flow[pb.ActivateBrokerResponse]:
        yield from flows.activate(self._me, request.broker_id, request.reason)
        return pb.ActivateBrokerResponse(success=True)

    def _balance(self, request: pb.ClusterBalanceRequest) -> pb.ClusterBalanceResponse:
        view = self._view
        stats = view.balance()
        brokers = [
            pb.BrokerLoadInfo(
                broker_id=_u64(broker),
                load=float(score),
                topic_count=len(view.assignments(broker)),
                is_overloaded=broker in stats.overloaded,
                is_underloaded=broker in stats.underloaded,
            )
            for broker, score in view.rankings()
        ]
        return pb.ClusterBalanceResponse(
            coefficient_of_variation=stats.coefficient_of_variation,
            mean_load=stats.mean,
            max_load=stats.max_load,
            min_load=stats.min_load,
            std_deviation=stats.std_deviation,
            broker_count=len(brokers),
            brokers=brokers,
            assignment_strategy=_STRATEGIES[view.config.assignment_strategy],
        )

    def _rebalance(self, request: pb.RebalanceRequest) -> pb.RebalanceResponse:
        view = self._view
        proposal = view.propose_move(int(trio.current_time() * 1e9))
        if proposal is None:
            cfg = view.config.rebalancing
            assert cfg is not None
            stats = view.balance()
            if stats.coefficient_of_variation < cfg.aggressiveness.threshold:
                message = (
                    f"Cluster is balanced (coefficient of variation "
                    f"{stats.coefficient_of_variation:.2f} below "
                    f"{cfg.aggressiveness.threshold:.2f}); nothing to move"
                )
            else:
                message = (
                    "no topic may move now (blacklisted, or younger than "
                    f"min_topic_age_seconds = {cfg.min_topic_age_seconds})"
                )
            return pb.RebalanceResponse(success=True, error_message=message)
        move = pb.ProposedMove(
            topic_name=proposal.topic,
            from_broker=_u64(proposal.from_broker),
            to_broker=_u64(proposal.to_broker),
            estimated_load=proposal.estimated_load,
            reason="ManualRebalance",
        )
        if request.dry_run:
            return pb.RebalanceResponse(success=True, proposed_moves=[move])
        self._member.trigger_rebalance(request.max_moves)
        return pb.RebalanceResponse(success=True, moves_executed=1, proposed_moves=[move])

    def _unload_topic(self, request: pb.TopicRequest) -> Flow[pb.TopicResponse]:
        yield from flows.unload_topic(self._me, request.name, self._now)
        return pb.TopicResponse(success=True)

    def _delete_topic(self, request: pb.TopicRequest) -> Flow[pb.TopicResponse]:
        yield from flows.delete_topic(self._me, request.name, self._now)
        return pb.TopicResponse(success=True)

    async def _delete_objects(self, topic: str) -> None:
        """After the metadata went, in the member's nursery: neither the call's deadline nor
        its wait cuts it short. A store failure leaves objects no index names, which the log
        reports; the deletion still succeeded."""
        objects = self._member.runtime.objects
        if objects is not None:
            await delete_topic_objects(objects, topic)


def _forward_timeout(request: Any) -> float:
    """Long enough for the leader's own wait, so its answer (an unload's counts) comes back."""
    if isinstance(request, pb.UnloadBrokerRequest):
        waits = request.timeout_seconds or DEFAULT_UNLOAD_TIMEOUT_S
        return max(FORWARD_TIMEOUT_S, waits + FORWARD_MARGIN_S)
    return FORWARD_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class _AwaitDrain:
    """UnloadBroker's own request: start the planned drain (unless one of the broker runs
    already) and answer with its counts once it ended or the caller's wait did."""

    plan: flows.DrainPlan
    parallel: int
    request: pb.UnloadBrokerRequest


@dataclass(slots=True)
class _Drain:
    """A broker's drain as it goes: the answer counts the topics not done yet as pending."""

    total: int
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
