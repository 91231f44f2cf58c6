"""`danube-broker`: run a broker. With no arguments, a standalone broker on 127.0.0.1:6650 with
its data under ./danube-data.

The broker's modules (trio, numba, the servers) are imported once the flags are parsed:
`--help`, `--version` and `--completion` answer in a tenth of a second (issue 26)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from danube.cli.broker_auth import add_auth_arguments, apply_auth_arguments
from danube.cli.environment import apply_environment
from danube.cli.logs import FORMATS, setup_logging
from danube.cli.usage import add_completion_flag, add_version

if TYPE_CHECKING:
    from danube.values.config import BrokerConfig

log = logging.getLogger("danube.runtime")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danube-broker",
        description="Run a Danube-compatible broker. Without arguments it runs standalone on "
        "127.0.0.1:6650 (admin 127.0.0.1:50051) with embedded metadata in ./danube-data.",
        epilog="Every --some-flag may also be set as DANUBE_SOME_FLAG in the environment "
        "(a flag given wins; both win over --config-file). spec/configuration.md lists them.",
    )
    parser.add_argument(
        "--mode",
        choices=["standalone", "cluster"],
        default="standalone",
        help="standalone: one broker with an embedded metadata store (default); cluster: "
        "brokers share etcd and an object store, topics are placed and moved among them",
    )
    parser.add_argument(
        "--etcd-endpoints",
        help=(
            "cluster mode: etcd endpoints, comma-separated: host:port or https://host:port "
            "(meta_store.etcd_endpoints; TLS settings in meta_store.etcd_tls)"
        ),
    )
    parser.add_argument(
        "--storage-mode",
        choices=["local", "shared_fs", "object_store"],
        help="storage.mode (cluster mode needs shared_fs or object_store)",
    )
    parser.add_argument(
        "--durable-root",
        help="storage.durable.root: s3://bucket/prefix, file:///path or a path",
    )
    parser.add_argument(
        "--s3-endpoint", help="storage.durable.endpoint: an S3-compatible endpoint URL"
    )
    parser.add_argument(
        "--config-file", type=Path, help="YAML file with Danube's keys; flags override it"
    )
    parser.add_argument(
        "--broker-addr",
        help="client gRPC host:port (default 127.0.0.1:6650); a non-loopback host opens only "
        "this port to the network, never the admin or metrics port",
    )
    parser.add_argument(
        "--admin-addr",
        help="admin gRPC host:port (default 127.0.0.1:50051, or broker.admin_host; on the "
        "client host only when that is loopback). Cluster brokers on several hosts need an "
        "address the others can reach: they forward admin calls here",
    )
    parser.add_argument(
        "--prom-exporter",
        metavar="HOST:PORT|off",
        help="metrics and health endpoint (default 127.0.0.1:9040, or broker.prometheus_host; "
        "on the client host only when that is loopback; port 0 picks a free one; off: none)",
    )
    parser.add_argument(
        "--metrics-per-topic",
        choices=["on", "off"],
        help="metrics.per_topic: series per topic and subscription (on, the default) or summed "
        "per broker (off), so many topics cannot blow up a scrape",
    )
    parser.add_argument(
        "--advertised-addr", help="host:port clients are told to connect to (default: bind addr)"
    )
    parser.add_argument(
        "--advertised-admin-addr",
        help="host:port other brokers reach the admin port by, for forwarded admin calls and "
        "replication (behind NAT or a proxy; default: the admin bind addr)",
    )
    parser.add_argument(
        "--data-dir",
        help="the WAL (<dir>/wal) and, standalone, the metadata (default ./danube-data)",
    )
    parser.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="broker.memory_budget: what hot caches, publish buffers and consumer queues may "
        "take together, e.g. 256MiB or 2G (default half the machine's memory or cgroup limit; "
        "spec/memory.md)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="broker.grpc.max_connections: connections kept open at once on the client "
        "port; more are refused as they arrive (default 0: derived from the memory budget, "
        "half the state share at 40 KiB a connection; the admin port has its own cap, "
        "broker.grpc.max_admin_connections; "
        "spec/memory.md)",
    )
    parser.add_argument(
        "--keepalive-time-ms",
        type=int,
        help="broker.grpc.keepalive_time_ms: PING a connection with open streams after this "
        "long without a frame from it (default 30000)",
    )
    parser.add_argument(
        "--keepalive-timeout-ms",
        type=int,
        help="broker.grpc.keepalive_timeout_ms: close the connection when the PING is not "
        "answered within this; its streams end, a frozen consumer loses its subscription "
        "(default 20000)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines written to stderr (default info)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text: `time level=... logger=... event=... key=value` lines (default); json: "
        "one JSON object per line, the message's key=value pairs as fields",
    )
    parser.add_argument(
        "--warm-kernels",
        action="store_true",
        help="compile the numba kernels into numba's cache (NUMBA_CACHE_DIR, else next to "
        "the sources when writable) and exit: for an image's build step, so its brokers "
        "start without compiling",
    )
    add_auth_arguments(parser)
    add_version(parser)
    add_completion_flag(parser)
    return parser


def load_config(args: argparse.Namespace) -> BrokerConfig:
    import yaml

    from danube.values.config import (
        Address,
        BrokerConfig,
        ConfigError,
        config_from_mapping,
        etcd_endpoints,
        etcd_transport,
        grpc_config,
        memory_budget,
        prometheus_address,
        storage_with,
    )

    config = BrokerConfig()
    if args.config_file is not None:
        try:
            text = args.config_file.read_text()
        except OSError as error:
            raise ConfigError(f"cannot read {args.config_file}: {error.strerror}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{args.config_file} is not valid YAML: {error}") from None
        config = config_from_mapping(data)
    if args.broker_addr:
        config = config.with_broker_addr(Address.parse(args.broker_addr, "--broker-addr"))
    overrides: dict[str, object] = {}
    if args.admin_addr:
        overrides["admin_addr"] = Address.parse(args.admin_addr, "--admin-addr")
        overrides["admin_host_own"] = True
    if args.prom_exporter:
        overrides["prometheus_addr"] = prometheus_address(args.prom_exporter, "--prom-exporter")
        overrides["prometheus_host_own"] = True
    if args.metrics_per_topic:
        overrides["metrics_per_topic"] = args.metrics_per_topic == "on"
    if args.advertised_addr:
        Address.parse(args.advertised_addr, "--advertised-addr")
        overrides["advertised_addr"] = args.advertised_addr
    if args.advertised_admin_addr:
        Address.parse(args.advertised_admin_addr, "--advertised-admin-addr")
        overrides["advertised_admin_addr"] = args.advertised_admin_addr
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.memory_budget:
        overrides["memory_budget"] = memory_budget(args.memory_budget, "--memory-budget")
    grpc_flags = {
        key: value
        for key, value in (
            ("keepalive_time_ms", args.keepalive_time_ms),
            ("keepalive_timeout_ms", args.keepalive_timeout_ms),
            ("max_connections", args.max_connections),
        )
        if value is not None
    }
    if grpc_flags:
        overrides["grpc"] = grpc_config(grpc_flags, config.grpc)
    overrides["mode"] = args.mode
    overrides["auth"] = apply_auth_arguments(config.auth, args)
    if args.mode == "cluster" and config.cluster_name == "STANDALONE":
        overrides["cluster_name"] = "danube"
    if args.etcd_endpoints:
        endpoints = etcd_endpoints(args.etcd_endpoints, "--etcd-endpoints")
        tls = etcd_transport(endpoints, config.cluster.etcd_tls)
        overrides["cluster"] = dataclasses.replace(
            config.cluster, etcd_endpoints=endpoints, etcd_tls=tls
        )
    storage = config.storage
    if args.storage_mode or args.durable_root or args.s3_endpoint:
        storage = storage_with(
            storage,
            mode=args.storage_mode,
            durable_root=args.durable_root,
            endpoint=args.s3_endpoint,
        )
        overrides["storage"] = storage
    result = dataclasses.replace(config, **overrides)
    result.check_mode()
    return result


async def _run(config: BrokerConfig) -> None:
    """Serves until SIGINT or SIGTERM; a second signal during shutdown is only logged."""
    import trio

    from danube.runtime.server import serve

    shutdown = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if shutdown.is_set():
                        log.info("event=signal_ignored signal=%s reason=already_stopping", name)
                    else:
                        log.info("event=signal_received signal=%s", name)
                        shutdown.set()

            nursery.start_soon(watch_signals)
            await serve(config, shutdown)
            nursery.cancel_scope.cancel()


def _only_error(error: BaseException) -> BaseException:
    """The single error inside (nested) exception groups, or the group itself: trio wraps a
    failure inside a nursery, and start-up errors should still read as one line."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


BROKER_EXTRA = (
    "danube-broker: the broker needs the `broker` extra, which is not installed ({error}): "
    "pip install 'pydanube[broker]'"
)


ALLOCATOR_ENV = "PYTHONMALLOC"
"""The allocator the broker runs on is CPython's unless this says otherwise; logged at start
(`event=allocator`). glibc's (`PYTHONMALLOC=malloc`) gives back what closed streams freed but
fragments under message load: a 1,000-topic soak at 294 msg/s peaked at 360 MiB of RSS under a
256 MiB budget with it (bench/RESULTS.md, issue 28 part 7; spec/memory.md, "Giving memory
back"), so it is not the default."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    apply_environment(parser)
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    log.info("event=allocator pythonmalloc=%s", os.environ.get(ALLOCATOR_ENV, "-"))
    try:
        # numba is looked up, not imported: with the ahead-of-time kernels the broker never
        # imports it (about 125 MiB of RSS, danube.kernels.loaded).
        if importlib.util.find_spec("numba") is None:
            raise ImportError("No module named 'numba'")
        import trio
        import yaml  # noqa: F401
    except ImportError as error:  # the base install is the client alone (README, Installing)
        print(BROKER_EXTRA.format(error=error), file=sys.stderr)
        return 1
    if args.warm_kernels:
        from danube.runtime.kernels_warm import warm_kernels

        warmed = warm_kernels()
        log.info(
            "event=kernels_ready seconds=%.2f build=%s cache_dir=%s",
            warmed.seconds,
            warmed.build,
            warmed.cache_dir,
        )
        return 0
    # Outside the signal receiver (before it opens, and after it closes with the broker
    # stopped) a SIGINT or SIGTERM must not kill the process half-way: ignore them there.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    from danube.metadata import MetadataError
    from danube.runtime.memory_dump import install_from_environment
    from danube.values.config import ConfigError

    install_from_environment()  # off unless DANUBE_MEMORY_DUMP is set (a debugging aid)
    try:
        config = load_config(args)
        trio.run(_run, config)
    except BaseException as raised:
        error = _only_error(raised)
        if isinstance(error, ConfigError):
            print(f"danube-broker: configuration error: {error}", file=sys.stderr)
            return 2
        if isinstance(error, OSError | MetadataError):
            print(f"danube-broker: {error}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
