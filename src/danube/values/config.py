"""Broker configuration: Danube's YAML keys where they exist, our own where Danube has none.

Unknown keys are errors, not warnings: a misspelt `max_message_size` silently ignored is a
production incident.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

from danube.values.auth_config import AuthConfig, auth_config
from danube.values.errors import ConfigError as ConfigError
from danube.values.errors import DanubeError
from danube.values.grpc_config import GrpcConfig as GrpcConfig
from danube.values.load_manager_config import LoadManagerConfig
from danube.values.memory_config import memory_budget as memory_budget
from danube.values.memory_config import memory_updates
from danube.values.names import validate_namespace
from danube.values.wal_config import MIB, Durability, WalConfig

DEFAULT_MAX_MESSAGE_SIZE = 10 * 1024 * 1024
OBJECT_DURABILITY = "object"
DEFAULT_OBJECT_BATCH_MS = 100
DEFAULT_PROMETHEUS_PORT = 9040
LOOPBACK_HOST = "127.0.0.1"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class DispatchStrategy(enum.IntEnum):
    """Wire values of `danube.DispatchStrategy`; `label` is the metadata spelling."""

    NON_RELIABLE = 0
    RELIABLE = 1

    @property
    def label(self) -> str:
        return "NonReliable" if self is DispatchStrategy.NON_RELIABLE else "Reliable"

    @classmethod
    def from_label(cls, label: str) -> DispatchStrategy:
        return cls.RELIABLE if label == "Reliable" else cls.NON_RELIABLE


@dataclass(frozen=True, slots=True)
class Policies:
    """Per-namespace limits; 0 means unlimited (Danube's convention)."""

    max_producers_per_topic: int = 0
    max_subscriptions_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    max_publish_rate: int = 0
    max_subscription_dispatch_rate: int = 0
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    failure_policy: str = ""
    """The namespace's default failure policy for reliable subscriptions that set none of
    their own (issue 24): the canonical JSON of Danube's `SubscriptionFailurePolicy`
    (`SubscriptionFailureSettings.to_json`), "" for the broker's default. Text, so the
    policies stay hashable; namespace-only (a topic cannot override it)."""


MAX_UNACKED_MESSAGES_LIMIT = 10_000
MAX_LOOKUP_HOLD_MS = 60_000
"""`cluster.lookup_hold_ms` at most: a held request keeps its stream open that long."""


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    consumer_queue_messages: int = 1000
    """Non-reliable: messages waiting for one consumer's stream before new ones are dropped."""
    consumer_queue_bytes: int = 16 * 1024 * 1024
    max_unacked_messages: int = 10
    """Reliable: the pipelined window of each subscription (Danube's key, 1..10000)."""


DURABILITY_LEVELS = ("fsync", "flush", OBJECT_DURABILITY)


@dataclass(frozen=True, slots=True)
class TopicDurability:
    """The durability level of each reliable topic (spec/durability.md): `overrides` name
    topics exactly or as `/namespace/*` (an exact name wins); every other topic gets
    `default`, or the WAL configuration's own mode when `default` is None. A topic takes its
    level when its WAL loads, so a changed configuration applies from the next restart."""

    default: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    object_batch_ms: int = DEFAULT_OBJECT_BATCH_MS
    """`object` level: seal the active segment this long after its oldest unanswered publish."""

    def __post_init__(self) -> None:
        for pattern, level in ((None, self.default), *self.overrides):
            if level is not None and level not in DURABILITY_LEVELS:
                raise ValueError(f"unknown durability level {level!r} (fsync, flush or object)")
            if pattern is not None:
                _check_topic_pattern(pattern)
        if self.object_batch_ms <= 0:
            raise ValueError(f"object_batch_ms must be positive, got {self.object_batch_ms}")

    def level(self, topic: str, wal_default: Durability) -> str:
        levels = dict(self.overrides)
        namespace = topic.split("/")[1] if topic.count("/") == 2 else ""
        found = levels.get(topic) or levels.get(f"/{namespace}/*")
        return found or self.default or wal_default.value

    @property
    def uses_object(self) -> bool:
        return OBJECT_DURABILITY in (self.default, *(level for _, level in self.overrides))


def _check_topic_pattern(pattern: str) -> None:
    namespace, _, topic = pattern.removeprefix("/").partition("/")
    if not pattern.startswith("/") or not namespace or not topic or "/" in topic:
        raise ValueError(f"{pattern!r} is neither /namespace/topic nor /namespace/*")


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Where reliable topics keep their WAL and how (Danube's `storage` keys where they map;
    see spec/durability.md for what each setting trades)."""

    wal_root: str | None = None
    """Default `<data_dir>/wal`; one directory per topic below it."""
    wal: WalConfig = field(default_factory=WalConfig)
    mode: str = "local"
    """`local` (no objects), `shared_fs` or `object_store` (spec/object-layout.md)."""
    durable_root: str | None = None
    """fsspec URL of the object tier (`file:///mnt/shared/danube`, `s3://bucket/prefix`)."""
    endpoint: str | None = None
    """S3-compatible endpoint URL (credentials come from the environment, never from here)."""
    region: str | None = None
    durability: TopicDurability = field(default_factory=TopicDurability)
    """`wal.durability`, `wal.topics` and `wal.object_batch_ms`."""

    @property
    def tiered(self) -> bool:
        return self.mode != "local"


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, what: str) -> Address:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"{what}: expected host:port, got {text!r}")
        return cls(host.strip("[]"), int(port))


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP (127.0.0.0/8, ::1); any other name counts as public."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def private_host(client_host: str) -> str:
    """Where the admin and metrics endpoints listen unless configured on their own: on the
    client port's host when that is loopback (local brokers on 127.0.0.x keep apart), else on
    127.0.0.1. Opening the client port to a network must not open with it the admin port
    (which can delete anything) or the metrics (which name every topic)."""
    return client_host if is_loopback(client_host) else LOOPBACK_HOST


def advertised_admin(
    admin: Address, advertised_client: str, configured: str | None = None
) -> Address:
    """The admin address other brokers of a cluster are told (`/cluster/register`): the one
    `configured` (`advertised_admin_addr`: behind NAT or a proxy the bound one is not what
    they reach), else the bound one, except that a wildcard bind (0.0.0.0, ::) is named by
    the client's advertised host, which is reachable where the wildcard is not."""
    if configured:
        return Address.parse(configured, "advertised admin address")
    if admin.host not in WILDCARD_HOSTS:
        return admin
    client_host = Address.parse(advertised_client, "advertised address").host
    return Address(client_host, admin.port) if client_host not in WILDCARD_HOSTS else admin


def unreachable_admin(admin: Address, advertised_client: str) -> str | None:
    """Cluster mode: why other brokers may not reach this one's admin port (they forward
    admin calls to a topic's owner there), or None. A loopback admin address is fine for
    brokers sharing one host and unusable across hosts, where the operator must set
    `broker.admin_host` (or --admin-addr) to an address the other brokers can reach."""
    client_host = Address.parse(advertised_client, "advertised address").host
    if is_loopback(admin.host) and not is_loopback(client_host):
        return (
            f"the admin port listens on {admin} (loopback) while clients reach this broker at "
            f"{advertised_client}: brokers on other hosts cannot forward admin calls here; set "
            "broker.admin_host (or --admin-addr) to an address they can reach"
        )
    return None


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS to etcd: the CA of etcd's certificate (None: the system's roots) and this broker's
    certificate and key, for an etcd that authenticates clients by certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def etcd_tls(value: Any) -> EtcdTls:
    where = "meta_store.etcd_tls"
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of ca_file, cert_file, key_file")
    _keys(value, {"ca_file", "cert_file", "key_file"}, where)
    files: dict[str, str | None] = {}
    for key in ("ca_file", "cert_file", "key_file"):
        text = value.get(key)
        if text is not None and (not isinstance(text, str) or not text):
            raise ConfigError(f"{where}.{key}: expected a file path")
        files[key] = text
    if (files["cert_file"] is None) != (files["key_file"] is None):
        raise ConfigError(f"{where}: cert_file and key_file go together")
    return EtcdTls(**files)


def etcd_transport(endpoints: tuple[str, ...], tls: EtcdTls | None) -> EtcdTls | None:
    """How every endpoint is reached: TLS when `meta_store.etcd_tls` is set or an endpoint
    says `https://` (then, without `etcd_tls`, verified by the system's roots), else plain.
    `http://` and TLS do not mix: a broker reaches every etcd endpoint the same way."""
    schemes = {e.partition("://")[0] for e in endpoints if "://" in e}
    if "http" in schemes and ("https" in schemes or tls is not None):
        raise ConfigError(
            "meta_store.etcd_endpoints: http:// and TLS (https:// or meta_store.etcd_tls) do "
            "not mix; a broker reaches every etcd endpoint the same way"
        )
    if "https" in schemes and tls is None:
        return EtcdTls()
    return tls


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Cluster mode: where the metadata lives (`meta_store.etcd_endpoints`, `meta_store.prefix`)
    and how fast a dead broker is noticed (`cluster.*`, ours: spec/cluster.md)."""

    etcd_endpoints: tuple[str, ...] = ()
    etcd_prefix: str = ""
    etcd_tls: EtcdTls | None = None
    """`meta_store.etcd_tls`: TLS to etcd (spec/security.md, "etcd")."""
    lease_ttl_ms: int = 10_000
    renew_interval_ms: int = 2_000
    drift_ms: int = 1_000
    load_report_interval_ms: int = 30_000
    load_manager: Any = None
    """The parsed `load_manager` section (`danube.values.load_manager_config.LoadManagerConfig`)."""
    replication_lag_ms: int = 1_000
    """`cluster.replication.lag_ms`: how long an owner waits for a follower's answer before
    shrinking it out of the in-sync set and acknowledging without it (spec/replication.md)."""
    replication_min_in_sync: int = 1
    """`cluster.replication.min_in_sync`: the copies (owner included) an acknowledged record
    must be on; with fewer in sync the owner refuses reliable publishes."""
    lookup_hold_ms: int = 10_000
    """`cluster.lookup_hold_ms`: how long a lookup, CreateProducer or Subscribe whose topic
    is between owners (being assigned, or loading here) waits for it before answering
    UNAVAILABLE; 0 answers at once, as Danube does (spec/cluster.md, "Held answers"); at
    most 60 000."""
    lookup_hold_max: int = 256
    """`cluster.lookup_hold_max`: requests held at once on the broker; past it a request
    for a topic between owners is answered UNAVAILABLE at once (spec/cluster.md, "Held
    answers")."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    mode: str = "standalone"
    """`standalone` (embedded metadata, every topic here) or `cluster` (etcd, object tier)."""
    cluster_name: str = "STANDALONE"
    broker_addr: Address = Address("127.0.0.1", 6650)
    """The client port (`broker.host`, `broker.ports.client`, --broker-addr)."""
    admin_addr: Address = Address(LOOPBACK_HOST, 50051)
    """The admin port: on `private_host` of the client's host unless `admin_host_own`."""
    prometheus_addr: Address | None = Address(LOOPBACK_HOST, DEFAULT_PROMETHEUS_PORT)
    """The metrics and health endpoint (spec/observability.md); None turns it off. On
    `private_host` of the client's host unless `prometheus_host_own`."""
    admin_host_own: bool = False
    """The admin host was configured on its own (`broker.admin_host`, --admin-addr)."""
    prometheus_host_own: bool = False
    """The metrics host was configured on its own (`broker.prometheus_host`, --prom-exporter)."""
    metrics_per_topic: bool = True
    """`metrics.per_topic`: series labelled by topic and subscription; false sums them per
    broker, so the number of series no longer grows with the topics (spec/observability.md)."""
    advertised_addr: str | None = None
    advertised_admin_addr: str | None = None
    """host:port other brokers of a cluster reach the admin port by (they forward admin calls
    to a topic's owner and replicate to followers there; `broker.advertised_listeners.
    admin_url`, --advertised-admin-addr): behind NAT or a proxy; default the bound one."""
    data_dir: str = "./danube-data"
    memory_budget: int | None = None
    """`broker.memory_budget` / --memory-budget, bytes: what the broker's accounted memory
    (hot caches, publish buffers, consumer queues) may take together (spec/memory.md). None:
    a share of the machine's memory or the cgroup limit, read at start."""
    publish_wait_ms: int = 3_000
    """`broker.publish_wait_ms`: how long a `SendMessage` waits for room in the publish pool
    before RESOURCE_EXHAUSTED (spec/memory.md, "Back-pressure"); 0 refuses at once."""
    cache_idle_ms: int = 60_000
    """`broker.cache_idle_ms`: a topic's hot cache with nothing added for this long is emptied
    (spec/memory.md, "Giving memory back"); 0 keeps it."""
    producer_idle_timeout_ms: int = 600_000
    """`broker.producer_idle_timeout_ms`: a producer with no publish nor health check for this
    long is removed (spec/memory.md, "Departed clients"); 0 keeps it. Ten minutes: the
    official clients stop health-checking after a failed check, so a shorter timeout makes
    a rare publisher recreate its producer (seconds of retries) at each publish."""
    bootstrap_namespaces: tuple[str, ...] = ("default",)
    auto_create_topics: bool = True
    policies: Policies = field(default_factory=Policies)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    """`auth` and `admin_tls` (spec/security.md)."""

    def check_mode(self) -> None:
        """What cluster mode needs, checked once every source (file, flags) is applied."""
        self.auth.check()
        if self.mode == "cluster":
            self.auth.check_cluster()
        if self.mode == "standalone":
            return
        if self.mode != "cluster":
            raise ConfigError(f"mode: expected standalone or cluster, got {self.mode!r}")
        if not self.cluster.etcd_endpoints:
            raise ConfigError(
                "cluster mode needs meta_store.etcd_endpoints (or --etcd-endpoints host:port)"
            )
        if not self.storage.tiered:
            raise ConfigError(
                "cluster mode needs an object tier (storage.mode object_store or shared_fs): "
                "a topic that moves to another broker continues from its objects"
            )
        c = self.cluster
        if not 0 <= c.drift_ms < c.lease_ttl_ms or not (
            0 < c.renew_interval_ms < c.lease_ttl_ms - c.drift_ms
        ):
            raise ConfigError(
                "cluster: need drift_ms < lease_ttl_ms and renew_interval_ms < lease_ttl_ms - "
                f"drift_ms (got lease_ttl_ms={c.lease_ttl_ms}, renew_interval_ms="
                f"{c.renew_interval_ms}, drift_ms={c.drift_ms})"
            )
        if c.lease_ttl_ms < 1_000:
            raise ConfigError(f"cluster.lease_ttl_ms: at least 1000, got {c.lease_ttl_ms}")

    def with_broker_addr(self, address: Address) -> BrokerConfig:
        """The client port moved (--broker-addr): the admin and metrics hosts follow it only
        as far as `private_host` lets them, unless they were configured on their own."""
        host = private_host(address.host)
        admin = self.admin_addr
        if not self.admin_host_own:
            admin = dataclasses.replace(admin, host=host)
        metrics = self.prometheus_addr
        if metrics is not None and not self.prometheus_host_own:
            metrics = dataclasses.replace(metrics, host=host)
        return dataclasses.replace(
            self, broker_addr=address, admin_addr=admin, prometheus_addr=metrics
        )

    @property
    def broker_url(self) -> str:
        return f"http://{self.advertised_addr or self.broker_addr}"

    @property
    def wal_root(self) -> str:
        return self.storage.wal_root or f"{self.data_dir.rstrip('/')}/wal"


def prometheus_address(text: str, what: str) -> Address | None:
    """`host:port` of the metrics endpoint, or `off` (None): no endpoint."""
    if text.strip().lower() == "off":
        return None
    return Address.parse(text, what)


def _prometheus_port(ports: dict[str, Any], host: str) -> Address | None:
    """`broker.ports.prometheus`: a port (0 picks a free one), or false / off for none
    (YAML reads a bare `off` as false)."""
    value = ports.get("prometheus", DEFAULT_PROMETHEUS_PORT)
    if value is False or value == "off":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(
            f"broker.ports.prometheus: expected a port (0 to 65535) or off, got {value!r}"
        )
    return Address(host, value)


def _host(broker: dict[str, Any], key: str) -> str | None:
    value = broker.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip("[]"):
        raise ConfigError(f"broker.{key}: expected a host name or IP address, got {value!r}")
    return value.strip("[]")


def _port(ports: dict[str, Any], key: str, default: int) -> int:
    value = ports.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(f"broker.ports.{key}: expected a port (0 to 65535), got {value!r}")
    return value


def _addresses(broker: dict[str, Any], config: BrokerConfig) -> dict[str, Any]:
    """`broker.host` is the client port's host (Danube binds every port there); the admin
    and metrics ports take `broker.admin_host` and `broker.prometheus_host` (ours), else
    `private_host(broker.host)`: never a public interface unless named on their own."""
    known = {
        "host",
        "ports",
        "advertised_listeners",
        "admin_host",
        "prometheus_host",
        "grpc",
        "memory_budget",
        "publish_wait_ms",
        "cache_idle_ms",
        "producer_idle_timeout_ms",
    }
    _keys(broker, known, "broker")
    ports = _section(broker, "ports", "broker.")
    _keys(ports, {"client", "admin", "raft", "prometheus"}, "broker.ports")
    host = _host(broker, "host") or config.broker_addr.host
    admin_host = _host(broker, "admin_host")
    metrics_host = _host(broker, "prometheus_host")
    return {
        "broker_addr": Address(host, _port(ports, "client", config.broker_addr.port)),
        "admin_addr": Address(
            admin_host or private_host(host), _port(ports, "admin", config.admin_addr.port)
        ),
        "admin_host_own": admin_host is not None,
        "prometheus_addr": _prometheus_port(ports, metrics_host or private_host(host)),
        "prometheus_host_own": metrics_host is not None,
    }


def _metrics(section: dict[str, Any]) -> bool:
    """`metrics.per_topic` (ours, default true)."""
    _keys(section, {"per_topic"}, "metrics")
    value = section.get("per_topic", True)
    if not isinstance(value, bool):
        raise ConfigError(f"metrics.per_topic: expected true or false, got {value!r}")
    return value


def _section(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:  # `key:` with nothing under it
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}{key}: expected a mapping")
    return value


def _failure_policy_text(value: Any) -> str:
    """`policies.failure_policy`: the default failure policy of the namespaces the broker
    creates, as a table (or its JSON text) of set-failure-policy's fields; its fields are
    checked when the broker starts (`Catalogue`)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ConfigError("policies.failure_policy: expected a table or JSON object") from None
    if not isinstance(value, dict):
        raise ConfigError("policies.failure_policy: expected a table or JSON object")
    return json.dumps(value, sort_keys=True) if value else ""


def _fill(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    values = {}
    for key, value in data.items():
        expected = type(getattr(cls(), key))
        if expected is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ConfigError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
        values[key] = value
    return cls(**values)


_TOP_LEVEL = {
    "cluster_name", "broker", "meta_store", "bootstrap_namespaces", "auto_create_topics",
    "policies", "dispatch", "storage", "cluster", "load_manager", "metrics", "auth", "admin_tls",
}  # fmt: skip


def _number(
    data: dict[str, Any], key: str, where: str, *, minimum: int = 1, maximum: int | None = None
) -> int | None:
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{where}{key}: expected an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where}{key}: expected an integer <= {maximum}, got {value!r}")
    return value


def _keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _check_durable(mode: Any, durable_root: Any) -> None:
    if mode not in ("local", "shared_fs", "object_store"):
        raise ConfigError(f"storage.mode: expected local, shared_fs or object_store, got {mode!r}")
    if mode != "local" and not durable_root:
        raise ConfigError(f"storage.durable.root: required with storage.mode {mode}")
    if (
        mode == "shared_fs"
        and "://" in str(durable_root)
        and not str(durable_root).startswith("file://")
    ):
        raise ConfigError("storage.durable.root: shared_fs takes a path or a file:// URL")
    if mode == "object_store" and "://" not in str(durable_root):
        raise ConfigError(
            "storage.durable.root: object_store takes a URL such as s3://bucket/prefix"
        )


def storage_with(
    storage: StorageConfig,
    *,
    mode: str | None,
    durable_root: str | None,
    endpoint: str | None,
) -> StorageConfig:
    """The storage settings with command-line overrides applied, checked as a file's are."""
    updated = dataclasses.replace(
        storage,
        mode=mode or storage.mode,
        durable_root=durable_root or storage.durable_root,
        endpoint=endpoint or storage.endpoint,
    )
    _check_durable(updated.mode, updated.durable_root)
    return updated


def _storage(data: dict[str, Any]) -> StorageConfig:
    """`storage:` with Danube's names (`local_wal_root`, `local_retention`, `wal.file_sync`,
    `wal.rotation`) plus ours (`wal.durability`, `wal.cache_bytes`)."""
    _keys(data, {"mode", "local_wal_root", "root", "local_retention", "wal", "durable"}, "storage")
    mode = data.get("mode", "local")
    durable = _section(data, "durable", "storage.")
    _keys(durable, {"root", "endpoint", "region"}, "storage.durable")
    durable_root = durable.get("root")
    _check_durable(mode, durable_root)
    root = data.get("local_wal_root", data.get("root"))
    wal = _section(data, "wal", "storage.")
    _keys(
        wal,
        {"durability", "topics", "object_batch_ms", "cache_bytes", "file_sync", "rotation"},
        "storage.wal",
    )
    sync = _section(wal, "file_sync", "storage.wal.")
    _keys(sync, {"interval_ms", "max_batch_bytes"}, "storage.wal.file_sync")
    rotation = _section(wal, "rotation", "storage.wal.")
    _keys(rotation, {"max_bytes", "max_hours"}, "storage.wal.rotation")
    retention = _section(data, "local_retention", "storage.")
    _keys(retention, {"time_minutes", "size_mb"}, "storage.local_retention")
    topic_durability = _durability(wal, mode)
    settings: dict[str, Any] = {
        # `object` keeps fsync-before-ack locally and waits for the object on top of it.
        "durability": Durability.FLUSH if topic_durability.default == "flush" else Durability.FSYNC,
        "cache_bytes": _number(wal, "cache_bytes", "storage.wal.", minimum=0),
        "flush_interval_ms": _number(sync, "interval_ms", "storage.wal.file_sync."),
        "max_write_bytes": _number(sync, "max_batch_bytes", "storage.wal.file_sync."),
        "segment_bytes": _number(rotation, "max_bytes", "storage.wal.rotation."),
    }
    hours = _number(rotation, "max_hours", "storage.wal.rotation.")
    minutes = _number(retention, "time_minutes", "storage.local_retention.")
    size_mb = _number(retention, "size_mb", "storage.local_retention.")
    settings["segment_age_ms"] = hours * 3_600_000 if hours else None
    settings["retention_ms"] = minutes * 60_000 if minutes else None
    settings["retention_bytes"] = size_mb * MIB if size_mb else None
    try:
        wal_config = WalConfig(**{k: v for k, v in settings.items() if v is not None})
    except ValueError as error:
        raise ConfigError(f"storage.wal: {error}") from None
    return StorageConfig(
        str(root) if root is not None else None,
        wal_config,
        mode,
        str(durable_root) if durable_root else None,
        str(durable["endpoint"]) if durable.get("endpoint") else None,
        str(durable["region"]) if durable.get("region") else None,
        topic_durability,
    )


def etcd_endpoints(value: Any, where: str) -> tuple[str, ...]:
    """A list of `host:port` (or `http://host:port`, `https://host:port`), or one
    comma-separated string."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{where}: expected a list of host:port")
    endpoints = tuple(i.strip() for i in items if i.strip())
    for endpoint in endpoints:
        scheme, separator, address = endpoint.rpartition("://")
        if separator and scheme not in ("http", "https"):
            raise ConfigError(f"{where}: {endpoint!r}: expected host:port, http:// or https://")
        Address.parse(address, where)
    return endpoints


def _cluster(meta: dict[str, Any], data: dict[str, Any]) -> ClusterConfig:
    config = ClusterConfig()
    section = _section(data, "cluster", "")
    _keys(
        section,
        {
            "lease_ttl_ms",
            "renew_interval_ms",
            "drift_ms",
            "load_report_interval_ms",
            "replication",
            "replication_factor",
            "lookup_hold_ms",
            "lookup_hold_max",
        },
        "cluster",
    )
    replication = _section(section, "replication", "cluster.")
    _keys(replication, {"lag_ms", "min_in_sync"}, "cluster.replication")
    timings = {
        key: _number(section, key, "cluster.")
        for key in ("lease_ttl_ms", "renew_interval_ms", "load_report_interval_ms")
    }
    timings["drift_ms"] = _number(section, "drift_ms", "cluster.", minimum=0)
    timings["lookup_hold_ms"] = _number(
        section, "lookup_hold_ms", "cluster.", minimum=0, maximum=MAX_LOOKUP_HOLD_MS
    )
    timings["lookup_hold_max"] = _number(section, "lookup_hold_max", "cluster.", minimum=0)
    values: dict[str, Any] = {k: v for k, v in timings.items() if v is not None}
    for key in ("lag_ms", "min_in_sync"):
        number = _number(replication, key, "cluster.replication.")
        if number is not None:
            values[f"replication_{key}"] = number
    if "etcd_endpoints" in meta:
        values["etcd_endpoints"] = etcd_endpoints(
            meta["etcd_endpoints"], "meta_store.etcd_endpoints"
        )
    if "prefix" in meta:
        values["etcd_prefix"] = str(meta["prefix"])
    if meta.get("etcd_tls") is not None:
        values["etcd_tls"] = etcd_tls(meta["etcd_tls"])
    tls = etcd_transport(values.get("etcd_endpoints", ()), values.get("etcd_tls"))
    if tls is not None:
        values["etcd_tls"] = tls
    manager = LoadManagerConfig.from_mapping(data.get("load_manager"))
    if "load_report_interval_ms" not in values and "load_manager" in data:
        values["load_report_interval_ms"] = manager.load_report_interval_seconds * 1000
    # The cluster-wide default factor is the load manager's to apply (it places followers);
    # namespace and topic policies override it (spec/replication.md, "Replication factor").
    factor = _number(section, "replication_factor", "cluster.")
    if factor is not None:
        manager = dataclasses.replace(manager, replication_factor=factor)
    values["load_manager"] = manager
    return dataclasses.replace(config, **values)


def _durability(wal: dict[str, Any], mode: str) -> TopicDurability:
    """`storage.wal.durability` (every topic's level), `storage.wal.topics` (levels of some
    topics: `/ns/topic: flush`, `/ns/*: object`) and `storage.wal.object_batch_ms`."""
    default = wal.get("durability", "fsync")
    if default not in DURABILITY_LEVELS:
        raise ConfigError(
            f"storage.wal.durability: expected 'fsync', 'flush' or 'object', got {default!r}"
        )
    topics = _section(wal, "topics", "storage.wal.")
    for pattern, level in topics.items():
        if level not in DURABILITY_LEVELS:
            raise ConfigError(
                f"storage.wal.topics.{pattern}: expected 'fsync', 'flush' or 'object', "
                f"got {level!r}"
            )
        try:
            _check_topic_pattern(str(pattern))
        except ValueError as error:
            raise ConfigError(f"storage.wal.topics: {error}") from None
    batch = _number(wal, "object_batch_ms", "storage.wal.")
    durability = TopicDurability(
        default,
        tuple(sorted((str(p), str(level)) for p, level in topics.items())),
        batch or DEFAULT_OBJECT_BATCH_MS,
    )
    if durability.uses_object and mode == "local":
        raise ConfigError(
            "storage.wal.durability: 'object' acknowledges once a publish is in object "
            "storage, so it needs storage.mode shared_fs or object_store"
        )
    if batch is not None and not durability.uses_object:
        raise ConfigError("storage.wal.object_batch_ms: only used with durability 'object'")
    return durability


_MAY_BE_ZERO = {
    "max_stream_resets",
    "handshake_timeout_ms",
    "frame_timeout_ms",
    "max_connections",
    "max_pending_connections",
    "max_admin_connections",
    "first_call_timeout_ms",
}


def grpc_config(data: dict[str, Any], base: GrpcConfig | None = None) -> GrpcConfig:
    """`broker.grpc` over `base`: every key a positive integer (milliseconds or a count),
    except that 0 turns off the reset limit and the handshake and frame timeouts."""
    _keys(data, {f.name for f in dataclasses.fields(GrpcConfig)}, "broker.grpc")
    values: dict[str, int] = {}
    for key in data:
        minimum = 0 if key in _MAY_BE_ZERO else 1
        number = _number(data, key, "broker.grpc.", minimum=minimum)
        assert number is not None
        values[key] = number
    return dataclasses.replace(base or GrpcConfig(), **values)


def config_from_mapping(data: dict[str, Any]) -> BrokerConfig:
    """Builds a config from parsed YAML (Danube's layout: broker.host, broker.ports.client...)."""
    if not isinstance(data, dict):
        raise ConfigError("the configuration file must be a YAML mapping")
    unknown = sorted(set(data) - _TOP_LEVEL)
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {', '.join(unknown)}")
    config = BrokerConfig()
    broker = _section(data, "broker", "")
    updates = _addresses(broker, config)
    updates["metrics_per_topic"] = _metrics(_section(data, "metrics", ""))
    updates["grpc"] = grpc_config(_section(broker, "grpc", "broker."))
    updates.update(memory_updates(broker, _number))
    advertised = _section(broker, "advertised_listeners", "broker.")
    if advertised.get("broker_url"):
        updates["advertised_addr"] = str(advertised["broker_url"]).split("://")[-1]
    if advertised.get("admin_url"):
        admin_url = str(advertised["admin_url"]).split("://")[-1]
        Address.parse(admin_url, "broker.advertised_listeners.admin_url")
        updates["advertised_admin_addr"] = admin_url
    if "cluster_name" in data:
        updates["cluster_name"] = str(data["cluster_name"])
    meta = _section(data, "meta_store", "")
    _keys(meta, {"data_dir", "seed_nodes", "etcd_endpoints", "prefix", "etcd_tls"}, "meta_store")
    if "data_dir" in meta:
        updates["data_dir"] = str(meta["data_dir"])
    updates["cluster"] = _cluster(meta, data)
    if "bootstrap_namespaces" in data:
        names = data["bootstrap_namespaces"]
        if not isinstance(names, list):
            raise ConfigError("bootstrap_namespaces: expected a list of namespace names")
        try:
            updates["bootstrap_namespaces"] = tuple(validate_namespace(str(n)) for n in names)
        except DanubeError as error:
            raise ConfigError(f"bootstrap_namespaces: {error.message}") from None
    if "auto_create_topics" in data:
        if not isinstance(data["auto_create_topics"], bool):
            raise ConfigError("auto_create_topics: expected true or false")
        updates["auto_create_topics"] = data["auto_create_topics"]
    policies_section = dict(_section(data, "policies", ""))
    if "failure_policy" in policies_section:  # a table, or its JSON text (issue 24)
        policies_section["failure_policy"] = _failure_policy_text(
            policies_section["failure_policy"]
        )
    updates["policies"] = _fill(Policies, policies_section, "policies")
    dispatch = _fill(DispatchConfig, _section(data, "dispatch", ""), "dispatch")
    if not 1 <= dispatch.max_unacked_messages <= MAX_UNACKED_MESSAGES_LIMIT:
        raise ConfigError(
            f"dispatch.max_unacked_messages: expected 1 to {MAX_UNACKED_MESSAGES_LIMIT}, "
            f"got {dispatch.max_unacked_messages}"
        )
    updates["dispatch"] = dispatch
    updates["storage"] = _storage(_section(data, "storage", ""))
    updates["auth"] = auth_config(_section(data, "auth", ""), data.get("admin_tls", False))
    return dataclasses.replace(config, **updates)
