"""`danube-local-cluster`: etcd, an S3-compatible server (moto's) and N brokers in cluster
mode on this machine, until Ctrl-C or `quit`; then every process stops cleanly. A broker
that dies is reported and the rest keep running (that is what the cluster is for: trying
failover); commands on standard input kill, stop, restart or add brokers
(`danube.localcluster.control`)."""

from __future__ import annotations

import argparse
import importlib.util
import queue
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from danube.cli.usage import add_completion_flag, add_version
from danube.localcluster.control import HELP, Command, CommandError, parse_command

if TYPE_CHECKING:
    from danube.localcluster.broker_process import BrokerProcess
    from danube.localcluster.cluster import LocalCluster

EXTRA = "pip install 'pydanube[broker,local-cluster]'"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danube-local-cluster",
        description="Start a local Danube cluster: etcd, an S3-compatible server and brokers "
        "in cluster mode on loopback, with all data under --dir. A broker that dies is "
        "reported and the others keep running; type `help` for the commands that kill, stop, "
        "restart or add brokers. Ctrl-C or `quit` stops everything.",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("danube-cluster"),
        help="data directory (default ./danube-cluster)",
    )
    parser.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    parser.add_argument(
        "--first-port",
        type=int,
        default=6650,
        help="broker i listens on first-port + 2i, its admin port on the next and serves "
        "metrics on 9040 + i (default 6650; 0 picks free ports for all)",
    )
    parser.add_argument(
        "--lease-ttl-ms",
        type=int,
        default=3_000,
        help="how long a dead broker keeps its topics before they fail over (default 3000)",
    )
    parser.add_argument(
        "--durability",
        choices=["fsync", "flush", "object"],
        default="fsync",
        help="storage.wal.durability of every topic (default fsync; spec/durability.md)",
    )
    parser.add_argument(
        "--replication-lag-ms",
        type=int,
        default=None,
        help="cluster.replication.lag_ms: how long a topic's owner waits for a silent "
        "follower before acknowledging without it (default: the broker's, 1000; "
        "spec/replication.md)",
    )
    parser.add_argument(
        "--auth-config",
        type=Path,
        default=None,
        help="a YAML file whose `auth` section every broker gets: TLS, tokens, RBAC "
        "(spec/security.md); the secrets come from the environment: DANUBE_JWT_SECRET_KEY and "
        "DANUBE_CLUSTER_KEY (the key brokers prove themselves to each other with)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="delete --dir first (start with no data)"
    )
    add_version(parser)
    add_completion_flag(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.brokers < 1:
        print("danube-local-cluster: --brokers must be at least 1", file=sys.stderr)
        return 2
    try:  # after parsing: --help and --version need no broker (issue 26)
        from danube.localcluster.cluster import ClusterSettings, LocalCluster
    except ImportError as error:
        print(
            f"danube-local-cluster: needs the `broker` extra, which is not installed ({error}): "
            "pip install 'pydanube[broker]' (and the local-cluster extra: "
            f"{EXTRA})",
            file=sys.stderr,
        )
        return 1
    if importlib.util.find_spec("moto") is None:
        print(
            "danube-local-cluster: the S3 server is moto's, which is not installed: " + EXTRA,
            file=sys.stderr,
        )
        return 1
    try:
        auth = _auth_section(args.auth_config)
    except (OSError, ValueError) as error:
        print(f"danube-local-cluster: --auth-config: {error}", file=sys.stderr)
        return 2
    if args.fresh:
        shutil.rmtree(args.dir, ignore_errors=True)
    settings = ClusterSettings(
        brokers=args.brokers,
        lease_ttl_ms=args.lease_ttl_ms,
        durability=args.durability,
        first_port=args.first_port,
        replication_lag_ms=args.replication_lag_ms,
        auth=auth,
    )
    if auth is not None and auth.get("mode", "none") != "none":
        SCHEME[0] = "https"
    commands: queue.Queue[str | None] = queue.Queue()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: commands.put(None))
    cluster = LocalCluster(args.dir.resolve(), settings)
    print(f"starting etcd, the S3 server and {args.brokers} brokers under {args.dir} ...")
    try:
        cluster.start()
    except (RuntimeError, OSError) as error:
        print(f"danube-local-cluster: {error}", file=sys.stderr)
        return 1
    print(f"etcd:      {cluster.etcd.endpoint}")
    print(f"S3:        {cluster.s3.endpoint} (bucket {cluster.s3.bucket})")
    for index, broker in enumerate(cluster.brokers):
        print(_describe(index, broker))
    print(f"service URL for clients: {','.join(cluster.service_urls)}")
    print(
        f"logs: {args.dir}/broker-N/broker.log; type help for commands; Ctrl-C stops the cluster",
        flush=True,
    )
    threading.Thread(target=_read_lines, args=(sys.stdin, commands), daemon=True).start()
    try:
        _supervise(cluster, commands)
    finally:
        print("stopping the cluster ...", flush=True)
        cluster.stop()
    print("stopped")
    return 0


def _auth_section(path: Path | None) -> dict[str, object] | None:
    """The `auth` mapping of the file (the whole file when it has no `auth` key), with its
    relative file paths made absolute: the brokers run in their own directories."""
    if path is None:
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"not YAML ({error})") from None
    if not isinstance(data, dict):
        raise ValueError("expected a mapping")
    auth = data.get("auth", data)
    if not isinstance(auth, dict):
        raise ValueError("auth: expected a mapping")
    tls = auth.get("tls")
    if isinstance(tls, dict):
        for key in ("cert_file", "key_file", "ca_file"):
            if isinstance(tls.get(key), str):
                tls[key] = str((path.parent / tls[key]).resolve())
    jwt = auth.get("jwt")
    if isinstance(jwt, dict) and isinstance(jwt.get("public_key_file"), str):
        jwt["public_key_file"] = str((path.parent / jwt["public_key_file"]).resolve())
    return auth


SCHEME = ["http"]
"""`https` once the brokers are secured (--auth-config): what `_describe` prints."""


def _describe(index: int, broker: BrokerProcess) -> str:
    if not broker.alive:
        code = broker.process.poll() if broker.process is not None else None
        return f"broker {index}:  exited (status {code}); `restart {index}` starts it again"
    scheme = SCHEME[0]
    return (
        f"broker {index}:  {scheme}://{broker.broker_addr}  admin {scheme}://{broker.admin_addr}"
        f"  metrics {scheme}://{broker.metrics_addr}/metrics  pid {broker.pid}"
    )


def _read_lines(stream: TextIO | None, commands: queue.Queue[str | None]) -> None:
    """Standard input's lines to the supervisor. At its end (a closed or detached stdin) the
    cluster keeps running until Ctrl-C."""
    if stream is None:
        return
    try:
        for line in stream:
            commands.put(line)
    except (OSError, ValueError):
        return


def _supervise(cluster: LocalCluster, commands: queue.Queue[str | None]) -> None:
    """Reports brokers that exit on their own and carries out commands until `quit`, Ctrl-C
    or SIGTERM (a None on the queue)."""
    reported: set[int] = set()
    while True:
        for index, broker in enumerate(cluster.brokers):
            if not broker.alive and index not in reported:
                reported.add(index)
                code = broker.process.poll() if broker.process is not None else None
                tail = "\n".join(f"  {line}" for line in broker.log_lines[-5:])
                print(
                    f"broker {index} exited (status {code}); the others keep running, its "
                    f"topics fail over once its lease expires; `restart {index}` starts it "
                    f"again. Its last log lines:\n{tail}",
                    flush=True,
                )
        try:
            line = commands.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            return
        try:
            command = parse_command(line, len(cluster.brokers))
        except CommandError as error:
            print(f"? {error}", flush=True)
            continue
        if command is None:
            continue
        if command.verb == "quit":
            return
        _carry_out(cluster, command, reported)


def _carry_out(cluster: LocalCluster, command: Command, reported: set[int]) -> None:
    index = command.broker
    if command.verb == "help":
        print(HELP)
    elif command.verb == "status":
        for i, broker in enumerate(cluster.brokers):
            print(_describe(i, broker))
        print(f"service URL for clients: {','.join(cluster.service_urls)}")
    elif command.verb == "add":
        try:
            broker = cluster.add_broker()
        except RuntimeError as error:
            print(f"? the new broker did not start: {error}")
        else:
            print(_describe(len(cluster.brokers) - 1, broker))
    else:
        assert index is not None
        broker = cluster.brokers[index]
        if command.verb == "restart":
            if broker.alive:
                print(f"? broker {index} is running; kill or stop it first")
            else:
                try:
                    cluster.restart_broker(index)
                except RuntimeError as error:
                    print(f"? broker {index} did not start again: {error}")
                else:
                    reported.discard(index)
                    print(_describe(index, broker))
        elif not broker.alive:
            print(f"? broker {index} is not running")
        else:
            reported.add(index)  # the operator's doing: no report of a death
            if command.verb == "kill":
                broker.kill()
            else:
                broker.stop(signal.SIGTERM, timeout=45)
            print(f"broker {index} {'killed' if command.verb == 'kill' else 'stopped'}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
