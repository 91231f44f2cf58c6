"""`danube-admin brokers ...`: the cluster's brokers, their leader, draining one for
maintenance and spreading topics evenly again (BrokerAdmin)."""

from __future__ import annotations

import argparse
import asyncio
import http.client
import re
import ssl
import urllib.request

import danube.proto_compat  # noqa: F401  (ClusterBalanceResponse decodes)
from danube.cli.admin_args import Actions, command, group, positive
from danube.cli.admin_call import AdminClient, require_success
from danube.cli.admin_render import Result, fields, plain, table
from danube.client.security import ClientSecurity
from danube.proto import danube_admin as pb

CLUSTER = "cluster mode (etcd) with at least two brokers"


async def list_brokers(client: AdminClient, _: argparse.Namespace) -> Result:
    answer = await client.call("list brokers", client.brokers.list_brokers(pb.Empty()))
    rows = [
        (b.broker_id, b.broker_role, b.broker_status, b.broker_addr, b.admin_addr, b.metrics_addr)
        for b in answer.brokers
    ]
    text = table(
        ("broker_id", "role", "status", "broker_addr", "admin_addr", "metrics_addr"),
        rows,
        "no brokers registered",
    )
    return Result(plain(answer), text)


MEMORY_SCRAPE_TIMEOUT_S = 5.0


_SAMPLE = re.compile(r"^(danube_memory_\w+)(?:\{([^}]*)\})?\s+(\S+)")
_POOL = re.compile(r'(?:^|,)pool="([^"]*)"')
_TOPIC = re.compile(r'(?:^|,)topic="([^"]*)"')
_SUBSCRIPTION = re.compile(r'(?:^|,)subscription="([^"]*)"')


def memory_of(exposition: str) -> dict[str, float]:
    """The `danube_memory_*` samples of a broker's metrics page, by name (and pool, or topic
    and subscription: `name:pool`, `name:topic`, `name:topic:subscription`). Read
    with a line pattern, not prometheus_client's parser: the admin tool is part of the
    client install, which has no prometheus_client (tests/core/test_packaging.py)."""
    found: dict[str, float] = {}
    for line in exposition.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        labels = labels or ""
        parts = [name]
        for pattern in (_POOL, _TOPIC, _SUBSCRIPTION):
            label = pattern.search(labels)
            if label is not None:
                parts.append(label.group(1))
        try:
            found[":".join(parts)] = float(value)
        except ValueError:
            continue
    return found


def _scrape(address: str, security: ClientSecurity | None) -> str:
    """A broker's metrics page. A broker whose admin port is secured serves it over TLS
    (the same CA), whatever scheme its advertised address says."""
    context = None
    headers = {}
    if security is not None and security.uses_tls:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=security.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if security.cert_file is not None:  # mutual TLS: the certificate is the identity
            context.load_cert_chain(security.cert_file, security.key_file)
        address = "https://" + address.split("://", 1)[-1]
        if security.token:  # a secured /metrics needs Lookup on the cluster
            headers["Authorization"] = f"Bearer {security.token}"
    elif "://" not in address:
        address = "http://" + address
    request = urllib.request.Request(f"{address}/metrics", headers=headers)
    with urllib.request.urlopen(
        request, timeout=MEMORY_SCRAPE_TIMEOUT_S, context=context
    ) as answer:
        return str(answer.read().decode())


def _scrape_error(error: Exception) -> Exception:
    """A readable reason: `BadStatusLine`'s text is only the line it could not parse."""
    if isinstance(error, http.client.BadStatusLine):
        return ValueError(f"not an HTTP answer (first line {str(error)[:60]!r})")
    return error


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


async def memory(client: AdminClient, _: argparse.Namespace) -> Result:
    """Each broker's memory budget and pools, read from its metrics endpoint (the address
    ListBrokers gives: Danube's BrokerInfo has no field for them; spec/memory.md)."""
    answer = await client.call("list brokers", client.brokers.list_brokers(pb.Empty()))
    data: list[dict[str, object]] = []
    rows = []
    for broker in answer.brokers:
        row: dict[str, object] = {"broker_id": broker.broker_id}
        try:
            if not broker.metrics_addr:
                raise OSError("the broker runs without a metrics endpoint")
            page = await asyncio.to_thread(_scrape, broker.metrics_addr, client.security)
            found = memory_of(page)
        except (OSError, ValueError, http.client.HTTPException) as error:
            # HTTPException: something that is not an HTTP server answered at the metrics
            # address (BadStatusLine, RemoteDisconnected is an OSError too): a row, not a
            # traceback (review finding).
            error = _scrape_error(error)
            row["error"] = str(error)
            rows.append((broker.broker_id, f"metrics unreachable: {error}", *[""] * 10))
            data.append(row)
            continue
        row.update(found)
        data.append(row)

        def pool(name: str, found: dict[str, float] = found) -> str:
            used = found.get(f"danube_memory_pool_used_bytes:{name}")
            size = found.get(f"danube_memory_pool_bytes:{name}")
            return f"{_mib(used)} / {_mib(size)}"

        rows.append(
            (
                broker.broker_id,
                _mib(found.get("danube_memory_budget_bytes")),
                pool("cache"),
                pool("publish"),
                _mib(found.get("danube_memory_publish_borrowed_bytes")),
                pool("consumer"),
                pool("state"),
                f"{found.get('danube_memory_publish_paused_seconds_total', 0):.1f}",
                int(found.get("danube_memory_publish_refused_total", 0)),
                _mib(found.get("danube_memory_rss_bytes")),
                _mib(found.get("danube_memory_unaccounted_bytes")),
                _mib(found.get("danube_memory_rss_squeeze_bytes")),
            )
        )
    text = table(
        (
            "broker_id",
            "budget_mib",
            "cache_mib",
            "publish_mib",
            "borrowed_mib",
            "consumer_mib",
            "state_mib",
            "paused_s",
            "refused",
            "rss_mib",
            "unaccounted_mib",
            "squeeze_mib",
        ),
        rows,
        "no brokers registered",
    )
    return Result(data, text)


async def leader(client: AdminClient, _: argparse.Namespace) -> Result:
    answer = await client.call("leader broker", client.brokers.get_leader_broker(pb.Empty()))
    return Result(plain(answer), answer.leader or "no leader elected yet")


async def namespaces(client: AdminClient, _: argparse.Namespace) -> Result:
    answer = await client.call("list namespaces", client.brokers.list_namespaces(pb.Empty()))
    rows = [(name,) for name in answer.namespaces]
    return Result(plain(answer), table(("namespace",), rows, "no namespaces"))


async def unload(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.UnloadBrokerRequest(
        broker_id=args.broker_id,
        max_parallel=args.max_parallel,
        namespaces_include=args.namespaces_include or [],
        namespaces_exclude=args.namespaces_exclude or [],
        dry_run=args.dry_run,
        timeout_seconds=args.unload_timeout,
    )
    deadline = client.long_call(args.unload_timeout)
    answer = await client.call(
        f"unload broker {args.broker_id}",
        client.brokers.unload_broker(request, timeout=deadline),
        timeout_s=deadline,
    )
    if args.dry_run:
        head = f"Dry run: would unload {answer.total} topics from broker {args.broker_id}"
    else:
        head = f"Unloading broker {args.broker_id}: {answer.total} topics"
    counts = (
        f"{head} (succeeded {answer.succeeded}, failed {answer.failed}, pending {answer.pending})"
    )
    if answer.failed_topics:
        counts += "\nfailed topics: " + ", ".join(answer.failed_topics)
    return Result(plain(answer), counts)


async def activate(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.ActivateBrokerRequest(broker_id=args.broker_id, reason=args.reason)
    what = f"activate broker {args.broker_id}"
    answer = await client.call(what, client.brokers.activate_broker(request))
    require_success(what, answer.success)
    return Result(plain(answer), f"Activated broker {args.broker_id} ({args.reason})")


async def balance(client: AdminClient, _: argparse.Namespace) -> Result:
    request = pb.ClusterBalanceRequest()
    answer = await client.call("cluster balance", client.brokers.get_cluster_balance(request))
    summary = fields(
        [
            ("brokers", answer.broker_count),
            ("assignment strategy", answer.assignment_strategy),
            ("coefficient of variation", answer.coefficient_of_variation),
            ("mean load", answer.mean_load),
            ("min load", answer.min_load),
            ("max load", answer.max_load),
            ("std deviation", answer.std_deviation),
        ]
    )
    rows = [
        (b.broker_id, b.load, b.topic_count, b.is_overloaded, b.is_underloaded)
        for b in answer.brokers
    ]
    loads = table(
        ("broker_id", "load", "topics", "overloaded", "underloaded"), rows, "no broker loads"
    )
    return Result(plain(answer), f"{summary}\n\n{loads}")


async def rebalance(client: AdminClient, args: argparse.Namespace) -> Result:
    request = pb.RebalanceRequest(dry_run=args.dry_run, max_moves=args.max_moves)
    answer = await client.call("rebalance", client.brokers.trigger_rebalance(request))
    require_success("rebalance", answer.success, answer.error_message)
    moves = table(
        ("topic", "from_broker", "to_broker", "estimated_load", "reason"),
        [
            (m.topic_name, m.from_broker, m.to_broker, m.estimated_load, m.reason)
            for m in answer.proposed_moves
        ],
        "no moves proposed",
    )
    if args.dry_run:
        head = f"Dry run: {len(answer.proposed_moves)} proposed moves"
    else:
        head = f"Rebalance started: {answer.moves_executed} moves executed"
    note = f"\n{answer.error_message}" if answer.error_message else ""
    return Result(plain(answer), f"{head}{note}\n{moves}")


def add_broker_commands(commands: Actions) -> None:
    actions = group(commands, "brokers", "list, drain, activate and balance brokers")
    command(actions, "list", "list the cluster's brokers with role and status", list_brokers,
            "BrokerAdmin/ListBrokers")  # fmt: skip
    command(actions, "memory",
            "show each broker's memory budget, its pools' use (used / size) and the time "
            "producers spent paused", memory,
            "BrokerAdmin/ListBrokers and each broker's metrics endpoint")  # fmt: skip
    command(actions, "leader-broker", "print the cluster leader's broker id", leader,
            "BrokerAdmin/GetLeaderBroker")  # fmt: skip
    command(actions, "namespaces", "list every namespace", namespaces,
            "BrokerAdmin/ListNamespaces")  # fmt: skip

    sub = command(
        actions, "unload",
        "drain a broker: move all its topics (or the filtered ones) to the other brokers "
        "and mark it draining, then drained",
        unload, f"BrokerAdmin/UnloadBroker, {CLUSTER}",
    )  # fmt: skip
    sub.add_argument("--broker-id", required=True, help="the broker to drain")
    sub.add_argument("--max-parallel", type=positive, default=1,
                     help="topics unloaded at once (default 1)")  # fmt: skip
    sub.add_argument("--namespaces-include", action="append", metavar="NS",
                     help="only topics of this namespace (repeatable)")  # fmt: skip
    sub.add_argument("--namespaces-exclude", action="append", metavar="NS",
                     help="skip topics of this namespace (repeatable)")  # fmt: skip
    sub.add_argument("--dry-run", action="store_true", help="count the topics, move nothing")
    sub.add_argument("--timeout", dest="unload_timeout", type=positive, default=60,
                     help="seconds to wait for the topics to move (default 60); the answer "
                          "counts those still moving as pending, and they keep moving")  # fmt: skip

    sub = command(
        actions, "activate", "make a drained or draining broker take topics again",
        activate, "BrokerAdmin/ActivateBroker, cluster mode",
    )  # fmt: skip
    sub.add_argument("--broker-id", required=True, help="the broker to activate")
    sub.add_argument("--reason", default="admin_activate",
                     help="recorded with the state (default admin_activate)")  # fmt: skip

    command(actions, "balance", "show how evenly load is spread over the brokers", balance,
            "BrokerAdmin/GetClusterBalance, cluster mode; any broker passes it to the leader, "
            "whose view it shows")  # fmt: skip

    sub = command(
        actions, "rebalance", "move topics from loaded brokers to idle ones (or only propose)",
        rebalance,
        "BrokerAdmin/TriggerRebalance, cluster mode with load_manager.rebalancing configured; "
        "any broker passes it to the leader",
    )  # fmt: skip
    sub.add_argument("--dry-run", action="store_true", help="propose moves, make none")
    sub.add_argument("--max-moves", type=positive, help="stop after this many moves")
