"""Brings a broker up and down: metadata store, core, gRPC servers, cluster membership (in
cluster mode), shutdown."""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import random
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio_asyncio

from danube import keys
from danube.machines.dispatch import DropReason, QueueLimits
from danube.machines.memory.rss import baseline_warning
from danube.machines.memory.state import topic_costs
from danube.machines.node.core import BrokerCore, BrokerIdentity, ReplicationSettings
from danube.machines.node.idle_producers import short_timeout_warning
from danube.machines.requests.receive import RECEIVE_BATCH
from danube.machines.tiering import UploaderConfig
from danube.machines.wal import records
from danube.metadata import EmbeddedStore, MetadataStore
from danube.proto import danube as pb
from danube.proto import danube_admin as admin_pb
from danube.proto import danube_schema as schema_pb
from danube.runtime import event_loop
from danube.runtime.admin import AdminServices
from danube.runtime.auth import AuthGuard, rbac_of
from danube.runtime.batch_plane import (
    BATCH_REQUEST_LIMIT,
    ConsumerBatchService,
    ProducerExtService,
)
from danube.runtime.broker import BrokerRuntime, persist
from danube.runtime.cluster_admin import ClusterAdminOps
from danube.runtime.cluster_member import ClusterMember
from danube.runtime.data_plane import (
    ConsumerExtService,
    ConsumerService,
    DiscoveryService,
    HealthCheckService,
    ProducerService,
)
from danube.runtime.dead_letter_forward import DeadLetterForward
from danube.runtime.grpc_util import DEFAULT_REQUEST_LIMIT, Server, Unimplemented
from danube.runtime.h2_guard import GatedConnections
from danube.runtime.kernels_warm import warm_kernels
from danube.runtime.memory import broker_pools, connection_gates
from danube.runtime.memory_return import rss_bytes
from danube.runtime.metrics import BrokerMetrics
from danube.runtime.metrics_http import Endpoints, Health, serve_http
from danube.runtime.object_store import ObjectStore
from danube.runtime.peers import configure as configure_peers
from danube.runtime.peers import internal_client
from danube.runtime.placement import ClusterPlacement, LocalPlacement, Placement
from danube.runtime.replication_admin import ReplicationAdminService
from danube.runtime.replication_port import ReplicationPort
from danube.runtime.schema_gate import SchemaGate
from danube.runtime.schema_ports import ClientPortSchemaRegistry
from danube.runtime.schema_service import Offload, SchemaService, in_worker_thread
from danube.runtime.security_admin import SecurityAdminService
from danube.runtime.tls import RELOAD_CHECK_SECONDS, CertificateReloader, client_context
from danube.values.config import (
    Address,
    BrokerConfig,
    ConfigError,
    advertised_admin,
    is_loopback,
    unreachable_admin,
)

log = logging.getLogger("danube.runtime")

CLIENT_PORT_BASES: list[type] = [
    pb.ProducerServiceBase,
    pb.ConsumerServiceBase,
    pb.DiscoveryBase,
    pb.HealthCheckBase,
    pb.StorageServiceBase,
    schema_pb.SchemaRegistryBase,
]
ADMIN_PORT_BASES: list[type] = [
    admin_pb.BrokerAdminBase,
    admin_pb.NamespaceAdminBase,
    admin_pb.TopicAdminBase,
    schema_pb.SchemaRegistryBase,
]
NOT_YET = "this broker version does not offer it yet"
NO_RAFT = (
    "there is no Raft group to manage: the metadata store is etcd (cluster mode) or embedded "
    "(standalone), and etcd manages its own members (etcdctl member add/remove)"
)
SHUTDOWN_GRACE_SECONDS = 2.0
UPLOAD_GRACE_SECONDS = 15.0
"""How long a graceful stop waits for the sealed tails of tiered topics to be uploaded."""
TICK_SECONDS = 0.05
"""Period of the core's timers: adds to the `flush` loss window and to ack-timeout slack."""
DROP_CHECK_SECONDS = 1.0
DROP_REPORT_SECONDS = 10.0
UNLIMITED_MESSAGE_CAP = 256 * 1024 * 1024
"""Transport cap when max_message_size is 0 (unlimited): the broker still must not buffer
whatever length a client claims."""


T = TypeVar("T")
SCHEMA_WORKERS = 2
"""Schema compiles, comparisons and large payload checks at once, in worker threads of their
own limiter: they share the interpreter (the GIL) with everything else the broker does, so
each runs under a step and CPU budget and ends at its next step once its caller gives up
(`schema_service.in_worker_thread`)."""


def _schema_offload(limiter: trio.CapacityLimiter) -> Offload[Any]:
    async def offload(work: Callable[[], T]) -> T:
        run = functools.partial(in_worker_thread, work, limiter)
        result: T = await trio_asyncio.trio_as_aio(run)()
        return result

    return offload


@dataclass(frozen=True, slots=True)
class BoundAddresses:
    broker: Address
    admin: Address
    metrics: Address | None = None
    """The metrics and health endpoint (`broker.ports.prometheus`); None when it is off."""


def _listen(address: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    # IPPROTO_TCP explicitly: grpclib only sets TCP_NODELAY on sockets that say so, and
    # without it every small reply waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address.host, address.port))
    except OSError as error:
        sock.close()
        raise OSError(f"cannot listen on {address}: {error.strerror}") from None
    sock.listen(1024)
    return sock


def _bound(sock: socket.socket, host: str) -> Address:
    return Address(host, sock.getsockname()[1])


def broker_id_for(data_dir: Path) -> str:
    """A random id chosen on first start and kept in the data directory."""
    path = data_dir / "broker_id"
    if path.exists():
        return path.read_text().strip()
    broker_id = str(secrets.randbits(63))
    path.write_text(broker_id + "\n")
    return broker_id


def _message_limit(config: BrokerConfig) -> int:
    size = config.policies.max_message_size
    return (size + DEFAULT_REQUEST_LIMIT) if size else UNLIMITED_MESSAGE_CAP


async def _report_drops(core: BrokerCore) -> None:
    """Non-reliable drops are expected under overload; say so in the log promptly (within a
    second of the first drop) but at most once per period for each topic, subscription and
    reason. A poison policy's drops are logged one by one where they happen
    (`policy_dropped`), not here again."""
    reported: dict[tuple[str, str, str], tuple[int, float]] = {}
    while True:
        await trio.sleep(DROP_CHECK_SECONDS)
        now = trio.current_time()
        for key, count in core.drop_counts().items():
            if key[2] == DropReason.POISON_POLICY.value:
                continue
            last_count, last_time = reported.get(key, (0, -DROP_REPORT_SECONDS))
            if count > last_count and now - last_time >= DROP_REPORT_SECONDS:
                topic, sub, reason = key
                log.warning(
                    "event=messages_dropped topic=%s subscription=%s reason=%s count=%d total=%d",
                    topic, sub, reason, count - last_count, count,
                )  # fmt: skip
                reported[key] = (count, now)


def _replication_settings(config: BrokerConfig, broker_id: str) -> ReplicationSettings:
    """`cluster.replication` (spec/replication.md): the owner skips itself among followers."""
    cluster = config.cluster
    return ReplicationSettings(
        broker_id=broker_id,
        lag_ms=cluster.replication_lag_ms,
        min_in_sync=cluster.replication_min_in_sync,
    )


async def _watch_certificates(reloader: CertificateReloader) -> None:
    """Certificate rotation without restart (`danube.runtime.tls`)."""
    while True:
        await trio.sleep(RELOAD_CHECK_SECONDS)
        reloader.check()


def _warn_if_open(config: BrokerConfig, bound: BoundAddresses) -> None:
    """Safe defaults: without authentication every caller may do everything, which is fine
    on loopback only; any other bind says so loudly at start."""
    if config.auth.enabled:
        return
    exposed = [
        f"{name}={address}"
        for name, address in (
            ("client", bound.broker), ("admin", bound.admin), ("metrics", bound.metrics),
        )
        if address is not None and not is_loopback(address.host)
    ]  # fmt: skip
    if exposed:
        log.warning(
            "event=unauthenticated_network_bind ports=%s: auth.mode is none, so anyone who "
            "reaches these ports may produce, consume, create and delete topics and run "
            "every admin call; set auth.mode tls (spec/security.md) or bind to 127.0.0.1",
            ",".join(exposed),
        )


async def _open_store(config: BrokerConfig, data_dir: Path) -> MetadataStore:
    if config.mode != "cluster":
        return await EmbeddedStore.open(data_dir / "metadata")
    from danube.metadata import EtcdStore  # loads its generated etcd types: only in clusters

    tls, context = config.cluster.etcd_tls, None
    if tls is not None:
        try:
            context = client_context(tls.ca_file, tls.cert_file, tls.key_file)
        except OSError as error:  # ssl.SSLError too: a missing or unusable file
            raise ConfigError(f"meta_store.etcd_tls: {error}") from None
    return await EtcdStore.connect(
        config.cluster.etcd_endpoints, prefix=config.cluster.etcd_prefix, ssl_context=context
    )


async def _run_member(
    member: ClusterMember,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await member.run(task_status=task_status)


async def serve(
    config: BrokerConfig,
    shutdown: trio.Event,
    *,
    task_status: trio.TaskStatus[BoundAddresses] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Runs a broker until `shutdown` is set, then stops cleanly: open receive streams end,
    pending metadata is written, WAL tails are sealed (and uploaded with an object tier), a
    cluster member gives up its lease so its topics move at once, sockets close."""
    config.auth.check()  # whoever built the config: no TLS mode without its files
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    broker_id = broker_id_for(data_dir)
    clustered = config.mode == "cluster"
    # No cyclic collection while the start builds its long-lived state (the store's keys, a
    # record per topic): it is all frozen below (`gc.freeze`) once built, and the collections
    # its allocations set off meanwhile rescanned it again and again: 2.5 of 5.8 CPU seconds
    # of loading and restoring 100,000 topics (issue 23 point 3).
    collecting = gc.isenabled()
    gc.disable()
    try:
        store = await _open_store(config, data_dir)
    except BaseException:
        if collecting:
            gc.enable()
        raise
    sockets: list[socket.socket] = []
    try:
        broker_sock = _listen(config.broker_addr)
        sockets.append(broker_sock)
        admin_sock = _listen(config.admin_addr)
        sockets.append(admin_sock)
        metrics_sock = metrics_addr = None
        if config.prometheus_addr is not None:
            metrics_sock = _listen(config.prometheus_addr)
            sockets.append(metrics_sock)
            metrics_addr = _bound(metrics_sock, config.prometheus_addr.host)
        bound = BoundAddresses(
            _bound(broker_sock, config.broker_addr.host),
            _bound(admin_sock, config.admin_addr.host),
            metrics_addr,
        )
        _warn_if_open(config, bound)
        auth = config.auth
        reloader = CertificateReloader(auth.tls) if auth.tls is not None else None
        peers = configure_peers(auth, broker_id)  # how this broker calls the others (and proves it)
        if reloader is not None:
            reloader.follow(peers.ssl)  # a rotated certificate reaches peer calls too
        client_tls = reloader.grpc if reloader and auth.tls_on("client") else None
        admin_tls = reloader.grpc if reloader and auth.tls_on("admin") else None
        metrics_tls = reloader.http if reloader and auth.tls_on("metrics") else None
        scheme = "https" if client_tls is not None else "http"
        admin_scheme = "https" if admin_tls is not None else "http"
        metrics_scheme = "https" if metrics_tls is not None else "http"
        advertised = config.advertised_addr or str(bound.broker)
        identity = BrokerIdentity(f"{scheme}://{advertised}", f"{scheme}://{advertised}")
        # what other brokers and ListBrokers are told: a wildcard bind named reachably
        admin_seen = advertised_admin(bound.admin, advertised, config.advertised_admin_addr)
        pools = broker_pools(
            config.memory_budget,
            config.publish_wait_ms,
            max_message_bytes=config.policies.max_message_size,
            cache_idle_ms=config.cache_idle_ms,
        )
        pools = dataclasses.replace(
            pools,
            state_costs=topic_costs(tiered=config.storage.tiered, replicated=clustered),
            producer_idle_ms=config.producer_idle_timeout_ms,
        )
        gates = connection_gates(pools.budget, config.grpc)
        connections = GatedConnections(gates["client"])
        admin_connections = GatedConnections(gates["admin"], port="admin")
        core = BrokerCore(
            identity,
            rng=random.Random(secrets.randbits(128)),
            default_policies=config.policies,
            queue_limits=QueueLimits(
                config.dispatch.consumer_queue_messages, config.dispatch.consumer_queue_bytes
            ),
            auto_create_topics=config.auto_create_topics,
            # SegmentFiles fsyncs each write in the same worker-thread call (one I/O round
            # trip per group commit instead of two).
            wal_config=dataclasses.replace(config.storage.wal, synced_writes=True),
            max_unacked_messages=config.dispatch.max_unacked_messages,
            routing_key_of=records.routing_key,
            uploads=UploaderConfig() if config.storage.tiered else None,
            durability=config.storage.durability,
            clustered=clustered,
            replication=_replication_settings(config, broker_id) if clustered else None,
            memory=pools,
        )
        metrics = BrokerMetrics(core, broker_id, config.mode, per_topic=config.metrics_per_topic)
        metrics.connections = gates
        objects = None
        if config.storage.tiered:
            assert config.storage.durable_root is not None
            root, storage = config.storage.durable_root, config.storage
            # In a worker thread: s3fs starts its own asyncio loop (in a thread of its own) on
            # first use, which trio-asyncio refuses inside the trio thread.
            objects = await trio.to_thread.run_sync(
                lambda: ObjectStore(root, endpoint=storage.endpoint, region=storage.region)
            )
            log.info("event=object_tier mode=%s root=%s", config.storage.mode, objects.describe())
        # Cluster mode: the broker owns no topic yet; they come by assignment.
        restored = core.restore(
            {
                kv.key: kv.value
                for kv in await store.scan(keys.NAMESPACES_PREFIX if clustered else "/")
            }
        )
        for effect in core.bootstrap(config.bootstrap_namespaces).effects:
            await persist(store, effect)
        async with event_loop.open_loop() as loop, trio.open_nursery() as nursery:
            runtime = BrokerRuntime(
                core,
                store,
                Path(config.wal_root),
                nursery,
                loop,
                objects,
                metrics=metrics,
                clustered=clustered,
            )
            health = Health(runtime)
            guard = None
            if auth.enabled:

                def consumer_topic(consumer_id: int) -> str | None:
                    record = core.consumer_record(consumer_id)
                    return record.topic.full if record is not None else None

                guard = AuthGuard(
                    auth,
                    consumer_topic=consumer_topic,
                    decided=metrics.authz_done,
                    refused=metrics.authn_failed,
                )
            if metrics_sock is not None:
                endpoints = Endpoints(
                    metrics.exposition_parts,
                    health.not_ready,
                    health.alive,
                    guard.scrape_refused if guard is not None else None,
                )
                nursery.start_soon(serve_http, metrics_sock, endpoints, metrics_tls)
            if reloader is not None:
                nursery.start_soon(_watch_certificates, reloader)
            # The kernels compile (or load from numba's cache) before anything uses them and
            # before the broker says it is ready: a first batch must not pay the compile.
            warmed = await trio.to_thread.run_sync(warm_kernels)
            log.info(
                "event=kernels_ready seconds=%.2f build=%s cache_dir=%s",
                warmed.seconds,
                warmed.build,
                warmed.cache_dir,
            )
            if warmed.why_jit:  # a broker without the ahead-of-time kernels carries numba
                log.info('event=kernels_jit why="%s"', warmed.why_jit)
            # Reliable topics' WALs load on first use or by the core's sweep (issue 23:
            # `danube.machines.node.deferred_loads`), not before the ports open: a topic not
            # loaded yet refuses what needs its offsets with UNAVAILABLE, retried, and a
            # producer's creation waits for its load.
            runtime.apply(restored.effects)
            placement: Placement = LocalPlacement(core)
            member: ClusterMember | None = None
            replication: ReplicationPort | None = None
            if clustered:
                replication = ReplicationPort(
                    runtime, broker_id, store, loop, stages=metrics.stages
                )
                runtime.port.replication = replication
                # dead letters for topics other brokers serve (issue 24): an internal
                # producer through this broker's own lookup and redirect
                runtime.port.dead_letters = DeadLetterForward(
                    identity.connect_url, broker_id, loop, security=internal_client(auth)
                )
                metrics.replication = replication
                cluster_placement = ClusterPlacement(
                    core,
                    store,
                    broker_id,
                    auto_create_topics=config.auto_create_topics,
                    hold_ms=config.cluster.lookup_hold_ms,
                    hold_max=config.cluster.lookup_hold_max,
                )
                placement = cluster_placement
                if (why := unreachable_admin(admin_seen, advertised)) is not None:
                    log.warning("event=admin_address_unreachable reason=%r", why)
                registration = {
                    "broker_url": identity.broker_url,
                    "connect_url": identity.connect_url,
                    "admin_addr": f"{admin_scheme}://{admin_seen}",
                    "metrics_addr": f"{metrics_scheme}://{bound.metrics}" if bound.metrics else "",
                }
                member = ClusterMember(
                    store, runtime, broker_id, registration, config.cluster, cluster_placement
                )
                member.load_manager.on_snapshot = replication.snapshot
                member.load_manager.on_event = replication.observe
                member.ownership.on_adopted = replication.adopted
                leader = member.leader
                metrics.leading = lambda: leader() == broker_id
                balance = member.load_manager.machine.balance
                metrics.imbalance = lambda: balance().coefficient_of_variation
                driver = member.load_manager
                metrics.rebalancing = lambda: (driver.moves, driver.move_failures)
            consumers = ConsumerService(runtime, placement)
            schemas = SchemaService(
                store,
                _schema_offload(trio.CapacityLimiter(SCHEMA_WORKERS)),
                placement,
                metrics.schema_parsed,
            )
            gate = SchemaGate(schemas, metrics)
            # Everything built so far lives as long as the broker: moved out of the cyclic
            # collector's reach, a full collection (set off by a schema check's garbage in a
            # worker thread, say) no longer pauses the event loop for 100+ ms scanning it.
            gc.freeze()
            if collecting:
                gc.enable()
            below = baseline_warning(rss_bytes(), pools.budget)
            if below is not None:
                log.warning("event=memory_budget_below_baseline %s", below)
            short = short_timeout_warning(config.producer_idle_timeout_ms)
            if short is not None:
                log.warning("event=producer_idle_timeout_short %s", short)
            batch_limit = BATCH_REQUEST_LIMIT + _message_limit(config)
            client_services = [
                ClientPortSchemaRegistry(schemas),
                ProducerService(runtime, placement, _message_limit(config), gate),
                ProducerExtService(runtime, gate, batch_limit),
                consumers,
                ConsumerExtService(consumers),
                ConsumerBatchService(runtime, RECEIVE_BATCH),
                DiscoveryService(placement, metrics),
                HealthCheckService(runtime),
            ]
            client_server = Server(
                [
                    *client_services,
                    Unimplemented(CLIENT_PORT_BASES, client_services, NOT_YET),
                ],
                metrics.rpc_done,
                config.grpc,
                auth=guard.wrap if guard is not None else None,
                gate=connections,
            )
            admin = AdminServices(
                runtime,
                broker_id,
                f"{admin_scheme}://{admin_seen}",
                schemas,
                metrics_url=f"{metrics_scheme}://{bound.metrics}" if bound.metrics else "",
                cluster=ClusterAdminOps(store, member) if member is not None else None,
                placement=cluster_placement if clustered else None,
                store=store if clustered else None,
            )
            admin_services: list[Any] = [
                admin,
                schemas,
                ReplicationAdminService(core, broker_id, replication),
            ]
            if replication is not None:
                admin_services.append(replication.service)
            security = SecurityAdminService(
                store, rbac_of(auth), guard.use if guard is not None else None
            )
            if guard is not None:
                guard.use(await security.load())
                if clustered:  # every broker sees every broker's writes (spec/security.md)
                    nursery.start_soon(security.follow)
            admin_services.append(security)
            admin_server = Server(
                [
                    *admin_services,
                    Unimplemented(ADMIN_PORT_BASES, admin_services, NOT_YET),
                    Unimplemented([admin_pb.ClusterAdminBase], admin_services, NO_RAFT),
                ],
                metrics.rpc_done,
                config.grpc,
                auth=guard.wrap if guard is not None else None,
                gate=admin_connections,
            )
            nursery.start_soon(_report_drops, core)
            runtime.transports += [client_server.transport_counts, admin_server.transport_counts]
            nursery.start_soon(runtime.tick, TICK_SECONDS)
            await trio_asyncio.aio_as_trio(client_server.start)(sock=broker_sock, ssl=client_tls)
            await trio_asyncio.aio_as_trio(admin_server.start)(sock=admin_sock, ssl=admin_tls)
            member_scope = trio.CancelScope()
            if member is not None:
                await nursery.start(_run_member, member, member_scope)
            health.started = True
            log.info(
                "event=broker_ready broker_id=%s mode=%s broker_addr=%s admin_addr=%s "
                "metrics_addr=%s data_dir=%s auth=%s tls=%s",
                broker_id, config.mode, bound.broker, bound.admin, bound.metrics or "off",
                data_dir, auth.mode,
                ",".join(p for p in ("client", "admin", "metrics") if auth.tls_on(p)) or "off",
            )  # fmt: skip
            task_status.started(bound)
            await shutdown.wait()
            log.info("event=broker_stopping open_streams=%d", runtime.open_streams)
            runtime.stopping = True
            runtime.apply(core.live_streams())
            with trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                while runtime.open_streams:
                    await trio.sleep(0.01)
            if replication is not None:
                await trio_asyncio.aio_as_trio(replication.close)()
            forwarder = runtime.port.dead_letters
            if forwarder is not None:  # dead letters under way are asked again after a start
                await trio_asyncio.aio_as_trio(forwarder.close)()
            for server in (client_server, admin_server):
                server.close()
                await trio_asyncio.aio_as_trio(server.wait_closed)()
                server.close_connections()
            await runtime.quiesce(SHUTDOWN_GRACE_SECONDS, UPLOAD_GRACE_SECONDS)
            await trio_asyncio.aio_as_trio(runtime.flush_metadata)()
            if member is not None:
                await member.leave()
                member_scope.cancel()
            nursery.cancel_scope.cancel()
    finally:
        if collecting:  # a start that failed before the freeze
            gc.enable()
        for sock in sockets:
            sock.close()
        await store.aclose()
    log.info("event=broker_stopped")
