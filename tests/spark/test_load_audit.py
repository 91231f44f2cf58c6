"""`danube-cli load` against a real broker process, then the audit of what it left: the
broker's WAL and the generator's logs (issue 7, point 1). Every subscription type, a
partitioned topic and a plain one, routing keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession

from danube.localcluster.broker_process import BrokerProcess
from danube.machines.wal import format as wal_format
from spark.audit import AuditInputs, run_audit

pytestmark = pytest.mark.slow
CLI = Path(sys.executable).parent / "danube-cli"
MESSAGES = 300


def load(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "load", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=180,
    )


def test_a_load_run_against_a_broker_audits_clean(
    spark: SparkSession, tmp_path: Path, broker_factory: type[BrokerProcess]
) -> None:
    broker = broker_factory(tmp_path / "broker").start()
    logs = tmp_path / "logs"
    common = ["-s", broker.url, "--logs", str(logs), "-c", str(MESSAGES), "-r", "200",
              "--producers", "2", "--keys", "3", "--drain", "20",
              "--subscriptions", "exclusive,shared,failover,key_shared"]  # fmt: skip
    plain = load(*common, "--topic-prefix", "/default/audit-plain")
    assert plain.returncode == 0, plain.stderr
    partitioned = load(*common, "--topic-prefix", "/default/audit-parts", "-p", "2")
    assert partitioned.returncode == 0, partitioned.stderr
    for run in (plain, partitioned):
        assert f"acknowledged {MESSAGES} messages" in run.stdout
        assert run.stdout.count("all received") == 4, run.stdout
        assert "[load " in run.stderr  # progress lines
    broker.stop()

    acks = ds.dataset(logs / "acks").to_table()
    assert acks.num_rows == 2 * MESSAGES
    assert set(acks.column("partition").to_pylist()) == {None, 0, 1}

    inputs = AuditInputs([str(broker.data_dir / "wal")], None, None, [str(logs)])
    summary = run_audit(spark, inputs, str(tmp_path / "out"), quiet=True).summary
    assert summary["ok"], summary
    assert summary["acknowledged"] == 2 * MESSAGES
    assert summary["deliveries"] >= 2 * MESSAGES * 4
    assert summary["topics"] == 3  # one plain topic, two partitions


def test_a_run_against_a_lost_write_fails_its_audit(
    spark: SparkSession, tmp_path: Path, broker_factory: type[BrokerProcess]
) -> None:
    """The same pipeline finds a real loss: the WAL cut in half after the run, as a disk
    that acknowledged an fsync it never did would leave it. The cut is an allowed torn tail
    of the newest segment; the acknowledged messages it took are lost writes."""
    broker = broker_factory(tmp_path / "broker").start()
    logs = tmp_path / "logs"
    run = load("-s", broker.url, "--logs", str(logs), "-c", "50", "-r", "200",
               "--topic-prefix", "/default/audit-lost", "--subscriptions", "shared",
               "--drain", "10")  # fmt: skip
    assert run.returncode == 0, run.stderr
    broker.stop()
    (segment,) = (broker.data_dir / "wal").rglob("*.wal")
    data = segment.read_bytes()
    frames = wal_format.scan_segment(data).positions
    segment.write_bytes(data[: frames[len(frames) // 2] + 5])  # inside a frame

    inputs = AuditInputs([str(broker.data_dir / "wal")], None, None, [str(logs)])
    summary = run_audit(spark, inputs, str(tmp_path / "out"), quiet=True).summary
    assert not summary["ok"]
    assert 0 < summary["forbidden"]["lost-write"] < 50
    assert summary["allowed"]["torn-tail"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--subscriptions", "exclusive,bogus"], "unknown subscription type(s) bogus"),
        (["-r", "0"], "--rate must be above 0"),
        (["--payload-bytes", "8"], "--payload-bytes must be at least 32"),
    ],
)
def test_bad_load_flags_are_one_readable_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    run = load("--logs", str(tmp_path), *args)
    assert run.returncode == 2  # a usage error, as argparse's (issue 26)
    assert message in run.stderr and "Traceback" not in run.stderr
