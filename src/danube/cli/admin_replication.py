"""`danube-admin namespaces replication-factor` and `topics replication-factor`: show, set or
clear the replication factor of a namespace or a topic (our PolicyAdmin extension; cluster
mode; spec/replication.md, "Replication factor"). Shared by both groups so that they read and
print the same way."""

from __future__ import annotations

import argparse

from danube.cli.admin_args import Actions, Handler, add_topic, command, positive, topic_name
from danube.cli.admin_call import AdminClient, BadUsage
from danube.cli.admin_render import Result, fields, plain
from danube.proto import danube_ext as ext_pb

HELP = (
    "show, set (--set N) or clear (--clear) the replication factor of a {what}: copies of "
    "each topic, the owner included (1: no replication); a topic's own factor wins over its "
    "namespace's, which wins over cluster.replication_factor (default: 2 when at least two "
    "brokers are active); the leader then adds or drops followers"
)
NEEDS = (
    "PolicyAdmin/SetReplicationFactor and GetReplicationFactor (a danube-py broker, cluster mode)"
)


def _render(answer: ext_pb.ReplicationFactorResponse, head: str, *, topic: bool) -> Result:
    def shown(value: int) -> object:
        return value or "-"

    rows: list[tuple[str, object]] = [("own", shown(answer.own))]
    if topic:
        rows.append(("namespace", shown(answer.namespace_factor)))
    rows += [
        ("cluster", shown(answer.cluster_factor)),
        ("in force" if topic else "in force for its topics", answer.effective),
        ("from", answer.source),
        ("active brokers", answer.active_brokers),
    ]
    body = fields(rows)
    return Result(plain(answer), f"{head}\n{body}" if head else body)


def _handler(kind: str) -> Handler:
    async def run(client: AdminClient, args: argparse.Namespace) -> Result:
        name = topic_name(args) if kind == "topic" else args.namespace
        if args.set is not None and args.clear:
            raise BadUsage("give --set N or --clear, not both")
        if args.set is None and not args.clear:
            what = f"replication factor of {kind} {name}"
            request = ext_pb.PoliciesRequest(name=name)
            answer = await client.call(what, client.policies.get_replication_factor(request))
            return _render(answer, "", topic=kind == "topic")
        factor = 0 if args.clear else args.set
        verb = "clear" if args.clear else "set"
        what = f"{verb} the replication factor of {kind} {name}"
        change = ext_pb.SetReplicationFactorRequest(name=name, replication_factor=factor)
        answer = await client.call(what, client.policies.set_replication_factor(change))
        done = (
            f"Cleared the replication factor of {kind} {name}"
            if args.clear
            else (f"Set the replication factor of {kind} {name} to {factor}")
        )
        return _render(answer, done, topic=kind == "topic")

    return run


def add_replication_factor_command(actions: Actions, kind: str) -> None:
    """`<group> replication-factor` for `kind` "namespace" or "topic"."""
    sub = command(actions, "replication-factor", HELP.format(what=kind), _handler(kind), NEEDS)
    if kind == "topic":
        add_topic(sub)
    else:
        sub.add_argument("namespace", help="the namespace's name, e.g. default")
    change = sub.add_mutually_exclusive_group()
    change.add_argument("--set", type=positive, metavar="N", help="make the factor N (>= 1)")
    change.add_argument(
        "--clear", action="store_true",
        help=f"drop the {kind}'s own factor"
        + (": its namespace's or the cluster's applies" if kind == "topic" else ""),
    )  # fmt: skip
