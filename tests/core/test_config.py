"""Broker configuration from YAML mappings: Danube's keys map onto ours, and every mistake is
a `ConfigError` naming the key (a misspelt setting silently ignored is a production incident)."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.cli.broker import build_parser, load_config
from danube.machines.wal.machine import MIB, Durability, WalConfig
from danube.values.config import (
    Address,
    BrokerConfig,
    ConfigError,
    TopicDurability,
    advertised_admin,
    config_from_mapping,
    is_loopback,
    prometheus_address,
    unreachable_admin,
)


def test_defaults_keep_the_wal_under_the_data_dir_with_fsync() -> None:
    config = config_from_mapping({})
    assert config.storage.wal == WalConfig()
    assert config.storage.wal.durability is Durability.FSYNC
    assert config.wal_root == "./danube-data/wal"
    assert config.dispatch.max_unacked_messages == 10


def test_danube_storage_keys_map_onto_the_wal_config() -> None:
    config = config_from_mapping(
        {
            "meta_store": {"data_dir": "/var/lib/danube"},
            "storage": {
                "mode": "local",
                "local_wal_root": "/fast/wal",
                "local_retention": {"time_minutes": 60, "size_mb": 512},
                "wal": {
                    "durability": "flush",
                    "cache_bytes": 0,
                    "file_sync": {"interval_ms": 250, "max_batch_bytes": 1 << 20},
                    "rotation": {"max_bytes": 8 * MIB, "max_hours": 2},
                },
            },
            "dispatch": {"max_unacked_messages": 10_000},
        }
    )
    assert config.wal_root == "/fast/wal"
    assert config.storage.wal == WalConfig(
        durability=Durability.FLUSH,
        cache_bytes=0,
        flush_interval_ms=250,
        max_write_bytes=1 << 20,
        segment_bytes=8 * MIB,
        segment_age_ms=2 * 3_600_000,
        retention_ms=60 * 60_000,
        retention_bytes=512 * MIB,
    )
    assert config.dispatch.max_unacked_messages == 10_000
    assert BrokerConfig(data_dir="/d/").wal_root == "/d/wal"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"storage": {"mode": "object_store"}}, "storage.mode"),
        ({"storage": {"wal": {"durability": "sometimes"}}}, "storage.wal.durability"),
        ({"storage": {"wal": {"rotation": {"max_bytes": 0}}}}, "storage.wal.rotation.max_bytes"),
        ({"storage": {"wal": {"file_sync": {"interval_ms": "1s"}}}}, "interval_ms"),
        ({"storage": {"wal": {"cache_capacity": 1024}}}, "cache_capacity"),
        ({"storage": {"local_retention": {"time_minutes": -1}}}, "time_minutes"),
        ({"storage": {"wal": []}}, "storage.wal"),
        ({"storage": {"shared": 1}}, "shared"),
        ({"dispatch": {"max_unacked_messages": 0}}, "max_unacked_messages"),
        ({"dispatch": {"max_unacked_messages": 10_001}}, "max_unacked_messages"),
    ],
)
def test_mistakes_name_the_key(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        config_from_mapping(data)


def test_object_tier_modes_take_a_durable_root() -> None:
    config = config_from_mapping(
        {
            "storage": {
                "mode": "object_store",
                "durable": {
                    "root": "s3://bucket/danube",
                    "endpoint": "http://127.0.0.1:9000",
                    "region": "eu-west-1",
                },
            }
        }
    )
    storage = config.storage
    assert (storage.mode, storage.tiered) == ("object_store", True)
    assert (storage.durable_root, storage.endpoint, storage.region) == (
        "s3://bucket/danube",
        "http://127.0.0.1:9000",
        "eu-west-1",
    )
    shared = config_from_mapping({"storage": {"mode": "shared_fs", "durable": {"root": "/mnt"}}})
    assert shared.storage.tiered and shared.storage.durable_root == "/mnt"
    assert not config_from_mapping({}).storage.tiered


@pytest.mark.parametrize(
    ("storage", "needle"),
    [
        ({"mode": "object_store"}, "storage.durable.root: required"),
        ({"mode": "shared_fs", "durable": {"root": "s3://b"}}, "shared_fs takes a path"),
        ({"mode": "object_store", "durable": {"root": "/mnt"}}, "s3://bucket/prefix"),
        ({"mode": "object_store", "durable": {"root": "s3://b", "secret_key": "x"}}, "secret_key"),
        ({"mode": "tape"}, "local, shared_fs or object_store"),
    ],
)
def test_object_tier_mistakes_name_the_key(storage: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config_from_mapping({"storage": storage})


def test_object_durability_waits_for_the_object_and_fsyncs_locally() -> None:
    shared = {"mode": "shared_fs", "durable": {"root": "/mnt"}}
    config = config_from_mapping({"storage": {**shared, "wal": {"durability": "object"}}})
    assert config.storage.wal.durability is Durability.FSYNC
    assert config.storage.durability == TopicDurability("object", (), 100)
    tuned = {**shared, "wal": {"durability": "object", "object_batch_ms": 20}}
    assert config_from_mapping({"storage": tuned}).storage.durability.object_batch_ms == 20
    assert config_from_mapping({}).storage.durability == TopicDurability("fsync")


@pytest.mark.parametrize(
    ("storage", "needle"),
    [
        ({"wal": {"durability": "object"}}, "needs storage.mode shared_fs or object_store"),
        ({"wal": {"object_batch_ms": 50}}, "only used with durability 'object'"),
        (
            {
                "mode": "shared_fs",
                "durable": {"root": "/mnt"},
                "wal": {"durability": "object", "object_batch_ms": 0},
            },
            "object_batch_ms",
        ),
    ],
)
def test_object_durability_mistakes_name_the_key(storage: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config_from_mapping({"storage": storage})


def test_durability_is_chosen_per_topic() -> None:
    shared = {"mode": "shared_fs", "durable": {"root": "/mnt"}}
    wal = {
        "durability": "flush",
        "topics": {"/payments/*": "object", "/payments/audit": "fsync", "/m/cpu": "fsync"},
    }
    config = config_from_mapping({"storage": {**shared, "wal": wal}})
    assert config.storage.wal.durability is Durability.FLUSH
    durability = config.storage.durability
    level = {t: durability.level(t, Durability.FSYNC) for t in (
        "/payments/card", "/payments/audit", "/m/cpu", "/m/mem", "/paymentsx/a",
    )}  # fmt: skip
    assert level == {
        "/payments/card": "object",
        "/payments/audit": "fsync",  # an exact name wins over the namespace
        "/m/cpu": "fsync",
        "/m/mem": "flush",
        "/paymentsx/a": "flush",
    }
    # Without a default, the WAL configuration's own mode applies (the simulator's case).
    assert TopicDurability(None, (("/a/b", "flush"),)).level("/a/c", Durability.FSYNC) == "fsync"


@pytest.mark.parametrize(
    ("wal", "needle"),
    [
        ({"topics": {"/a/b": "sometimes"}}, r"storage\.wal\.topics\./a/b"),
        ({"topics": {"a/b": "flush"}}, "neither /namespace/topic"),
        ({"topics": {"/a/b/c": "flush"}}, "neither /namespace/topic"),
        ({"topics": {"/a/*": "object"}}, "needs storage.mode shared_fs"),
        ({"topics": []}, r"storage\.wal\.topics: expected a mapping"),
    ],
)
def test_per_topic_durability_mistakes_name_the_key(wal: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config_from_mapping({"storage": {"wal": wal}})


CLUSTER_FILE: dict[str, Any] = {
    "meta_store": {"etcd_endpoints": ["127.0.0.1:2379", "http://10.0.0.2:2379"]},
    "cluster": {"lease_ttl_ms": 3000, "renew_interval_ms": 500, "drift_ms": 500},
    "storage": {"mode": "object_store", "durable": {"root": "s3://bucket/danube"}},
    "load_manager": {"assignment_strategy": "fair", "load_report_interval_seconds": 5},
}


def test_cluster_settings_come_from_meta_store_cluster_and_load_manager() -> None:
    config = dataclasses.replace(config_from_mapping(CLUSTER_FILE), mode="cluster")
    config.check_mode()
    assert config.cluster.etcd_endpoints == ("127.0.0.1:2379", "http://10.0.0.2:2379")
    assert (config.cluster.lease_ttl_ms, config.cluster.renew_interval_ms) == (3000, 500)
    assert config.cluster.load_report_interval_ms == 5000
    assert config.cluster.load_manager.assignment_strategy.value == "fair"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"meta_store": {}}, "meta_store.etcd_endpoints"),
        ({"storage": {"mode": "local"}}, "needs an object tier"),
        ({"cluster": {"lease_ttl_ms": 3000, "renew_interval_ms": 2900}}, "renew_interval_ms"),
        ({"meta_store": {"etcd_endpoints": ["no-port"]}}, "etcd_endpoints"),
        ({"cluster": {"lease": 1}}, "cluster: unknown key(s) lease"),
        ({"cluster": {"lookup_hold_ms": 60_001}}, "cluster.lookup_hold_ms: expected an integer <="),
        ({"cluster": {"lookup_hold_max": -1}}, "cluster.lookup_hold_max: expected an integer >="),
    ],
)
def test_cluster_mode_mistakes_name_the_key(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        config = config_from_mapping({**CLUSTER_FILE, **change})
        dataclasses.replace(config, mode="cluster").check_mode()


def test_held_answers_are_bounded_in_time_and_number() -> None:
    """`cluster.lookup_hold_ms` up to 60 s (a held request keeps its stream open), and a
    broker-wide cap on requests held at once (`cluster.lookup_hold_max`)."""
    section = {"lookup_hold_ms": 60_000, "lookup_hold_max": 10}
    config = config_from_mapping({**CLUSTER_FILE, "cluster": section})
    assert (config.cluster.lookup_hold_ms, config.cluster.lookup_hold_max) == (60_000, 10)


def test_standalone_mode_needs_no_cluster_settings() -> None:
    BrokerConfig().check_mode()


def test_prometheus_endpoint_defaults_to_loopback_on_9040() -> None:
    assert BrokerConfig().prometheus_addr == Address("127.0.0.1", 9040)
    config = config_from_mapping({"broker": {"host": "0.0.0.0", "ports": {"prometheus": 9100}}})
    assert config.prometheus_addr == Address("127.0.0.1", 9100)
    assert config_from_mapping({"broker": {"ports": {}}}).prometheus_addr == Address(
        "127.0.0.1", 9040
    )
    # YAML 1.1 reads a bare `off` as false
    assert config_from_mapping({"broker": {"ports": {"prometheus": False}}}).prometheus_addr is None
    assert prometheus_address("off", "--prom-exporter") is None
    assert prometheus_address("127.0.0.1:0", "--prom-exporter") == Address("127.0.0.1", 0)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "broker-1.example.com", "fe80::1"])
def test_a_public_client_host_keeps_admin_and_metrics_on_loopback(host: str) -> None:
    """Issue 20: `broker.host: 0.0.0.0` put the admin port on 0.0.0.0 too, and the metrics."""
    config = config_from_mapping({"broker": {"host": host}})
    assert config.broker_addr == Address(host, 6650)
    assert config.admin_addr == Address("127.0.0.1", 50051)
    assert config.prometheus_addr == Address("127.0.0.1", 9040)


@pytest.mark.parametrize("host", ["127.0.0.2", "localhost", "::1"])
def test_a_loopback_client_host_takes_admin_and_metrics_along(host: str) -> None:
    """Several local brokers on 127.0.0.x keep their default admin and metrics ports apart."""
    config = config_from_mapping({"broker": {"host": host}})
    assert config.admin_addr == Address(host, 50051)
    assert config.prometheus_addr == Address(host, 9040)


def test_admin_and_metrics_hosts_are_configured_on_their_own() -> None:
    config = config_from_mapping(
        {
            "broker": {
                "host": "0.0.0.0",
                "admin_host": "10.0.0.5",
                "prometheus_host": "[::]",
                "ports": {"client": 7000, "admin": 7001, "raft": 7650, "prometheus": 7002},
            }
        }
    )
    assert config.broker_addr == Address("0.0.0.0", 7000)
    assert config.admin_addr == Address("10.0.0.5", 7001)
    assert config.prometheus_addr == Address("::", 7002)
    # configured on their own, they stay where they are when --broker-addr moves the client
    moved = config.with_broker_addr(Address("127.0.0.3", 6650))
    assert (moved.admin_addr, moved.prometheus_addr) == (config.admin_addr, config.prometheus_addr)


@pytest.mark.parametrize(
    ("broker", "key"),
    [
        ({"admin_hots": "0.0.0.0"}, r"broker: unknown key\(s\) admin_hots"),
        ({"ports": {"admn": 1}}, r"broker\.ports: unknown key\(s\) admn"),
        ({"ports": {"admin": "50051"}}, r"broker\.ports\.admin"),
        ({"ports": {"client": 70_000}}, r"broker\.ports\.client"),
        ({"admin_host": 5}, r"broker\.admin_host"),
        ({"prometheus_host": ""}, r"broker\.prometheus_host"),
    ],
)
def test_address_mistakes_name_the_key(broker: dict[str, Any], key: str) -> None:
    """A misspelt `admin_host` silently ignored would leave the port where nobody expects."""
    with pytest.raises(ConfigError, match=key):
        config_from_mapping({"broker": broker})


@pytest.mark.parametrize("value", [-1, 70_000, "9040", None, True])
def test_prometheus_port_mistakes_name_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match=r"broker\.ports\.prometheus"):
        config_from_mapping({"broker": {"ports": {"prometheus": value}}})


def test_prom_exporter_flag_overrides_and_follows_only_a_loopback_broker_host() -> None:
    parse = build_parser().parse_args
    assert load_config(parse(["--prom-exporter", "off"])).prometheus_addr is None
    flagged = load_config(parse(["--prom-exporter", "127.0.0.1:0"]))
    assert flagged.prometheus_addr == Address("127.0.0.1", 0)
    with pytest.raises(ConfigError, match="--prom-exporter"):
        load_config(parse(["--prom-exporter", "nowhere"]))


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.7.7", "[::]"])
def test_broker_addr_flag_on_a_public_host_moves_only_the_client_port(host: str) -> None:
    """Issue 20: `--broker-addr 0.0.0.0:P` moved the metrics endpoint to 0.0.0.0."""
    config = load_config(build_parser().parse_args(["--broker-addr", f"{host}:7000"]))
    assert config.broker_addr == Address(host.strip("[]"), 7000)
    assert config.admin_addr == Address("127.0.0.1", 50051)
    assert config.prometheus_addr == Address("127.0.0.1", 9040)


def test_broker_addr_flag_on_loopback_takes_admin_and_metrics_along() -> None:
    config = load_config(build_parser().parse_args(["--broker-addr", "127.0.0.2:7000"]))
    assert config.admin_addr == Address("127.0.0.2", 50051)
    assert config.prometheus_addr == Address("127.0.0.2", 9040)


def test_admin_and_metrics_flags_expose_them_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("broker:\n  host: 0.0.0.0\n  admin_host: 10.0.0.5\n")
    parse = build_parser().parse_args
    config = load_config(
        parse(["--config-file", str(path), "--broker-addr", "0.0.0.0:6650",
               "--prom-exporter", "0.0.0.0:9100"])
    )  # fmt: skip
    assert config.admin_addr == Address("10.0.0.5", 50051), "the file's admin_host stays"
    assert config.prometheus_addr == Address("0.0.0.0", 9100)
    asked = load_config(parse(["--broker-addr", "0.0.0.0:6650", "--admin-addr", "0.0.0.0:7001"]))
    assert asked.admin_addr == Address("0.0.0.0", 7001)


@pytest.mark.parametrize(
    ("admin", "client", "expected"),
    [
        ("0.0.0.0:50051", "10.0.0.5:6650", "10.0.0.5:50051"),
        ("[::]:50051", "broker-1.example.com:6650", "broker-1.example.com:50051"),
        ("10.0.0.9:50051", "10.0.0.5:6650", "10.0.0.9:50051"),
        ("0.0.0.0:50051", "0.0.0.0:6650", "0.0.0.0:50051"),
        ("127.0.0.1:50051", "127.0.0.1:6650", "127.0.0.1:50051"),
    ],
)
def test_a_wildcard_admin_bind_is_advertised_by_the_client_host(
    admin: str, client: str, expected: str
) -> None:
    bound = Address.parse(admin, "admin")
    assert str(advertised_admin(bound, client)) == expected


def test_an_advertised_admin_address_is_what_other_brokers_are_told() -> None:
    """Behind NAT or a proxy (the partition test's): file, flag, and the registration."""
    bound = Address("0.0.0.0", 50051)
    assert str(advertised_admin(bound, "10.0.0.5:6650", "nat.example.com:1234")) == (
        "nat.example.com:1234"
    )
    assert str(advertised_admin(bound, "10.0.0.5:6650", None)) == "10.0.0.5:50051"
    listeners = {"advertised_listeners": {"admin_url": "http://nat.example.com:1234"}}
    assert config_from_mapping({"broker": listeners}).advertised_admin_addr == (
        "nat.example.com:1234"
    )
    with pytest.raises(ConfigError, match=r"admin_url"):
        config_from_mapping({"broker": {"advertised_listeners": {"admin_url": "no-port"}}})
    parse = build_parser().parse_args
    flagged = load_config(parse(["--advertised-admin-addr", "127.0.0.1:7001"]))
    assert flagged.advertised_admin_addr == "127.0.0.1:7001"
    assert load_config(parse([])).advertised_admin_addr is None


def test_a_loopback_admin_port_behind_a_public_client_address_is_reported() -> None:
    """Cluster mode: other hosts' brokers forward admin calls to this address."""
    local = Address("127.0.0.1", 50051)
    why = unreachable_admin(local, "10.0.0.5:6650")
    assert why is not None and "broker.admin_host" in why and "127.0.0.1:50051" in why
    assert unreachable_admin(local, "127.0.0.1:6650") is None, "one host: fine"
    assert unreachable_admin(Address("10.0.0.5", 50051), "10.0.0.5:6650") is None


def test_metrics_per_topic_is_on_unless_turned_off() -> None:
    assert config_from_mapping({}).metrics_per_topic is True
    assert config_from_mapping({"metrics": {"per_topic": False}}).metrics_per_topic is False
    with pytest.raises(ConfigError, match=r"metrics\.per_topic"):
        config_from_mapping({"metrics": {"per_topic": "no"}})
    with pytest.raises(ConfigError, match=r"metrics: unknown key"):
        config_from_mapping({"metrics": {"per_topics": False}})
    parse = build_parser().parse_args
    assert load_config(parse(["--metrics-per-topic", "off"])).metrics_per_topic is False
    assert load_config(parse(["--metrics-per-topic", "on"])).metrics_per_topic is True


HOSTS = st.one_of(
    st.ip_addresses().map(str),
    st.sampled_from(["0.0.0.0", "::", "localhost", "broker.example.com", "::1", "127.9.9.9"]),
)


@given(client=HOSTS, moved_to=HOSTS)
def test_admin_and_metrics_never_follow_the_client_to_a_public_host(
    client: str, moved_to: str
) -> None:
    """The rule, for any host the file or the flag names: unless configured on their own, the
    admin and metrics ports listen on a loopback address, and on the client's host only
    when that is loopback."""
    config = config_from_mapping({"broker": {"host": client}})
    for current in (config, config.with_broker_addr(Address(moved_to, 7000))):
        for address in (current.admin_addr, current.prometheus_addr):
            assert address is not None and is_loopback(address.host)
            assert address.host in (current.broker_addr.host, "127.0.0.1")


def test_is_loopback_knows_names_only_by_localhost() -> None:
    assert is_loopback("127.0.0.5") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("loopy")
    assert not is_loopback(str(ipaddress.ip_address("10.0.0.1")))
