"""`danube-admin topics` commands about one subscription: removing it, how it redelivers
(failure policy, and ours: `clear-failure-policy` back to the namespace's default), how much
it keeps in flight (dispatch config), and the messages its Block poison policy holds (ours:
`blocked`, `release`, `skip`)."""

from __future__ import annotations

import argparse

from danube.cli.admin_args import (
    Actions,
    add_subscription,
    add_topic,
    command,
    count,
    positive,
    topic_name,
)
from danube.cli.admin_call import AdminClient, require_success
from danube.cli.admin_render import Result, fields, plain, record, snake
from danube.proto import danube as api_pb
from danube.proto import danube_admin as pb
from danube.proto import danube_ext as ext_pb

BACKOFFS = {"fixed": pb.SubscriptionBackoffStrategy.Fixed,
            "exponential": pb.SubscriptionBackoffStrategy.Exponential}  # fmt: skip
POISON = {
    "dead_letter": pb.SubscriptionPoisonPolicy.DeadLetter,
    "dead-letter": pb.SubscriptionPoisonPolicy.DeadLetter,
    "block": pb.SubscriptionPoisonPolicy.Block,
    "drop": pb.SubscriptionPoisonPolicy.Drop,
}
RELIABLE = "a reliable topic"


def _sub_type(value: int) -> str | None:
    """The live subscription's type by name; None when it is not loaded (-1 from our broker)."""
    try:
        return snake(api_pb.ConsumerRequestSubscriptionType(value).name)
    except ValueError:
        return None


async def unsubscribe(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    what = f"unsubscribe {args.subscription} from {name}"
    request = pb.SubscriptionRequest(topic=name, subscription=args.subscription)
    answer = await client.call(what, client.topics.unsubscribe(request))
    require_success(what, answer.success)
    return Result(plain(answer), f"Removed subscription {args.subscription} from {name}")


async def set_failure_policy(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    policy = pb.SubscriptionFailurePolicy(
        max_redelivery_count=args.max_redelivery_count,
        ack_timeout_ms=args.ack_timeout_ms,
        base_redelivery_delay_ms=args.base_redelivery_delay_ms,
        max_redelivery_delay_ms=args.max_redelivery_delay_ms,
        backoff_strategy=BACKOFFS[args.backoff_strategy],
        dead_letter_topic=args.dead_letter_topic,
        poison_policy=POISON[args.poison_policy],
    )
    what = f"set failure policy of {args.subscription} on {name}"
    request = pb.SetSubscriptionFailurePolicyRequest(
        topic=name, subscription=args.subscription, failure_policy=policy
    )
    answer = await client.call(what, client.topics.set_subscription_failure_policy(request))
    require_success(what, answer.success)
    return Result(plain(answer), f"Set failure policy of {args.subscription} on {name}")


async def clear_failure_policy(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    request = ext_pb.ClearFailurePolicyRequest(topic=name, subscription=args.subscription)
    answer = await client.call(
        f"clear failure policy of {args.subscription} on {name}",
        client.policies.clear_subscription_failure_policy(request),
    )
    text = (
        f"Cleared the failure policy of {args.subscription} on {name}: it follows the "
        "namespace's default"
        if answer.cleared
        else f"{args.subscription} on {name} had no failure policy of its own; nothing changed"
    )
    return Result({"cleared": answer.cleared}, text)


async def get_failure_policy(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    request = pb.GetSubscriptionFailurePolicyRequest(topic=name, subscription=args.subscription)
    answer = await client.call(
        f"failure policy of {args.subscription} on {name}",
        client.topics.get_subscription_failure_policy(request),
    )
    data = record(answer)
    data["subscription_type"] = _sub_type(answer.subscription_type)
    policy = answer.failure_policy
    if policy is None:
        return Result(data, f"no failure policy stored for {args.subscription} on {name}")
    text = fields(
        [
            ("subscription_type", data["subscription_type"]),
            ("max_redelivery_count", policy.max_redelivery_count),
            ("ack_timeout_ms", policy.ack_timeout_ms),
            ("base_redelivery_delay_ms", policy.base_redelivery_delay_ms),
            ("max_redelivery_delay_ms", policy.max_redelivery_delay_ms),
            ("backoff_strategy", policy.backoff_strategy),
            ("dead_letter_topic", policy.dead_letter_topic),
            ("poison_policy", policy.poison_policy),
        ]
    )
    return Result(data, text)


async def set_dispatch_config(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    what = f"set dispatch config of {args.subscription} on {name}"
    config = pb.SubscriptionDispatchConfig(max_unacked_messages=args.max_unacked_messages)
    request = pb.SetSubscriptionDispatchConfigRequest(
        topic=name, subscription=args.subscription, dispatch_config=config
    )
    answer = await client.call(what, client.topics.set_subscription_dispatch_config(request))
    require_success(what, answer.success)
    return Result(
        plain(answer),
        f"Set max unacked messages of {args.subscription} on {name} to {args.max_unacked_messages}",
    )


async def get_dispatch_config(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    request = pb.GetSubscriptionDispatchConfigRequest(topic=name, subscription=args.subscription)
    answer = await client.call(
        f"dispatch config of {args.subscription} on {name}",
        client.topics.get_subscription_dispatch_config(request),
    )
    if answer.dispatch_config is None:
        text = f"no dispatch config stored for {args.subscription} on {name}"
    else:
        text = fields([("max_unacked_messages", answer.dispatch_config.max_unacked_messages)])
    return Result(plain(answer), text)


async def blocked(client: AdminClient, args: argparse.Namespace) -> Result:
    name = topic_name(args)
    request = ext_pb.BlockedRequest(topic=name, subscription=args.subscription)
    answer = await client.call(
        f"blocked messages of {args.subscription} on {name}", client.policies.list_blocked(request)
    )
    offsets = list(answer.offsets)
    text = "\n".join(map(str, offsets)) or f"no message of {args.subscription} on {name} is blocked"
    return Result({"offsets": offsets}, text)


async def _resolve(client: AdminClient, args: argparse.Namespace, release: bool) -> Result:
    name = topic_name(args)
    verb = "release" if release else "skip"
    request = ext_pb.ResolveBlockedRequest(name, args.subscription, args.offset, release)
    answer = await client.call(
        f"{verb} offset {args.offset} of {args.subscription} on {name}",
        client.policies.resolve_blocked(request),
    )
    done = "Released" if release else "Skipped"
    text = (
        f"{done} offset {args.offset} of {args.subscription} on {name}"
        if answer.resolved
        else f"offset {args.offset} of {args.subscription} on {name} is not blocked; nothing done"
    )
    return Result({"resolved": answer.resolved}, text)


async def release(client: AdminClient, args: argparse.Namespace) -> Result:
    return await _resolve(client, args, True)


async def skip(client: AdminClient, args: argparse.Namespace) -> Result:
    return await _resolve(client, args, False)


def add_subscription_commands(actions: Actions) -> None:
    sub = command(
        actions, "unsubscribe", "remove a subscription that has no consumer attached",
        unsubscribe, "TopicAdmin/Unsubscribe",
    )  # fmt: skip
    add_topic(sub)
    add_subscription(sub)

    sub = command(
        actions, "set-failure-policy",
        "set how a subscription redelivers and what it does with a message that keeps failing",
        set_failure_policy, f"TopicAdmin/SetSubscriptionFailurePolicy on {RELIABLE}",
    )  # fmt: skip
    add_topic(sub)
    add_subscription(sub)
    for flag, meaning in (
        (
            "--max-redelivery-count",
            "redeliveries a failing message gets before the poison policy acts (0: none, "
            "4294967295: no limit)",
        ),
        ("--ack-timeout-ms", "redeliver a message not acknowledged within this time"),
        ("--base-redelivery-delay-ms", "wait before the first redelivery"),
        ("--max-redelivery-delay-ms", "longest wait between redeliveries"),
    ):
        sub.add_argument(flag, type=count, required=True, metavar="N", help=meaning)
    sub.add_argument("--backoff-strategy", choices=tuple(BACKOFFS), default="exponential",
                     help="how the wait grows (default exponential)")  # fmt: skip
    sub.add_argument("--dead-letter-topic", metavar="TOPIC",
                     help="where dead_letter sends poisoned messages")  # fmt: skip
    sub.add_argument("--poison-policy", choices=tuple(POISON), required=True,
                     help="what happens to a message past its redeliveries")  # fmt: skip

    sub = command(
        actions, "clear-failure-policy",
        "drop a subscription's own failure policy: it follows the namespace's default again",
        clear_failure_policy, f"ours: PolicyAdmin/ClearSubscriptionFailurePolicy on {RELIABLE}",
    )  # fmt: skip
    add_topic(sub)
    add_subscription(sub)

    sub = command(
        actions, "get-failure-policy", "show a subscription's failure policy",
        get_failure_policy, "TopicAdmin/GetSubscriptionFailurePolicy",
    )  # fmt: skip
    add_topic(sub)
    add_subscription(sub)

    sub = command(
        actions, "set-dispatch-config",
        "set how many messages a subscription keeps in flight unacknowledged",
        set_dispatch_config, f"TopicAdmin/SetSubscriptionDispatchConfig on {RELIABLE}",
    )  # fmt: skip
    add_topic(sub)
    add_subscription(sub)
    sub.add_argument("--max-unacked-messages", type=positive, required=True, metavar="N",
                     help="messages in flight per subscription (1 to 10000)")  # fmt: skip

    sub = command(
        actions, "get-dispatch-config", "show a subscription's dispatch config",
        get_dispatch_config, "TopicAdmin/GetSubscriptionDispatchConfig",
    )  # fmt: skip
    add_topic(sub)
    add_subscription(sub)

    sub = command(
        actions, "blocked", "list the offsets the Block poison policy holds on a subscription",
        blocked, f"ours: PolicyAdmin/ListBlocked on {RELIABLE}",
    )  # fmt: skip
    add_topic(sub)
    add_subscription(sub)
    for name, meaning, call in (
        ("release", "send a blocked message again, its attempts reset", release),
        ("skip", "drop a blocked message (counted, as the Drop policy would)", skip),
    ):
        sub = command(
            actions, name, meaning, call, f"ours: PolicyAdmin/ResolveBlocked on {RELIABLE}"
        )
        add_topic(sub)
        add_subscription(sub)
        sub.add_argument("--offset", type=count, required=True, metavar="N",
                         help="the blocked offset (see `topics blocked`)")  # fmt: skip
