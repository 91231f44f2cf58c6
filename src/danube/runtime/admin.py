"""Danube's admin API (package `danube_admin`: BrokerAdmin, NamespaceAdmin, TopicAdmin) and
our PolicyAdmin (`danube_ext`). The decisions are the core's (`danube.machines.node.core`,
`danube.machines.node.settings`) or, in cluster mode, the cluster's (`ClusterOps`); these handlers
translate. ClusterAdmin (Raft membership) and SecurityAdmin answer UNIMPLEMENTED.

Unlike Danube, which answers NOT_FOUND for most admin failures, each error keeps its own
code (spec/protocol.md "Admin API"). In cluster mode a question about a topic another
broker serves goes to that broker's admin port, so any broker answers for the cluster.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol, TypeVar

import grpclib.const

from danube import keys
from danube.effects import StoreUnreachable
from danube.effects.flow import Flow, drive
from danube.machines.cluster import policies, replicas
from danube.machines.dispatch.reliable import Backoff
from danube.machines.node.settings import (
    BACKOFF_WIRE,
    PoisonPolicy,
    SubscriptionFailureSettings,
)
from danube.machines.requests import admin as flows
from danube.machines.schema.policy import TopicSchemaConfig, ValidationPolicy
from danube.metadata import MetadataStore
from danube.proto import danube_admin as pb
from danube.proto import danube_ext as ext_pb
from danube.runtime.broker import BrokerRuntime, now_ms
from danube.runtime.forwarding import forward
from danube.runtime.grpc_util import Call, unary
from danube.runtime.placement import ClusterPlacement
from danube.runtime.schema_service import SchemaService
from danube.runtime.store_port import STORE_EFFECTS, perform_store
from danube.runtime.watching import store_call_from_grpc
from danube.values import bounded_json
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.values.names import parse_topic

POLICY_RACE_ATTEMPTS = flows.POLICY_RACE_ATTEMPTS

T = TypeVar("T")


class ClusterOps(Protocol):
    """What the admin services need of cluster mode (`danube.runtime.cluster_admin`)."""

    async def list_brokers(self, request: pb.Empty) -> pb.BrokerListResponse: ...

    async def get_leader_broker(self, request: pb.Empty) -> pb.BrokerResponse: ...

    async def unload_broker(self, request: pb.UnloadBrokerRequest) -> pb.UnloadBrokerResponse: ...

    async def activate_broker(
        self, request: pb.ActivateBrokerRequest
    ) -> pb.ActivateBrokerResponse: ...

    async def get_cluster_balance(
        self, request: pb.ClusterBalanceRequest
    ) -> pb.ClusterBalanceResponse: ...

    async def trigger_rebalance(self, request: pb.RebalanceRequest) -> pb.RebalanceResponse: ...

    async def unload_topic(self, request: pb.TopicRequest) -> pb.TopicResponse: ...

    async def list_broker_topics(self, request: pb.BrokerRequest) -> pb.TopicInfoListResponse: ...

    async def topic_owners(self, topics: list[str]) -> dict[str, str]: ...

    async def delete_topic(self, request: pb.TopicRequest) -> pb.TopicResponse: ...

    def replication_defaults(self) -> tuple[int | None, int]: ...


def _strategy(value: int) -> DispatchStrategy:
    if int(value) not in (0, 1):
        raise invalid(f"unknown dispatch strategy {int(value)}; expected 0 (non-reliable) or 1")
    return DispatchStrategy(int(value))


def _policies_json(text: str) -> dict[str, Any]:
    value = bounded_json.loads(text, "policies")
    if not isinstance(value, dict):
        raise invalid('policies must be a JSON object, e.g. {"max_producers_per_topic": 2}')
    return value


def _failure_settings(wire: pb.SubscriptionFailurePolicy) -> SubscriptionFailureSettings:
    if not 0 <= int(wire.backoff_strategy) < len(BACKOFF_WIRE):
        raise invalid(f"unknown backoff strategy {int(wire.backoff_strategy)}")
    try:
        poison = PoisonPolicy(int(wire.poison_policy))
    except ValueError:
        raise invalid(f"unknown poison policy {int(wire.poison_policy)}") from None
    return SubscriptionFailureSettings(
        max_redelivery_count=wire.max_redelivery_count,
        ack_timeout_ms=wire.ack_timeout_ms,
        base_redelivery_delay_ms=wire.base_redelivery_delay_ms,
        max_redelivery_delay_ms=wire.max_redelivery_delay_ms,
        backoff=BACKOFF_WIRE[int(wire.backoff_strategy)],
        dead_letter_topic=wire.dead_letter_topic or None,
        poison_policy=poison,
    )


def _failure_wire(settings: SubscriptionFailureSettings) -> pb.SubscriptionFailurePolicy:
    return pb.SubscriptionFailurePolicy(
        max_redelivery_count=settings.max_redelivery_count,
        ack_timeout_ms=settings.ack_timeout_ms,
        base_redelivery_delay_ms=settings.base_redelivery_delay_ms,
        max_redelivery_delay_ms=settings.max_redelivery_delay_ms,
        backoff_strategy=pb.SubscriptionBackoffStrategy(
            0 if settings.backoff is Backoff.FIXED else 1
        ),
        dead_letter_topic=settings.dead_letter_topic,
        poison_policy=pb.SubscriptionPoisonPolicy(int(settings.poison_policy)),
    )


class AdminServices:
    """BrokerAdmin, NamespaceAdmin, TopicAdmin and PolicyAdmin on the admin port."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        broker_id: str,
        admin_url: str,
        schemas: SchemaService,
        *,
        metrics_url: str = "",
        cluster: ClusterOps | None = None,
        placement: ClusterPlacement | None = None,
        store: MetadataStore | None = None,
    ) -> None:
        """Cluster mode passes `cluster`, `placement` and `store`: topics this broker does
        not serve are known from the store."""
        self._runtime = runtime
        self._core = runtime.core
        self._broker_id = broker_id
        self._admin_url = admin_url
        self._metrics_url = metrics_url
        self._schemas = schemas
        self._cluster = cluster
        self._placement = placement
        self._store = store

    # -- helpers ----------------------------------------------------------------------------

    def _topic(self, name: str) -> str:
        """A topic name as given, checked (bad names are INVALID_ARGUMENT, not NOT_FOUND)."""
        parse_topic(name)
        return name

    def _served_here(self, topic: str) -> bool:
        """This broker answers for `topic` itself: standalone, or its core serves it (where
        else to ask is `flows.at_owner`'s decision, from the store)."""
        return self._placement is None or self._core.serves(self._topic(topic))

    # -- BrokerAdmin ------------------------------------------------------------------------

    async def list_brokers(self, request: pb.Empty) -> pb.BrokerListResponse:
        if self._cluster is not None:
            return await self._cluster.list_brokers(request)
        broker = pb.BrokerInfo(
            broker_id=self._broker_id,
            broker_addr=self._core.identity.broker_url,
            broker_role="Cluster_Leader",
            admin_addr=self._admin_url,
            metrics_addr=self._metrics_url,
            broker_status="active",
        )
        return pb.BrokerListResponse(brokers=[broker])

    async def get_leader_broker(self, request: pb.Empty) -> pb.BrokerResponse:
        if self._cluster is not None:
            return await self._cluster.get_leader_broker(request)
        return pb.BrokerResponse(leader=self._broker_id)

    def _cluster_only(self, what: str) -> ClusterOps:
        if self._cluster is None:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"{what} needs cluster mode: a standalone broker has nowhere to move topics",
            )
        return self._cluster

    async def unload_broker(self, request: pb.UnloadBrokerRequest) -> pb.UnloadBrokerResponse:
        return await self._cluster_only("unloading a broker").unload_broker(request)

    async def activate_broker(self, request: pb.ActivateBrokerRequest) -> pb.ActivateBrokerResponse:
        return await self._cluster_only("activating a broker").activate_broker(request)

    async def get_cluster_balance(
        self, request: pb.ClusterBalanceRequest
    ) -> pb.ClusterBalanceResponse:
        return await self._cluster_only("cluster balance").get_cluster_balance(request)

    async def trigger_rebalance(self, request: pb.RebalanceRequest) -> pb.RebalanceResponse:
        return await self._cluster_only("rebalancing").trigger_rebalance(request)

    async def list_namespaces(self, _: pb.Empty) -> pb.NamespaceListResponse:
        return pb.NamespaceListResponse(namespaces=self._core.namespaces())

    # -- NamespaceAdmin ---------------------------------------------------------------------

    async def _namespace_topics(self, namespace: str) -> list[str]:
        """Every topic of the namespace: this broker's, or in cluster mode the store's."""
        local = self._core.topics(namespace)
        if self._store is None:
            return local
        scanned = await store_call_from_grpc(
            self._store.scan, keys.namespace_topics_prefix(namespace)
        )
        stored = [t.full for kv in scanned if (t := keys.parse_namespace_topic(kv.key)) is not None]
        return sorted(set(local) | set(stored))

    async def get_namespace_topics(self, request: pb.NamespaceRequest) -> pb.TopicListResponse:
        return pb.TopicListResponse(topics=await self._namespace_topics(request.name))

    async def get_namespace_policies(self, request: pb.NamespaceRequest) -> pb.PolicyResponse:
        policies = self._core.namespace_policies(request.name)
        return pb.PolicyResponse(policies=json.dumps(policies, sort_keys=True))

    async def create_namespace(self, request: pb.NamespaceRequest) -> pb.NamespaceResponse:
        await self._runtime.run(self._core.create_namespace(request.name))
        return pb.NamespaceResponse(success=True)

    async def delete_namespace(self, request: pb.NamespaceRequest) -> pb.NamespaceResponse:
        if self._placement is not None:
            topics = await self._namespace_topics(request.name)
            if topics:
                raise DanubeError(
                    ErrorCode.FAILED_PRECONDITION,
                    f"namespace {quoted(request.name)} still has {len(topics)} topic(s); "
                    "delete them first",
                )
        await self._runtime.run(self._core.delete_namespace(request.name))
        if self._store is not None:
            # Its replication factor (our record, `danube.machines.cluster.policies`) goes
            # too: a namespace created again under the name starts from the cluster's.
            policy = keys.cluster_policy_key(request.name)
            await store_call_from_grpc(self._store.delete, policy)
        return pb.NamespaceResponse(success=True)

    # -- TopicAdmin ---------------------------------------------------------------------------

    async def _topic_infos(self, topics: list[str]) -> list[pb.TopicInfo]:
        owners = (
            await self._cluster.topic_owners(topics)
            if self._cluster is not None
            else dict.fromkeys(topics, self._broker_id)
        )
        strategies = await self._strategies(topics)
        return [
            pb.TopicInfo(name=name, broker_id=owners.get(name, ""), delivery=strategies[name])
            for name in topics
        ]

    async def _strategies(self, topics: list[str]) -> dict[str, str]:
        found = {}
        for name in topics:
            if self._core.serves(name) or self._store is None:
                found[name] = self._core.topic_strategy(name).label
            else:
                key = keys.topic_delivery(parse_topic(name))
                kv = await store_call_from_grpc(self._store.get, key)
                found[name] = str(kv.value) if kv is not None else ""
        return found

    async def list_namespace_topics(self, request: pb.NamespaceRequest) -> pb.TopicInfoListResponse:
        topics = await self._namespace_topics(request.name)
        return pb.TopicInfoListResponse(topics=await self._topic_infos(topics))

    async def list_broker_topics(self, request: pb.BrokerRequest) -> pb.TopicInfoListResponse:
        if self._cluster is not None:
            return await self._cluster.list_broker_topics(request)
        if request.broker_id != self._broker_id:
            raise not_found(f"broker {quoted(request.broker_id)} is not this standalone broker")
        topics = sorted(self._core.served_topics())
        return pb.TopicInfoListResponse(topics=await self._topic_infos(topics))

    async def _check_subject(self, subject: str | None) -> None:
        """Danube stores a creation's subject without looking at the registry; a subject
        that does not exist would refuse every publish later, so it is refused now."""
        if subject and not await self._schemas.subject_exists(subject):
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"schema subject {quoted(subject)} is not registered; register it first "
                "(danube-admin schemas register)",
            )

    async def _bind_schema(self, topic: str, subject: str | None) -> None:
        """A topic created with a subject is bound to it under `enforce`: the reason to
        name a subject at creation is that its messages must match it."""
        if subject:
            config = TopicSchemaConfig(subject, ValidationPolicy.ENFORCE, False)
            await self._schemas.bind_topic(topic, config)

    async def create_topic(self, request: pb.NewTopicRequest) -> pb.TopicResponse:
        strategy = _strategy(request.dispatch_strategy)
        name = parse_topic(request.name)
        await self._check_subject(request.schema_subject)
        if self._placement is not None:
            await self._placement.create([name], strategy)
        else:
            await self._runtime.run(self._core.create_topic(request.name, strategy))
        await self._bind_schema(request.name, request.schema_subject)
        return pb.TopicResponse(success=True)

    async def create_partitioned_topic(
        self, request: pb.PartitionedTopicRequest
    ) -> pb.TopicResponse:
        strategy = _strategy(request.dispatch_strategy)
        await self._check_subject(request.schema_subject)
        if self._placement is not None:
            await self._placement.create_partitioned(
                request.base_name, request.partitions, strategy
            )
        else:
            step = self._core.create_partitioned_topic(
                request.base_name, request.partitions, strategy
            )
            await self._runtime.run(step)
        await self._bind_schema(request.base_name, request.schema_subject)
        return pb.TopicResponse(success=True)

    async def delete_topic(self, request: pb.TopicRequest) -> pb.TopicResponse:
        """Standalone: the topic, its metadata, its WAL and its uploaded objects (Danube
        leaves the storage behind). A base name deletes every partition."""
        if self._cluster is not None:
            return await self._cluster.delete_topic(request)
        await self._runtime.run(self._core.delete_topic(request.name))
        return pb.TopicResponse(success=True)

    async def unload_topic(self, request: pb.TopicRequest) -> pb.TopicResponse:
        self._topic(request.name)
        return await self._cluster_only("unloading a topic").unload_topic(request)

    async def list_subscriptions(self, request: pb.TopicRequest) -> pb.SubscriptionListResponse:
        return pb.SubscriptionListResponse(subscriptions=self._core.subscriptions(request.name))

    async def unsubscribe(self, request: pb.SubscriptionRequest) -> pb.SubscriptionResponse:
        await self._runtime.run(self._core.unsubscribe(request.topic, request.subscription))
        return pb.SubscriptionResponse(success=True)

    async def describe_topic(self, request: pb.DescribeTopicRequest) -> pb.DescribeTopicResponse:
        reply = pb.DescribeTopicResponse(
            name=request.name,
            subscriptions=self._core.subscriptions(request.name),
            broker_id=self._broker_id,
            delivery=self._core.topic_strategy(request.name).label,
        )
        bound = await self._schemas.topic_schema(request.name)
        if bound is not None:
            config, subject = bound
            reply.schema_subject = config.subject
            if subject is not None and subject.versions:
                reply.schema_id = subject.schema_id
                reply.schema_version = subject.latest.version
                reply.schema_type = subject.latest.schema_type.value
                reply.compatibility_mode = subject.mode.value
        return reply

    async def set_subscription_failure_policy(
        self, request: pb.SetSubscriptionFailurePolicyRequest
    ) -> pb.SubscriptionResponse:
        settings = _failure_settings(request.failure_policy)
        step = self._core.set_failure_policy(
            request.topic, request.subscription, settings, now_ms=now_ms()
        )
        await self._runtime.run(step)
        return pb.SubscriptionResponse(success=True)

    async def get_subscription_failure_policy(
        self, request: pb.GetSubscriptionFailurePolicyRequest
    ) -> pb.GetSubscriptionFailurePolicyResponse:
        settings = self._core.failure_policy(request.topic, request.subscription)
        kind = self._core.subscription_type(request.topic, request.subscription)
        reply = pb.GetSubscriptionFailurePolicyResponse(
            subscription_type=int(kind) if kind is not None else -1
        )
        if settings is not None:
            reply.failure_policy = _failure_wire(settings)
        return reply

    async def set_subscription_dispatch_config(
        self, request: pb.SetSubscriptionDispatchConfigRequest
    ) -> pb.SubscriptionResponse:
        step = self._core.set_dispatch_window(
            request.topic,
            request.subscription,
            request.dispatch_config.max_unacked_messages,
            now_ms=now_ms(),
        )
        await self._runtime.run(step)
        return pb.SubscriptionResponse(success=True)

    async def get_subscription_dispatch_config(
        self, request: pb.GetSubscriptionDispatchConfigRequest
    ) -> pb.GetSubscriptionDispatchConfigResponse:
        window = self._core.dispatch_window(request.topic, request.subscription)
        reply = pb.GetSubscriptionDispatchConfigResponse()
        if window is not None:
            reply.dispatch_config = pb.SubscriptionDispatchConfig(max_unacked_messages=window)
        return reply

    # -- PolicyAdmin (danube_ext) -------------------------------------------------------------

    async def _run(self, flow: Flow[T]) -> T:
        """Drives a policy flow (`danube.machines.requests.admin`): store effects against the
        store, its admin requests answered by the core. Routing to a topic's owner is
        `_at_owner`'s, around every topic-scoped method."""

        async def perform(request: Any) -> Any:
            if isinstance(request, STORE_EFFECTS):
                assert self._store is not None
                return await store_call_from_grpc(perform_store, self._store, request)
            if isinstance(request, flows.CorePolicies):
                step = self._core.set_namespace_policies(request.namespace, request.changes)
                return await self._runtime.run(step)
            if isinstance(request, flows.NamespaceSeen):
                self._core.namespace_seen(request.namespace, request.policies)
                return None
            if isinstance(request, flows.TopicPolicies):
                return await self._topic_policies(request)
            raise TypeError(f"unexpected request of an admin flow: {request!r}")

        return await drive(flow, perform)

    async def set_namespace_policies(
        self, request: ext_pb.SetPoliciesRequest
    ) -> ext_pb.PoliciesResponse:
        """Cluster mode: merged with the store's value under a compare on its revision
        (`danube.machines.requests.admin.namespace_policies`)."""
        changes = _policies_json(request.policies)
        clustered = self._store is not None
        if clustered:
            self._core.namespace_policies(request.name)  # NOT_FOUND for an unknown namespace
        flow = flows.namespace_policies(request.name, changes, clustered=clustered)
        try:
            policies = await self._run(flow)
        except StoreUnreachable as error:
            raise DanubeError(
                ErrorCode.UNAVAILABLE, f"the metadata store did not answer ({error})"
            ) from None
        return ext_pb.PoliciesResponse(policies=json.dumps(policies, sort_keys=True))

    async def _topic_policies(
        self, request: flows.TopicPolicies
    ) -> tuple[dict[str, int], list[str]]:
        """The core's decision about a topic's overrides, once stored."""
        if request.clear:
            policies = await self._runtime.run(self._core.clear_topic_policies(request.topic))
        elif not request.read_only:
            # A failed write is answered UNAVAILABLE, but the change stays in force here:
            # the core writes it again until the store holds it (`Catalogue.metadata_written`).
            step = self._core.set_topic_policies(request.topic, request.changes)
            policies = await self._runtime.run(step)
        else:
            policies, _ = self._core.topic_policies(request.topic)
        _, overridden = self._core.topic_policies(request.topic)
        return policies, list(overridden)

    async def set_topic_policies(
        self, request: ext_pb.SetPoliciesRequest
    ) -> ext_pb.PoliciesResponse:
        changes = _policies_json(request.policies)
        flow = flows.core_topic_policies(flows.TopicPolicies(request.name, changes))
        return self._policies_reply(*(await self._run(flow)))

    async def get_topic_policies(self, request: ext_pb.PoliciesRequest) -> ext_pb.PoliciesResponse:
        flow = flows.core_topic_policies(flows.TopicPolicies(request.name, read_only=True))
        return self._policies_reply(*(await self._run(flow)))

    async def clear_topic_policies(
        self, request: ext_pb.PoliciesRequest
    ) -> ext_pb.PoliciesResponse:
        flow = flows.core_topic_policies(flows.TopicPolicies(request.name, clear=True))
        return self._policies_reply(*(await self._run(flow)))

    def _policies_reply(
        self, policies: dict[str, int], overridden: list[str]
    ) -> ext_pb.PoliciesResponse:
        return ext_pb.PoliciesResponse(
            policies=json.dumps(policies, sort_keys=True), overridden=overridden
        )

    # -- blocked messages (danube_ext PolicyAdmin; spec/failure-policies.md) -------------------

    async def list_blocked(self, request: ext_pb.BlockedRequest) -> ext_pb.BlockedResponse:
        return ext_pb.BlockedResponse(
            offsets=list(self._core.blocked(request.topic, request.subscription))
        )

    async def resolve_blocked(
        self, request: ext_pb.ResolveBlockedRequest
    ) -> ext_pb.ResolveBlockedResponse:
        step = self._core.resolve_blocked(
            request.topic,
            request.subscription,
            request.offset,
            release=request.release,
            now_ms=now_ms(),
        )
        return ext_pb.ResolveBlockedResponse(resolved=await self._runtime.run(step))

    async def clear_subscription_failure_policy(
        self, request: ext_pb.ClearFailurePolicyRequest
    ) -> ext_pb.ClearFailurePolicyResponse:
        step = self._core.clear_failure_policy(request.topic, request.subscription, now_ms=now_ms())
        return ext_pb.ClearFailurePolicyResponse(cleared=await self._runtime.run(step))

    # -- replication factor (danube_ext PolicyAdmin; spec/replication.md) ----------------------

    async def set_replication_factor(
        self, request: ext_pb.SetReplicationFactorRequest
    ) -> ext_pb.ReplicationFactorResponse:
        """Any broker: the record is written in the store (`policies.set_factor`), and the
        leader's load manager sees it through its watch."""
        self._replicated("setting a replication factor")
        await self._run_store(policies.set_factor(request.name, request.replication_factor or None))
        return await self.get_replication_factor(ext_pb.PoliciesRequest(name=request.name))

    async def get_replication_factor(
        self, request: ext_pb.PoliciesRequest
    ) -> ext_pb.ReplicationFactorResponse:
        cluster = self._replicated("a replication factor")
        own, namespace = await self._run_store(policies.read_factors(request.name))
        configured, active = cluster.replication_defaults()
        wanted, source = policies.in_force(request.name, own, namespace, configured)
        return ext_pb.ReplicationFactorResponse(
            name=request.name,
            own=own or 0,
            namespace_factor=namespace or 0,
            cluster_factor=configured or 0,
            effective=replicas.replication_factor(wanted, active),
            source=source,
            active_brokers=active,
        )

    def _replicated(self, what: str) -> ClusterOps:
        if self._cluster is None or self._store is None:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"{what} needs cluster mode: a standalone broker's topics have no followers",
            )
        return self._cluster

    async def _run_store(self, flow: Flow[T]) -> T:
        try:
            return await self._run(flow)
        except StoreUnreachable as error:
            raise DanubeError(
                ErrorCode.UNAVAILABLE, f"the metadata store did not answer ({error})"
            ) from None

    def _at_owner(self, call: Call, path: str, field: str, reply_type: type) -> Call:
        """The handler of a topic-scoped method: run here when this broker answers for the
        topic, else asked again of the owner's admin port
        (`danube.machines.requests.admin.at_owner`)."""

        async def routed(request: Any) -> Any:
            topic = getattr(request, field)

            async def forward_to(admin_url: str) -> Any:
                return await forward(admin_url, path, request, reply_type)

            async def perform(asked: Any) -> Any:
                if isinstance(asked, flows.ServedHere):
                    return self._served_here(asked.topic)
                if isinstance(asked, STORE_EFFECTS):
                    assert self._store is not None  # standalone: always served here
                    try:
                        return await store_call_from_grpc(perform_store, self._store, asked)
                    except StoreUnreachable as error:
                        raise DanubeError(
                            ErrorCode.UNAVAILABLE, f"the metadata store did not answer ({error})"
                        ) from None
                if isinstance(asked, flows.Forward):
                    return await forward_to(asked.admin_url)
                if isinstance(asked, flows.RunHere):
                    return await call(request)
                raise TypeError(f"unexpected request of a routing flow: {asked!r}")

            return await drive(flows.at_owner(self._broker_id, topic, flows.run_here), perform)

        routed.__name__ = call.__name__
        return routed

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        """Every method of the generated bases this class implements, under the method's
        snake_case name, with the bases' request and reply types."""
        routes = {}
        for base in _BASES:
            for path, handler in base().__mapping__().items():
                rpc = path.rpartition("/")[2]
                call = getattr(self, _snake(rpc), None)
                if call is None:
                    continue
                field = _TOPIC_FIELD.get(rpc)
                if field is not None:
                    call = self._at_owner(call, path, field, handler.reply_type)
                routes[path] = unary(call, handler.request_type, handler.reply_type)
        return routes


_TOPIC_FIELD = {
    "ListSubscriptions": "name",
    "Unsubscribe": "topic",
    "DescribeTopic": "name",
    "SetSubscriptionFailurePolicy": "topic",
    "GetSubscriptionFailurePolicy": "topic",
    "SetSubscriptionDispatchConfig": "topic",
    "GetSubscriptionDispatchConfig": "topic",
    "SetTopicPolicies": "name",
    "GetTopicPolicies": "name",
    "ClearTopicPolicies": "name",
    "ListBlocked": "topic",
    "ResolveBlocked": "topic",
    "ClearSubscriptionFailurePolicy": "topic",
}
"""Methods about one topic, which the broker serving it answers (cluster mode), and the
request field naming the topic."""

_BASES = (
    pb.BrokerAdminBase,
    pb.NamespaceAdminBase,
    pb.TopicAdminBase,
    ext_pb.PolicyAdminBase,
)


def _snake(rpc: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower()
