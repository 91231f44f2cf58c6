"""`danube-admin topics ...`: listing, creating, describing, moving and deleting topics
(TopicAdmin), and their own policies (our PolicyAdmin extension)."""

from __future__ import annotations

import argparse

from grpclib.const import Status

from danube.cli.admin_args import Actions, add_topic, command, count, group, topic_name
from danube.cli.admin_call import AdminClient, Refused, require_success
from danube.cli.admin_policies import add_policy_flags, policies_result, policy_changes
from danube.cli.admin_render import Result, fields, plain, table
from danube.cli.admin_replication import add_replication_factor_command
from danube.cli.admin_subscriptions import add_subscription_commands
from danube.cli.admin_topic_schema import add_topic_schema_commands
from danube.proto import danube_admin as pb
from danube.proto import danube_ext as ext_pb

SERVER_MOVE_WAIT_S = 30.0
"""How long a broker waits for a topic's unload or deletion before it answers
(`danube.runtime.cluster_admin.MOVE_WAIT_S`; kept light here, the CLI does not import the
broker)."""

STRATEGIES = {
    "non_reliable": pb.DispatchStrategy.NonReliable,
    "reliable": pb.DispatchStrategy.Reliable,
}


async def list_topics(client: AdminClient, args: argparse.Namespace) -> Result:
    if args.broker is not None:
        where = f"broker {args.broker}"
        call = client.topics.list_broker_topics(pb.BrokerRequest(broker_id=args.broker))
    else:
        where = f"namespace {args.namespace}"
        call = client.topics.list_namespace_topics(pb.NamespaceRequest(name=args.namespace))
    answer = await client.call(f"topics of {where}", call)
    rows = [(t.name, t.broker_id, t.delivery) for t in answer.topics]
    return Result(
        plain(answer), table(("topic", "broker_id", "delivery"), rows, f"no topics on {where}")
    )


async def create(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    strategy = STRATEGIES[args.dispatch_strategy]
    what = f"create topic {name}"
    if args.partitions:
        request = pb.PartitionedTopicRequest(
            base_name=name,
            partitions=args.partitions,
            schema_subject=args.schema_subject,
            dispatch_strategy=strategy,
        )
        answer = await client.call(what, client.topics.create_partitioned_topic(request))
        done = f"Created topic {name} with {args.partitions} partitions ({args.dispatch_strategy})"
    else:
        single = pb.NewTopicRequest(
            name=name, schema_subject=args.schema_subject, dispatch_strategy=strategy
        )
        answer = await client.call(what, client.topics.create_topic(single))
        done = f"Created topic {name} ({args.dispatch_strategy})"
    require_success(what, answer.success)
    return Result(plain(answer), done)


async def _leave(client: AdminClient, args: argparse.Namespace, verb: str) -> Result:
    """A topic leaving its broker (deleted or unloaded): the broker waits for that before it
    answers, so the call gets a deadline that covers the wait."""
    name = topic_name(args)
    what = f"{verb} topic {name}"
    deadline = client.long_call(SERVER_MOVE_WAIT_S)
    rpc = client.topics.delete_topic if verb == "delete" else client.topics.unload_topic
    answer = await client.call(
        what, rpc(pb.TopicRequest(name=name), timeout=deadline), timeout_s=deadline
    )
    require_success(what, answer.success)
    if verb == "delete":
        return Result(plain(answer), f"Deleted topic {name}")
    return Result(plain(answer), f"Unloaded topic {name}: another broker will serve it")


async def delete(client: AdminClient, args: argparse.Namespace) -> Result:
    return await _leave(client, args, "delete")


async def unload(client: AdminClient, args: argparse.Namespace) -> Result:
    return await _leave(client, args, "unload")


async def subscriptions(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    request = pb.TopicRequest(name=name)
    answer = await client.call(
        f"subscriptions of {name}", client.topics.list_subscriptions(request)
    )
    rows = [(sub,) for sub in answer.subscriptions]
    return Result(plain(answer), table(("subscription",), rows, f"no subscriptions on {name}"))


async def describe(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    request = pb.DescribeTopicRequest(name=name)
    answer = await client.call(f"describe topic {name}", client.topics.describe_topic(request))
    data = plain(answer)
    replication = await _replication(client, name)
    rows: list[tuple[str, object]] = [
        ("topic", answer.name),
        ("broker_id", answer.broker_id),
        ("delivery", answer.delivery),
        ("subscriptions", list(answer.subscriptions)),
        ("schema_subject", answer.schema_subject),
        ("schema_id", answer.schema_id),
        ("schema_version", answer.schema_version),
        ("schema_type", answer.schema_type),
        ("compatibility_mode", answer.compatibility_mode),
    ]
    if replication is not None:
        assert isinstance(data, dict)
        data["replication"] = plain(replication)
        rows += replication_fields(replication)
    return Result(data, fields(rows))


async def _replication(client: AdminClient, name: str) -> ext_pb.TopicReplicationResponse | None:
    """The topic's replication (issue 27); None from a broker that does not offer it."""
    request = ext_pb.TopicReplicationRequest(name=name)
    try:
        return await client.call(
            f"replication of topic {name}", client.replication.topic_replication(request)
        )
    except Refused as refused:
        if refused.status is Status.UNIMPLEMENTED:
            return None
        raise


def replication_fields(answer: ext_pb.TopicReplicationResponse) -> list[tuple[str, object]]:
    """Owner, in-sync set, high watermark and each follower's lag, one line each."""
    rows: list[tuple[str, object]] = [
        ("replication_owner", answer.owner),
        ("replication_epoch", answer.epoch),
        ("in_sync", list(answer.in_sync)),
    ]
    if answer.live:
        rows.append(("high_watermark", answer.high_watermark))
    for follower in answer.followers:
        state = "in sync" if follower.in_sync else "out of sync"
        if answer.live:
            state += f", lag {follower.lag}, acknowledged {follower.acknowledged}"
            state += ", connected" if follower.connected else ", not connected"
        rows.append((f"follower {follower.broker_id}", state))
    if answer.note:
        rows.append(("replication_note", answer.note))
    return rows


async def get_policies(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    what = f"policies of topic {name}"
    answer = await client.call(
        what, client.policies.get_topic_policies(ext_pb.PoliciesRequest(name))
    )
    return policies_result(what, answer.policies, list(answer.overridden))


async def set_policies(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    what = f"set policies of topic {name}"
    request = ext_pb.SetPoliciesRequest(name=name, policies=policy_changes(args))
    answer = await client.call(what, client.policies.set_topic_policies(request))
    head = f"Set policies of topic {name}"
    return policies_result(what, answer.policies, list(answer.overridden), head)


async def clear_policies(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    what = f"clear policies of topic {name}"
    request = ext_pb.PoliciesRequest(name=name)
    answer = await client.call(what, client.policies.clear_topic_policies(request))
    head = f"Cleared policies of topic {name}: its namespace's apply"
    return policies_result(what, answer.policies, list(answer.overridden), head)


def add_topic_commands(commands: Actions) -> None:
    actions = group(commands, "topics", "create, inspect, move and delete topics")

    sub = command(actions, "list", "list the topics of a namespace or of a broker", list_topics,
                  "TopicAdmin/ListNamespaceTopics, or ListBrokerTopics for --broker")  # fmt: skip
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("-n", "--namespace", help="the topics of this namespace")
    where.add_argument("-b", "--broker", help="the topics this broker serves (its id)")

    sub = command(
        actions, "create", "create a topic, or a partitioned one with --partitions", create,
        "TopicAdmin/CreateTopic or CreatePartitionedTopic",
    )  # fmt: skip
    add_topic(sub)
    sub.add_argument("-p", "--partitions", type=count, default=0,
                     help="make partitions <topic>-part-0..N-1 (default 0: none)")  # fmt: skip
    sub.add_argument("--schema-subject", help="bind this schema registry subject")
    sub.add_argument("--dispatch-strategy", choices=tuple(STRATEGIES), default="non_reliable",
                     help="reliable: stored and redelivered until acknowledged "
                     "(default non_reliable)")  # fmt: skip

    specs = (
        ("delete", "delete a topic (all partitions, given the base name) and its data", delete,
         "TopicAdmin/DeleteTopic"),
        ("unload", "move a topic to another broker", unload,
         "TopicAdmin/UnloadTopic, cluster mode with at least two brokers"),
        ("subscriptions", "list a topic's subscriptions", subscriptions,
         "TopicAdmin/ListSubscriptions"),
        ("describe", "show a topic's broker, delivery, subscriptions and schema", describe,
         "TopicAdmin/DescribeTopic"),
        ("get-policies", "show the policies in force for a topic and where each comes from",
         get_policies, "PolicyAdmin/GetTopicPolicies (a danube-py broker)"),
        ("clear-policies", "drop a topic's own policies: its namespace's apply again",
         clear_policies, "PolicyAdmin/ClearTopicPolicies (a danube-py broker)"),
    )  # fmt: skip
    for name, help_text, run, needs in specs:
        add_topic(command(actions, name, help_text, run, needs))

    sub = command(
        actions, "set-policies", "set some of a topic's own policies (over its namespace's)",
        set_policies, "PolicyAdmin/SetTopicPolicies (a danube-py broker)",
    )  # fmt: skip
    add_topic(sub)
    add_policy_flags(sub)
    add_replication_factor_command(actions, "topic")

    add_subscription_commands(actions)
    add_topic_schema_commands(actions)
