"""The admin API of a real standalone broker, over gRPC: status codes that say what went
wrong (spec/protocol.md "Admin API"), subscriptions managed while clients use them,
policies enforced at once, and a deleted reliable topic's storage gone."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from grpclib import GRPCError
from grpclib.const import Status

from danube.client import Batching, DanubeClient, DanubeClientError, SubType
from danube.client.client import DispatchStrategy
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube_admin as admin_pb
from danube.proto import danube_ext as ext_pb
from tests.support.aio import receive_n, run, unique_topic
from tests.support.wire import channel_to

pytestmark = pytest.mark.slow


async def _status_of(call: object) -> tuple[Status, str]:
    with pytest.raises(GRPCError) as refused:
        await call  # type: ignore[misc]
    assert refused.value.message, "every refusal says why"
    return refused.value.status, refused.value.message


def test_namespace_and_topic_errors_keep_their_codes(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        async with channel_to(broker.admin_addr) as channel:
            namespaces = admin_pb.NamespaceAdminStub(channel)
            topics = admin_pb.TopicAdminStub(channel)
            name = unique_topic("ns").rsplit("-", 1)[1]
            await namespaces.create_namespace(admin_pb.NamespaceRequest(name=name))
            status, _ = await _status_of(
                namespaces.create_namespace(admin_pb.NamespaceRequest(name=name))
            )
            assert status is Status.ALREADY_EXISTS
            status, _ = await _status_of(
                namespaces.get_namespace_policies(admin_pb.NamespaceRequest(name="no-such-ns"))
            )
            assert status is Status.NOT_FOUND
            status, _ = await _status_of(
                topics.create_topic(admin_pb.NewTopicRequest(name="not/a/topic"))
            )
            assert status is Status.INVALID_ARGUMENT
            topic = f"/{name}/t"
            await topics.create_topic(admin_pb.NewTopicRequest(name=topic, dispatch_strategy=1))
            status, message = await _status_of(
                namespaces.delete_namespace(admin_pb.NamespaceRequest(name=name))
            )
            assert status is Status.FAILED_PRECONDITION and "1 topic" in message
            status, _ = await _status_of(
                topics.create_topic(
                    admin_pb.NewTopicRequest(name=f"/{name}/u", schema_subject="no-such-subject")
                )
            )
            assert status is Status.FAILED_PRECONDITION
            listed = await namespaces.get_namespace_topics(admin_pb.NamespaceRequest(name=name))
            assert listed.topics == [topic], "the refused creation left nothing behind"
            described = await topics.describe_topic(admin_pb.DescribeTopicRequest(name=topic))
            assert described.delivery == "Reliable" and described.schema_subject is None
            status, _ = await _status_of(topics.unload_topic(admin_pb.TopicRequest(name=topic)))
            assert status is Status.FAILED_PRECONDITION, "nowhere to move it standalone"
            await topics.delete_topic(admin_pb.TopicRequest(name=topic))
            await namespaces.delete_namespace(admin_pb.NamespaceRequest(name=name))
            listed = await admin_pb.BrokerAdminStub(channel).list_namespaces(admin_pb.Empty())
            assert name not in listed.namespaces

    run(scenario)


def test_unsubscribe_waits_for_the_consumer_to_close(broker: BrokerProcess) -> None:
    topic = unique_topic("unsub")

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client, channel_to(broker.admin_addr) as channel:
            topics = admin_pb.TopicAdminStub(channel)
            producer = await client.producer(
                topic, "p", dispatch=DispatchStrategy.RELIABLE
            ).create()
            consumer = client.consumer(topic, "c", "audit", sub_type=SubType.EXCLUSIVE)
            await consumer.subscribe()
            await producer.send(b"m0")
            await receive_n(consumer, 1)
            request = admin_pb.SubscriptionRequest(topic=topic, subscription="audit")
            status, message = await _status_of(topics.unsubscribe(request))
            assert status is Status.FAILED_PRECONDITION and "close them first" in message
            await consumer.close()
            for _ in range(100):  # the broker learns of the closed stream shortly after
                try:
                    await topics.unsubscribe(request)
                    break
                except GRPCError as error:
                    assert error.status is Status.FAILED_PRECONDITION
                    await asyncio.sleep(0.05)
            listed = await topics.list_subscriptions(admin_pb.TopicRequest(name=topic))
            assert listed.subscriptions == []
            status, _ = await _status_of(topics.unsubscribe(request))
            assert status is Status.NOT_FOUND

    run(scenario)


def test_failure_policy_and_dispatch_config_round_trip(broker: BrokerProcess) -> None:
    topic = unique_topic("policy")

    async def scenario() -> None:
        async with channel_to(broker.admin_addr) as channel:
            topics = admin_pb.TopicAdminStub(channel)
            await topics.create_topic(admin_pb.NewTopicRequest(name=topic, dispatch_strategy=1))
            got = await topics.get_subscription_failure_policy(
                admin_pb.GetSubscriptionFailurePolicyRequest(topic=topic, subscription="s")
            )
            assert got.failure_policy is None, "none set: the broker's defaults apply"
            policy = admin_pb.SubscriptionFailurePolicy(
                ack_timeout_ms=5_000,
                base_redelivery_delay_ms=100,
                max_redelivery_delay_ms=1_000,
                backoff_strategy=admin_pb.SubscriptionBackoffStrategy.Fixed,
                poison_policy=admin_pb.SubscriptionPoisonPolicy.Block,
            )
            await topics.set_subscription_failure_policy(
                admin_pb.SetSubscriptionFailurePolicyRequest(
                    topic=topic, subscription="s", failure_policy=policy
                )
            )
            got = await topics.get_subscription_failure_policy(
                admin_pb.GetSubscriptionFailurePolicyRequest(topic=topic, subscription="s")
            )
            assert got.failure_policy == policy
            status, message = await _status_of(
                topics.set_subscription_failure_policy(
                    admin_pb.SetSubscriptionFailurePolicyRequest(
                        topic=topic,
                        subscription="s",
                        failure_policy=admin_pb.SubscriptionFailurePolicy(ack_timeout_ms=1),
                    )
                )
            )
            assert status is Status.INVALID_ARGUMENT and "dead_letter_topic" in message
            await topics.set_subscription_dispatch_config(
                admin_pb.SetSubscriptionDispatchConfigRequest(
                    topic=topic,
                    subscription="s",
                    dispatch_config=admin_pb.SubscriptionDispatchConfig(max_unacked_messages=7),
                )
            )
            window = await topics.get_subscription_dispatch_config(
                admin_pb.GetSubscriptionDispatchConfigRequest(topic=topic, subscription="s")
            )
            assert window.dispatch_config.max_unacked_messages == 7
            status, _ = await _status_of(
                topics.set_subscription_dispatch_config(
                    admin_pb.SetSubscriptionDispatchConfigRequest(
                        topic=topic,
                        subscription="s",
                        dispatch_config=admin_pb.SubscriptionDispatchConfig(max_unacked_messages=0),
                    )
                )
            )
            assert status is Status.INVALID_ARGUMENT

    run(scenario)


def test_topic_policies_are_enforced_for_clients(broker: BrokerProcess) -> None:
    topic = unique_topic("limits")

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client, channel_to(broker.admin_addr) as channel:
            policies = ext_pb.PolicyAdminStub(channel)
            first = await client.producer(topic, "p1").create()
            changed = await policies.set_topic_policies(
                ext_pb.SetPoliciesRequest(
                    name=topic,
                    policies=json.dumps({"max_producers_per_topic": 1, "max_message_size": 8}),
                )
            )
            assert json.loads(changed.policies)["max_producers_per_topic"] == 1
            assert sorted(changed.overridden) == ["max_message_size", "max_producers_per_topic"]
            with pytest.raises(DanubeClientError) as refused:
                await client.producer(topic, "p2").create()
            assert "max_producers_per_topic" in str(refused.value)
            with pytest.raises(DanubeClientError) as too_big:
                await first.send(b"123456789")
            assert "max_message_size" in str(too_big.value)
            await policies.clear_topic_policies(ext_pb.PoliciesRequest(name=topic))
            await client.producer(topic, "p2").create()
            status, _ = await _status_of(
                policies.set_namespace_policies(
                    ext_pb.SetPoliciesRequest(name="default", policies='{"max_producers": 1}')
                )
            )
            assert status is Status.INVALID_ARGUMENT

    run(scenario)


def test_a_namespace_default_failure_policy_travels_as_a_json_object(
    broker: BrokerProcess,
) -> None:
    """Issue 24: `failure_policy` in a namespace's policies (its own namespace, so the
    other tests of this broker keep the broker's default)."""

    async def scenario() -> None:
        async with channel_to(broker.admin_addr) as channel:
            name = unique_topic("fp").rsplit("-", 1)[1]
            await admin_pb.NamespaceAdminStub(channel).create_namespace(
                admin_pb.NamespaceRequest(name=name)
            )
            policies = ext_pb.PolicyAdminStub(channel)
            default = {"max_redelivery_count": 2, "poison_policy": "drop"}
            changed = await policies.set_namespace_policies(
                ext_pb.SetPoliciesRequest(
                    name=name, policies=json.dumps({"failure_policy": default})
                )
            )
            stored = json.loads(changed.policies)["failure_policy"]
            assert stored["max_redelivery_count"] == 2 and stored["poison_policy"] == "drop"
            status, message = await _status_of(
                policies.set_namespace_policies(
                    ext_pb.SetPoliciesRequest(
                        name=name, policies='{"failure_policy": {"poison_policy": "dead_letter"}}'
                    )
                )
            )
            assert status is Status.INVALID_ARGUMENT and "dead_letter_topic" in message

    run(scenario)


def test_deleting_a_reliable_topic_deletes_its_wal(broker: BrokerProcess) -> None:
    topic = unique_topic("gone")
    wal_dir = Path(broker.data_dir) / "wal" / topic.strip("/")

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client, channel_to(broker.admin_addr) as channel:
            producer = await client.producer(
                topic, "p", dispatch=DispatchStrategy.RELIABLE
            ).create()
            await producer.send(b"kept until deleted")
            assert wal_dir.exists()
            await admin_pb.TopicAdminStub(channel).delete_topic(admin_pb.TopicRequest(name=topic))
            for _ in range(100):
                if not wal_dir.exists():
                    break
                await asyncio.sleep(0.05)
            assert not wal_dir.exists()
            again = await client.producer(
                topic, "p-again", dispatch=DispatchStrategy.RELIABLE
            ).create()
            await again.send(b"fresh")
            consumer = client.consumer(topic, "c", "s", start="earliest")
            await consumer.subscribe()
            (message,) = await receive_n(consumer, 1)
            assert message.payload == b"fresh", "the recreated topic starts empty"

    run(scenario)


@pytest.mark.parametrize("batched", [True, False], ids=["batched-path", "plain-path"])
def test_publish_rate_slows_producers_down_without_errors(
    broker: BrokerProcess, batched: bool
) -> None:
    """At 20 messages a second after a one-second burst, 45 messages cannot all be stored in
    less than a second; every one is stored, none refused."""
    topic = unique_topic("rate")

    async def scenario() -> float:
        async with DanubeClient(broker.url) as client, channel_to(broker.admin_addr) as channel:
            producer = await client.producer(
                topic, "p", batching=Batching() if batched else None
            ).create()
            await ext_pb.PolicyAdminStub(channel).set_topic_policies(
                ext_pb.SetPoliciesRequest(name=topic, policies='{"max_publish_rate": 20}')
            )
            started = time.monotonic()
            if batched:
                await asyncio.gather(*(producer.enqueue(b"m%d" % i) for i in range(45)))
            else:
                for i in range(45):
                    await producer.send(b"m%d" % i)
            return time.monotonic() - started

    elapsed = run(scenario)
    assert elapsed >= 1.0, f"45 messages at 20/s took only {elapsed:.2f} s"
