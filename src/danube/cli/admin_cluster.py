"""`danube-admin cluster ...`: Danube's Raft membership commands. Our brokers keep cluster
metadata in etcd and have no Raft group, so they answer UNIMPLEMENTED; the commands exist so
scripts written for Danube fail with a clear message instead of a usage error."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable
from typing import TypeVar

from grpclib.const import Status

from danube.cli.admin_args import Actions, command, count, group
from danube.cli.admin_call import AdminClient, AdminError, Refused
from danube.cli.admin_render import Result, fields, plain
from danube.proto import danube_admin as pb

T = TypeVar("T")

NEEDS = "ClusterAdmin (Danube's Raft mode; danube-py brokers use etcd and answer UNIMPLEMENTED)"
NO_RAFT = (
    "this broker has no Raft membership to manage (cluster metadata lives in etcd); "
    "use `danube-admin brokers list` to see the cluster"
)


async def _call(client: AdminClient, what: str, request: Awaitable[T]) -> T:
    try:
        return await client.call(what, request)
    except Refused as error:
        if error.status is Status.UNIMPLEMENTED:
            raise AdminError(f"{error}; {NO_RAFT}") from None
        raise


async def status(client: AdminClient, _: argparse.Namespace) -> Result:
    answer = await _call(client, "cluster status", client.cluster.cluster_status(pb.Empty()))
    text = fields(
        [
            ("leader_id", answer.leader_id),
            ("current_term", answer.current_term),
            ("last_applied", answer.last_applied),
            ("voters", list(answer.voters)),
            ("learners", list(answer.learners)),
            ("self_node_id", answer.self_node_id),
            ("raft_addr", answer.raft_addr),
        ]
    )
    return Result(plain(answer), text)


async def add_node(client: AdminClient, args: argparse.Namespace) -> Result:
    """As Danube's CLI: asks the new node who it is, then adds it as a learner."""
    new = AdminClient(args.node_addr, client.timeout_s)
    try:
        found = await _call(
            new, f"status of {args.node_addr}", new.cluster.cluster_status(pb.Empty())
        )
    finally:
        new.close()
    request = pb.AddNodeRequest(addr=found.raft_addr, node_id=found.self_node_id)
    answer = await _call(client, f"add node {found.self_node_id}", client.cluster.add_node(request))
    return Result(plain(answer), answer.message or f"Added node {answer.node_id} as a learner")


async def promote_node(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.PromoteNodeRequest(node_id=args.node_id)
    answer = await _call(
        client, f"promote node {args.node_id}", client.cluster.promote_node(request)
    )
    return Result(plain(answer), answer.message or f"Promoted node {args.node_id} to voter")


async def remove_node(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.RemoveNodeRequest(node_id=args.node_id)
    answer = await _call(client, f"remove node {args.node_id}", client.cluster.remove_node(request))
    return Result(plain(answer), answer.message or f"Removed node {args.node_id}")


def add_cluster_commands(commands: Actions) -> None:
    actions = group(commands, "cluster", "Raft membership (Danube's Raft mode only)")
    command(actions, "status", "show the Raft leader, term and members", status, NEEDS)
    sub = command(actions, "add-node", "add a node to the Raft group as a learner", add_node, NEEDS)
    sub.add_argument("--node-addr", required=True, help="the new node's admin URL")
    sub = command(actions, "promote-node", "make a learner a voter", promote_node, NEEDS)
    sub.add_argument("--node-id", type=count, required=True)
    sub = command(actions, "remove-node", "remove a node from the voters", remove_node, NEEDS)
    sub.add_argument("--node-id", type=count, required=True)
