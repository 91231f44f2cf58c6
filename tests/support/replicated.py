"""Watching a replicated topic on a real local cluster (issue 27's real-process tests): who
owns it, how many in-sync copies its owner counts, what the admin API says, and the audit of
what the run left (every broker's WAL and the object tier)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from grpclib.client import Channel

from danube.keys import INDEX_ROOT, IndexKey, parse_index_key
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import LocalCluster
from danube.localcluster.s3_process import CREDENTIALS
from danube.metadata.etcd import EtcdStore
from danube.proto import danube_ext as ext_pb
from tests.support.metrics import scrape

CLI = Path(sys.executable).parent / "danube-cli"


def wait(
    check: Callable[[], object],
    timeout: float,
    what: str,
    cluster: LocalCluster,
    more: Callable[[], str] = str,
) -> None:
    """Until `check()`; on timeout fails with the brokers' relevant log lines and `more()`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}\n{logs(cluster)}\n{more()}"
            )
        time.sleep(0.2)


def logs(cluster: LocalCluster, topic: str = "") -> str:
    """The brokers' lines about replication, errors and warnings (and `topic`): what a
    failed wait needs to be understood."""
    lines = [
        f"{b.data_dir.name}: {line}"
        for b in cluster.brokers
        for line in b.log_lines
        if "replica" in line or "error" in line.lower() or "warn" in line.lower()
        or (topic and topic in line)
    ]  # fmt: skip
    return "\n".join(lines[-80:])


def copies(broker: BrokerProcess, topic: str) -> float:
    """The topic's in-sync copies as `broker` (its owner) counts them; 0 when unknown."""
    try:
        samples = scrape(broker.metrics_url).matching(
            "danube_replication_in_sync_copies", topic=topic
        )
    except OSError:
        return 0.0
    return samples[0].value if samples else 0.0


def followed(broker: BrokerProcess) -> float:
    try:
        return scrape(broker.metrics_url).value("danube_replication_followed_topics")
    except (OSError, KeyError, AssertionError):
        return 0.0


def broker_id(broker: BrokerProcess) -> str:
    match = re.search(r"event=broker_ready broker_id=(\S+)", broker.log_text())
    assert match is not None
    return match.group(1)


async def replication(broker: BrokerProcess, topic: str) -> ext_pb.TopicReplicationResponse:
    """What `danube-admin topics describe` shows of the topic's replication, asked of
    `broker` (any broker answers)."""
    channel = Channel(*broker.admin_addr.rsplit(":", 1))
    try:
        stub = ext_pb.ReplicationAdminStub(channel, timeout=10)
        return await stub.topic_replication(ext_pb.TopicReplicationRequest(name=topic))
    finally:
        channel.close()


def describe(broker: BrokerProcess, topic: str) -> ext_pb.TopicReplicationResponse:
    return asyncio.run(replication(broker, topic))


def owner(cluster: LocalCluster, topic: str) -> BrokerProcess | None:
    """The one live broker whose last word on the topic is that it loaded it."""
    pattern = re.compile(rf"event=topic_(loaded|dropped|unloaded) topic={re.escape(topic)} ")
    found = [
        b
        for b in cluster.brokers
        if b.alive and [m.group(1) for m in pattern.finditer(b.log_text())][-1:] == ["loaded"]
    ]
    return found[0] if len(found) == 1 else None


class Load:
    """`danube-cli load` in the background against the whole cluster (every broker's own
    URL), writing the ack and delivery logs the audit reads; its progress lines give the
    acknowledged count as it goes."""

    def __init__(self, urls: list[str], logs_dir: Path, *args: str) -> None:
        self.logs_dir = logs_dir
        self.process = subprocess.Popen(
            [str(CLI), "load", "-s", ",".join(urls), "--logs", str(logs_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.err_lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.err_lines.append(line.rstrip("\n"))

    @property
    def acknowledged(self) -> int:
        """The last progress line's acknowledged count (0 before the first)."""
        for line in reversed(self.err_lines):
            match = re.search(r"acknowledged (\d+)/", line)
            if match:
                return int(match.group(1))
        return 0

    def finish(self, timeout: float) -> tuple[int, str, str]:
        out, _ = self.process.communicate(timeout=timeout)
        self._reader.join(5)
        return self.process.returncode, out, "\n".join(self.err_lines)


def download_indexed_objects(cluster: LocalCluster, dest: Path) -> int:
    """Copies the objects the cluster's object index names from its S3 (durable root
    `s3://<bucket>/cluster`) to `dest`, laid out as under the root, for the audit's
    `--objects`: only the indexed ones, so an orphan a killed owner uploaded is left out (as
    `--index` would). boto3 is synchronous: in one run s3fs's listing in the test process hung
    for good (its event loop thread was gone), which a test must not risk."""
    import boto3  # moto's dependency; only these tests need it

    client = boto3.client(
        "s3",
        endpoint_url=cluster.s3.endpoint,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
    )
    keys = indexed_keys(cluster)
    for key in keys:
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(cluster.s3.bucket, f"cluster/{key}", str(target))
    return len(keys)


async def _indexed_keys(endpoint: str) -> list[str]:
    """(trio: the metadata store's client runs on it)"""
    async with await EtcdStore.connect([endpoint]) as store:
        found = await store.scan(INDEX_ROOT)
    return [
        str(kv.value["key"])
        for kv in found
        if isinstance(parse_index_key(kv.key), IndexKey) and isinstance(kv.value, dict)
    ]


def indexed_keys(cluster: LocalCluster) -> list[str]:
    """The object keys the cluster's object index names (what `spark.audit --index` takes):
    the audit then leaves out an orphan a deposed or killed owner uploaded but never got
    indexed, which is no part of the topic's history."""
    return trio.run(_indexed_keys, cluster.etcd.endpoint)


def audit_stopped_run(
    spark: Any, cluster: LocalCluster, run_dir: Path, mark: Callable[[str], None]
) -> dict[str, Any]:
    """Stops the live brokers in order (each seals and uploads its tail), copies the indexed
    objects while the object store still runs, and audits every broker's WAL (killed ones'
    too), those objects and the load's logs under `run_dir / "logs"`: the audit's summary.
    `mark` hears the two phases, for the test's timing line."""
    from spark.audit import AuditInputs, run_audit  # pyspark: only these tests need it

    for broker in cluster.brokers:
        if broker.alive:
            broker.stop()
    objects = run_dir / "objects"
    indexed = download_indexed_objects(cluster, objects)
    assert indexed, "stopped brokers upload their tails: the index names objects"
    inputs = AuditInputs(
        [str(b.data_dir / "wal") for b in cluster.brokers],
        str(objects),
        None,
        [str(run_dir / "logs")],
    )
    mark("brokers stopped")
    summary: dict[str, Any] = run_audit(spark, inputs, str(run_dir / "audit"), quiet=True).summary
    mark("audited")
    return summary
