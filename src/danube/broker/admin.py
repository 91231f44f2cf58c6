"""The part of Danube's admin API (package `danube_admin`) offered today: namespaces and
topics, and in cluster mode topic creation through the store, the leader and
TriggerRebalance. Methods not listed here answer UNIMPLEMENTED (grpclib's default).

Unlike Danube, which answers NOT_FOUND for most admin failures, each error keeps its own code.
"""

from __future__ import annotations

import json
from typing import Protocol

import grpclib.const

from danube.broker.grpc_util import unary
from danube.broker.placement import ClusterPlacement
from danube.broker.runtime import BrokerRuntime
from danube.core.config import DispatchStrategy
from danube.core.errors import DanubeError, ErrorCode, invalid
from danube.core.names import parse_topic
from danube.proto import danube_admin as pb


def _no_schema(subject: str | None) -> None:
    if subject:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"creating a topic with a schema subject ({subject!r}) is not offered yet: create "
            "it without one, then bind it with the schema registry's ConfigureTopicSchema",
        )


def _strategy(value: int) -> DispatchStrategy:
    if int(value) not in (0, 1):
        raise invalid(f"unknown dispatch strategy {int(value)}")
    return DispatchStrategy(int(value))


class ClusterAdmin(Protocol):
    """What the admin services need of cluster mode."""

    placement: ClusterPlacement

    def leader(self) -> str | None: ...

    def trigger_rebalance(self, max_moves: int | None) -> None: ...


class AdminServices:
    """BrokerAdmin, NamespaceAdmin and TopicAdmin on the admin port."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        broker_id: str,
        admin_url: str,
        cluster: ClusterAdmin | None = None,
    ) -> None:
        self._runtime = runtime
        self._core = runtime.core
        self._broker_id = broker_id
        self._admin_url = admin_url
        self._cluster = cluster

    # BrokerAdmin

    async def list_brokers(self, _: pb.Empty) -> pb.BrokerListResponse:
        broker = pb.BrokerInfo(
            broker_id=self._broker_id,
            broker_addr=self._core.identity.broker_url,
            broker_role="Cluster_Leader",
            admin_addr=self._admin_url,
            broker_status="active",
        )
        return pb.BrokerListResponse(brokers=[broker])

    async def get_leader_broker(self, _: pb.Empty) -> pb.BrokerResponse:
        if self._cluster is not None:
            return pb.BrokerResponse(leader=self._cluster.leader() or "")
        return pb.BrokerResponse(leader=self._broker_id)

    async def trigger_rebalance(self, request: pb.RebalanceRequest) -> pb.RebalanceResponse:
        """Cluster mode, on the leader: starts a rebalance (moves go on in the background,
        as in Danube). Dry runs are not offered yet."""
        if self._cluster is None:
            raise DanubeError(ErrorCode.FAILED_PRECONDITION, "rebalancing needs cluster mode")
        if request.dry_run:
            raise DanubeError(ErrorCode.UNIMPLEMENTED, "dry-run rebalancing is not offered yet")
        leader = self._cluster.leader()
        if leader != self._broker_id:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"broker {leader or '(none yet)'} leads the cluster; ask its admin port",
            )
        self._cluster.trigger_rebalance(request.max_moves)
        return pb.RebalanceResponse(success=True)

    async def list_namespaces(self, _: pb.Empty) -> pb.NamespaceListResponse:
        return pb.NamespaceListResponse(namespaces=self._core.namespaces())

    # NamespaceAdmin

    async def get_namespace_topics(self, request: pb.NamespaceRequest) -> pb.TopicListResponse:
        return pb.TopicListResponse(topics=self._core.topics(request.name))

    async def get_namespace_policies(self, request: pb.NamespaceRequest) -> pb.PolicyResponse:
        policies = self._core.namespace_policies(request.name)
        return pb.PolicyResponse(policies=json.dumps(policies, sort_keys=True))

    async def create_namespace(self, request: pb.NamespaceRequest) -> pb.NamespaceResponse:
        await self._runtime.run(self._core.create_namespace(request.name))
        return pb.NamespaceResponse(success=True)

    async def delete_namespace(self, request: pb.NamespaceRequest) -> pb.NamespaceResponse:
        await self._runtime.run(self._core.delete_namespace(request.name))
        return pb.NamespaceResponse(success=True)

    # TopicAdmin

    async def list_namespace_topics(self, request: pb.NamespaceRequest) -> pb.TopicInfoListResponse:
        topics = [
            pb.TopicInfo(
                name=name,
                broker_id=self._broker_id,
                delivery=self._core.topic_strategy(name).label,
            )
            for name in self._core.topics(request.name)
        ]
        return pb.TopicInfoListResponse(topics=topics)

    async def create_topic(self, request: pb.NewTopicRequest) -> pb.TopicResponse:
        _no_schema(request.schema_subject)
        strategy = _strategy(request.dispatch_strategy)
        if self._cluster is not None:
            await self._cluster.placement.create([parse_topic(request.name)], strategy)
        else:
            await self._runtime.run(self._core.create_topic(request.name, strategy))
        return pb.TopicResponse(success=True)

    async def create_partitioned_topic(
        self, request: pb.PartitionedTopicRequest
    ) -> pb.TopicResponse:
        _no_schema(request.schema_subject)
        strategy = _strategy(request.dispatch_strategy)
        if self._cluster is not None:
            await self._cluster.placement.create_partitioned(
                request.base_name, request.partitions, strategy
            )
            return pb.TopicResponse(success=True)
        step = self._core.create_partitioned_topic(request.base_name, request.partitions, strategy)
        await self._runtime.run(step)
        return pb.TopicResponse(success=True)

    async def delete_topic(self, request: pb.TopicRequest) -> pb.TopicResponse:
        if self._cluster is not None:
            raise DanubeError(
                ErrorCode.UNIMPLEMENTED, "deleting a topic is not offered in cluster mode yet"
            )
        await self._runtime.run(self._core.delete_topic(request.name))
        return pb.TopicResponse(success=True)

    async def list_subscriptions(self, request: pb.TopicRequest) -> pb.SubscriptionListResponse:
        return pb.SubscriptionListResponse(subscriptions=self._core.subscriptions(request.name))

    async def describe_topic(self, request: pb.DescribeTopicRequest) -> pb.DescribeTopicResponse:
        return pb.DescribeTopicResponse(
            name=request.name,
            subscriptions=self._core.subscriptions(request.name),
            broker_id=self._broker_id,
            delivery=self._core.topic_strategy(request.name).label,
        )

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        routes = {
            "BrokerAdmin/ListBrokers": (self.list_brokers, pb.Empty, pb.BrokerListResponse),
            "BrokerAdmin/GetLeaderBroker": (self.get_leader_broker, pb.Empty, pb.BrokerResponse),
            "BrokerAdmin/TriggerRebalance": (
                self.trigger_rebalance, pb.RebalanceRequest, pb.RebalanceResponse
            ),
            "BrokerAdmin/ListNamespaces": (
                self.list_namespaces, pb.Empty, pb.NamespaceListResponse
            ),
            "NamespaceAdmin/GetNamespaceTopics": (
                self.get_namespace_topics, pb.NamespaceRequest, pb.TopicListResponse
            ),
            "NamespaceAdmin/GetNamespacePolicies": (
                self.get_namespace_policies, pb.NamespaceRequest, pb.PolicyResponse
            ),
            "NamespaceAdmin/CreateNamespace": (
                self.create_namespace, pb.NamespaceRequest, pb.NamespaceResponse
            ),
            "NamespaceAdmin/DeleteNamespace": (
                self.delete_namespace, pb.NamespaceRequest, pb.NamespaceResponse
            ),
            "TopicAdmin/ListNamespaceTopics": (
                self.list_namespace_topics, pb.NamespaceRequest, pb.TopicInfoListResponse
            ),
            "TopicAdmin/CreateTopic": (self.create_topic, pb.NewTopicRequest, pb.TopicResponse),
            "TopicAdmin/CreatePartitionedTopic": (
                self.create_partitioned_topic, pb.PartitionedTopicRequest, pb.TopicResponse
            ),
            "TopicAdmin/DeleteTopic": (self.delete_topic, pb.TopicRequest, pb.TopicResponse),
            "TopicAdmin/ListSubscriptions": (
                self.list_subscriptions, pb.TopicRequest, pb.SubscriptionListResponse
            ),
            "TopicAdmin/DescribeTopic": (
                self.describe_topic, pb.DescribeTopicRequest, pb.DescribeTopicResponse
            ),
        }  # fmt: skip
        return {
            f"/danube_admin.{path}": unary(call, request, response)
            for path, (call, request, response) in routes.items()
        }
