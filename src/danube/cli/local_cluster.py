"""`danube-local-cluster`: etcd, an S3-compatible server (moto's) and N brokers in cluster
mode on this machine, until Ctrl-C; then every process stops cleanly."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
from pathlib import Path

from danube.cli.usage import add_completion_flag, add_version


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danube-local-cluster",
        description="Start a local Danube cluster: etcd, an S3-compatible server and brokers "
        "in cluster mode on loopback, with all data under --dir. Ctrl-C stops everything.",
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
            "danube-local-cluster: needs the `broker` extra, which is not installed "
            f"({error}): pip install 'pydanube[broker]'",
            file=sys.stderr,
        )
        return 1
    if args.fresh:
        shutil.rmtree(args.dir, ignore_errors=True)
    settings = ClusterSettings(
        brokers=args.brokers,
        lease_ttl_ms=args.lease_ttl_ms,
        durability=args.durability,
        first_port=args.first_port,
        replication_lag_ms=args.replication_lag_ms,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
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
        print(
            f"broker {index}:  {broker.url}  admin http://{broker.admin_addr}  "
            f"metrics {broker.metrics_url}/metrics"
        )
    print(f"service URL for clients: {','.join(cluster.service_urls)}")
    print(f"logs: {args.dir}/broker-N/broker.log; Ctrl-C stops the cluster", flush=True)
    try:
        while not stop.wait(0.5):
            for index, broker in enumerate(cluster.brokers):
                if broker.process is not None and broker.process.poll() is not None:
                    print(f"broker {index} exited:\n" + "\n".join(broker.log_lines[-20:]))
                    stop.set()
    finally:
        print("stopping the cluster ...", flush=True)
        cluster.stop()
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
