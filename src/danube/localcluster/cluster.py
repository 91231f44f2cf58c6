"""A whole cluster on one machine: etcd, moto's S3 server and N brokers in cluster mode, each
a real process on loopback ports, all data under one directory. `danube-local-cluster` runs
it for a demo; the cluster tests and benchmarks drive it from Python (kill a broker, add one).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml

from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.etcd_process import EtcdProcess
from danube.localcluster.s3_process import CREDENTIALS, S3Process
from danube.values.config import DEFAULT_PROMETHEUS_PORT


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    brokers: int = 3
    lease_ttl_ms: int = 3_000
    """How long a dead broker keeps its topics: failover starts once its lease expires."""
    durability: str = "fsync"
    object_batch_ms: int = 100
    """With `object` durability: how long a publish may wait for others to share its upload."""
    segment_bytes: int = 1024 * 1024
    """Small segments: moves and failovers upload (and lose, at `fsync`) little."""
    first_port: int = 0
    """Brokers listen on first_port + 2i (client) and + 2i + 1 (admin), and serve metrics on
    9040 + i; 0: free ports for all three."""
    rebalancing: bool = True
    """A `load_manager.rebalancing` section (manual rebalances only, no minimum topic age)."""
    replication_lag_ms: int | None = None
    """`cluster.replication.lag_ms` (None: the broker's default): how long an owner waits
    for a silent follower before acknowledging without it."""
    lookup_hold_ms: int | None = None
    """`cluster.lookup_hold_ms` (None: the broker's default): how long a request for a topic
    between owners waits for it (spec/cluster.md, "Held answers")."""
    auth: dict[str, object] | None = None
    """Every broker's `auth` section (spec/security.md, "In a cluster"); the secrets come
    from the environment the brokers inherit (DANUBE_JWT_SECRET_KEY, DANUBE_CLUSTER_KEY)."""


class LocalCluster:
    def __init__(self, root: Path, settings: ClusterSettings = ClusterSettings()) -> None:
        self.root = root
        self.settings = settings
        self.etcd = EtcdProcess(root / "etcd")
        self.s3 = S3Process(root / "s3.log")
        self.brokers: list[BrokerProcess] = []

    def start(self) -> LocalCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.etcd.start()
            self.s3.start()
            for _ in range(self.settings.brokers):
                self.add_broker()
        except BaseException:
            self.stop()
            raise
        return self

    def add_broker(self, advertised_admin_addr: str | None = None) -> BrokerProcess:
        """Starts one more broker. `advertised_admin_addr`: the host:port other brokers reach
        its admin port by (`--advertised-admin-addr`: forwarded admin calls, replication),
        e.g. a proxy a test can cut; default its own."""
        index = len(self.brokers)
        data_dir = self.root / f"broker-{index}"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = data_dir / "broker.yaml"
        config.write_text(yaml.safe_dump(self.broker_config()))
        first = self.settings.first_port
        advertise = (
            ("--advertised-admin-addr", advertised_admin_addr) if advertised_admin_addr else ()
        )
        broker = BrokerProcess(
            data_dir,
            config_file=config,
            broker_port=first + 2 * index if first else 0,
            admin_port=first + 2 * index + 1 if first else 0,
            metrics_port=DEFAULT_PROMETHEUS_PORT + index if first else 0,
            extra_args=("--mode", "cluster", *advertise),
            env=CREDENTIALS,
            log_file=data_dir / "broker.log",
        )
        self.brokers.append(broker)
        broker.start()
        return broker

    def restart_broker(self, index: int) -> BrokerProcess:
        """Starts broker `index` again, after it exited: same ports, same data directory."""
        broker = self.brokers[index]
        if broker.alive:
            raise RuntimeError(f"broker {index} is running")
        broker.start()
        return broker

    def broker_config(self) -> dict[str, object]:
        ttl = self.settings.lease_ttl_ms
        config: dict[str, object] = {
            "cluster_name": "local",
            "meta_store": {"etcd_endpoints": [self.etcd.endpoint]},
            "cluster": {
                "lease_ttl_ms": ttl,
                "renew_interval_ms": max(ttl // 5, 100),
                "drift_ms": ttl // 6,
                "load_report_interval_ms": 2_000,
                **(
                    {"lookup_hold_ms": self.settings.lookup_hold_ms}
                    if self.settings.lookup_hold_ms is not None
                    else {}
                ),
                **(
                    {"replication": {"lag_ms": self.settings.replication_lag_ms}}
                    if self.settings.replication_lag_ms is not None
                    else {}
                ),
            },
            "storage": {
                "mode": "object_store",
                "durable": {"root": f"s3://{self.s3.bucket}/cluster", "endpoint": self.s3.endpoint},
                "wal": {
                    "durability": self.settings.durability,
                    "rotation": {"max_bytes": self.settings.segment_bytes},
                    **(
                        {"object_batch_ms": self.settings.object_batch_ms}
                        if self.settings.durability == "object"
                        else {}
                    ),
                },
            },
            "load_manager": {"assignment_strategy": "fair"},
        }
        if self.settings.auth is not None:
            config["auth"] = self.settings.auth
        if self.settings.rebalancing:
            config["load_manager"] = {
                "assignment_strategy": "fair",
                "rebalancing": {
                    "enabled": False,
                    "aggressiveness": "aggressive",
                    "cooldown_seconds": 1,
                    "min_topic_age_seconds": 0,
                    "max_moves_per_hour": 1000,
                },
            }
        return config

    @property
    def service_urls(self) -> list[str]:
        """The live brokers' client URLs (`https://` when the cluster is secured)."""
        secured = self.settings.auth is not None and self.settings.auth.get("mode") != "none"
        return [f"https://{b.broker_addr}" if secured else b.url for b in self.brokers if b.alive]

    def owner(self, topic: str) -> BrokerProcess:
        """The live broker serving `topic` now (loaded it and did not unload it since)."""
        found = [
            b
            for b in self.brokers
            if b.alive
            and topic in b.loaded_topics()
            and f"event=topic_unloaded topic={topic} " not in b.log_text()
        ]
        if len(found) != 1:
            raise AssertionError(f"{topic} is served by {len(found)} live brokers")
        return found[0]

    def stop(self) -> None:
        """Brokers first (all at once: each seals and uploads its topics), then S3 and etcd."""
        running = [b for b in self.brokers if b.alive]
        threads = [
            threading.Thread(target=self._stop_broker, args=(b,), daemon=True) for b in running
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self.s3.stop()
        self.etcd.stop()

    @staticmethod
    def _stop_broker(broker: BrokerProcess) -> None:
        try:
            broker.stop(signal.SIGTERM, timeout=45)
        except Exception:
            broker.kill()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
