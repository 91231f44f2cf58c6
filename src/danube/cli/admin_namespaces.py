"""`danube-admin namespaces ...`: a namespace's topics and policies, creating and deleting
namespaces (NamespaceAdmin), and setting policies (our PolicyAdmin extension)."""

from __future__ import annotations

import argparse

from danube.cli.admin_args import Actions, command, group
from danube.cli.admin_call import AdminClient, require_success
from danube.cli.admin_policies import add_policy_flags, policies_result, policy_changes
from danube.cli.admin_render import Result, plain, table
from danube.cli.admin_replication import add_replication_factor_command
from danube.proto import danube_admin as pb
from danube.proto import danube_ext as ext_pb


async def topics(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.NamespaceRequest(name=args.namespace)
    answer = await client.call(
        f"topics of namespace {args.namespace}", client.namespaces.get_namespace_topics(request)
    )
    rows = [(name,) for name in answer.topics]
    return Result(plain(answer), table(("topic",), rows, f"no topics in {args.namespace}"))


async def policies(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"policies of namespace {args.namespace}"
    request = pb.NamespaceRequest(name=args.namespace)
    answer = await client.call(what, client.namespaces.get_namespace_policies(request))
    return policies_result(what, answer.policies)


async def create(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"create namespace {args.namespace}"
    request = pb.NamespaceRequest(name=args.namespace)
    answer = await client.call(what, client.namespaces.create_namespace(request))
    require_success(what, answer.success)
    return Result(plain(answer), f"Created namespace {args.namespace}")


async def delete(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"delete namespace {args.namespace}"
    request = pb.NamespaceRequest(name=args.namespace)
    answer = await client.call(what, client.namespaces.delete_namespace(request))
    require_success(what, answer.success)
    return Result(plain(answer), f"Deleted namespace {args.namespace}")


async def set_policies(client: AdminClient, args: argparse.Namespace) -> Result:
    what = f"set policies of namespace {args.namespace}"
    request = ext_pb.SetPoliciesRequest(name=args.namespace, policies=policy_changes(args))
    answer = await client.call(what, client.policies.set_namespace_policies(request))
    return policies_result(
        what, answer.policies, head=f"Set policies of namespace {args.namespace}"
    )


def add_namespace_commands(commands: Actions) -> None:
    actions = group(commands, "namespaces", "create, inspect and delete namespaces")
    specs = (
        ("topics", "list a namespace's topics", topics, "NamespaceAdmin/GetNamespaceTopics"),
        ("policies", "show a namespace's policies", policies,
         "NamespaceAdmin/GetNamespacePolicies"),
        ("create", "create a namespace", create, "NamespaceAdmin/CreateNamespace"),
        ("delete", "delete a namespace that has no topics", delete,
         "NamespaceAdmin/DeleteNamespace"),
    )  # fmt: skip
    for name, help_text, run, needs in specs:
        sub = command(actions, name, help_text, run, needs)
        sub.add_argument("namespace", help="the namespace's name, e.g. default")
    sub = command(
        actions, "set-policies",
        "change some of a namespace's policies (the others keep their values)",
        set_policies, "PolicyAdmin/SetNamespacePolicies (a danube-py broker)",
    )  # fmt: skip
    sub.add_argument("namespace", help="the namespace's name, e.g. default")
    add_policy_flags(sub, namespace=True)
    add_replication_factor_command(actions, "namespace")
