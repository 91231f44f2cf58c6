"""The simulator leaves what a real run leaves (client logs, WAL segments, objects, the
object index), and the audit of a faulty run that kept every invariant finds no forbidden
anomaly in it (issue 7, points 1 and 6)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from danube import keys
from danube.machines.tiering import layout
from danube.values.names import TopicName, parse_topic
from sim.__main__ import PROFILES
from sim.__main__ import main as sim_main
from sim.objects import impostor_segment
from sim.run import TIERED, Simulation, Workload
from spark.audit import AuditInputs, run_audit

pytestmark = pytest.mark.slow
FAULTS = PROFILES["default"]


def audit(spark: SparkSession, root: Path, *, index: bool = True) -> dict[str, object]:
    keys_file = root / "index.json"
    keys = json.loads(keys_file.read_text()) if index and keys_file.exists() else None
    objects = str(root / "objects") if (root / "objects").exists() else None
    inputs = AuditInputs([str(root / "wal")], objects, keys, [str(root / "logs")])
    out = root / ("out" if index else "out-without-index")
    return run_audit(spark, inputs, str(out), quiet=True).summary


def test_a_faulty_run_audits_clean_and_the_logs_match_the_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    simulation = Simulation(42, Workload(), FAULTS, audit_dir=tmp_path)
    result = simulation.run(6.0)
    assert result.ok and result.drained
    assert sum(result.injected.values()) > 0  # faults really happened
    summary = audit(spark, tmp_path)
    assert summary["ok"], summary
    assert summary["acknowledged"] == result.acknowledged
    assert summary["deliveries"] == result.received
    assert summary["allowed"].get("duplicate-delivery", 0) > 0  # nacks and restarts


def test_a_run_whose_policy_drops_poison_audits_clean(spark: SparkSession, tmp_path: Path) -> None:
    """Issue 24, point 6: the messages the Drop policy passed are in the run's settlement
    log (the broker's `policy_dropped` events), and the audit counts each as dropped by
    policy. (Here each was received and nacked first, so none would be `unseen` without
    the log; one whose every delivery was lost on the way is: test_audit.py.)"""
    simulation = Simulation(1, Workload(poison="drop"), FAULTS, audit_dir=tmp_path)
    result = simulation.run(5.0)
    assert result.ok, result.violations
    dropped = sum(len(s.dropped) for s in simulation.checker.subscriptions.values())
    assert dropped > 0
    summary = audit(spark, tmp_path)
    assert summary["ok"], summary
    assert summary["allowed"]["dropped-by-policy"] == dropped


def test_a_run_whose_policy_dead_letters_poison_audits_clean(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 24: the dead letters the broker stored (found on disk by their `x-original-*`
    attributes) settle their originals for the audit: none is `unseen` or `lost-write`."""
    simulation = Simulation(1, Workload(poison="dead_letter"), FAULTS, audit_dir=tmp_path)
    result = simulation.run(5.0)
    assert result.ok, result.violations
    dead = sum(len(s.dead_lettered) for s in simulation.checker.subscriptions.values())
    assert dead > 0
    summary = audit(spark, tmp_path)
    assert summary["ok"], summary
    assert summary["allowed"].get("dead-lettered", 0) >= dead


def test_a_tiered_run_audits_clean_and_needs_the_index_to_leave_out_an_orphan(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The run's `fenced_upload` fault plants impostors as a deposed writer leaves them
    (records no producer sent, `impostor:<offset>`, at offsets the index has), and the orphan
    collection deletes each once it is older than the grace period (2 s): one planted in the
    run's last seconds is still there at the end. The test plants one more (its own epoch in
    the key). Read as history they contradict the real objects, and only the index keeps the
    audit from them: without it, the offsets found holding two messages are exactly those
    where an impostor overlaps what the index and the WAL hold (each of the test's orphan's
    among them), never an offset of an object the broker itself uploaded, indexed or not.
    How many impostors the run leaves depends on its schedule, so no count is pinned."""
    simulation = Simulation(1, TIERED, FAULTS, audit_dir=tmp_path)
    result = simulation.run(10.0)
    assert result.ok
    indexed = json.loads((tmp_path / "index.json").read_text())
    assert indexed and all((tmp_path / "objects" / key).exists() for key in indexed)

    summary = audit(spark, tmp_path)
    assert summary["ok"], summary
    assert summary["acknowledged"] == result.acknowledged

    (topic,) = simulation.topics
    name = parse_topic(topic)
    orphan = layout.object_key(name, 10, 20, epoch=99)
    (tmp_path / "objects" / orphan).write_bytes(impostor_segment(topic, range(10, 20), 0))
    assert audit(spark, tmp_path)["ok"]
    unindexed = audit(spark, tmp_path, index=False)
    assert not unindexed["ok"]

    impostors = {key for key in simulation.impostors if (tmp_path / "objects" / key).exists()}
    impostors.add(orphan)
    stored = simulation.checker.payload_at[topic].keys()  # every offset the WAL wrote
    overlapped = {
        offset for key in impostors for offset in range(*_range_of(name, key)) if offset in stored
    }
    rows = spark.read.parquet(str(tmp_path / "out-without-index" / "violations")).collect()
    clashes = {r["offset"] for r in rows if r["anomaly"] == "inconsistent-offsets"}
    assert set(range(10, 20)) <= clashes
    assert clashes == overlapped, sorted(clashes ^ overlapped)
    assert unindexed["forbidden"]["inconsistent-offsets"] == len(overlapped)


def _range_of(topic: TopicName, key: str) -> tuple[int, int]:
    parsed = keys.parse_object_key(topic, key)
    assert parsed is not None, key
    return parsed


def test_the_logs_change_nothing_in_the_run(tmp_path: Path) -> None:
    plain = Simulation(7, Workload(), FAULTS).run(3.0)
    logged = Simulation(7, Workload(), FAULTS, audit_dir=tmp_path).run(3.0)
    assert logged.digest == plain.digest
    assert list((tmp_path / "logs" / "acks").glob("*.parquet"))


def test_the_command_writes_one_directory_per_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = sim_main(
        ["--seed", "3", "--seeds", "2", "--duration", "1", "--audit-out", str(tmp_path)]
    )
    assert code == 0
    for seed in (3, 4):
        assert list((tmp_path / f"seed-{seed}" / "wal").rglob("*.wal"))
        assert list((tmp_path / f"seed-{seed}" / "logs" / "deliveries").glob("*.parquet"))


def test_a_bit_the_simulator_flipped_is_the_corrupt_frame_the_broker_stopped_at(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A heavy seed flips a durable bit; the broker's recovery stops the topic at a byte of
    one segment. The audit, reading the same disk image, names the same place. Which seed
    flips a bit moves whenever the simulated timing changes (seed 1 until the batched clients
    and the shared request paths joined the default runs), so the test takes the first of
    1-50 whose run flips one and stops its topic at a segment's byte."""
    for seed in range(1, 51):
        run_dir = tmp_path / f"seed-{seed}"
        result = Simulation(seed, Workload(), PROFILES["heavy"], audit_dir=run_dir).run(10.0)
        assert result.ok, (seed, result.violations)
        if result.injected["bit_flip"] != 1 or len(result.stopped_topics) != 1:
            continue
        (reason,) = result.stopped_topics.values()
        stopped_at = re.search(r"segment (\d{20}\.wal), byte (\d+)", reason)
        if stopped_at is not None:
            break
    else:
        raise AssertionError("no seed of 50 flipped a durable bit the broker stopped at")
    segment, byte = stopped_at.groups()
    tmp_path = run_dir

    summary = audit(spark, tmp_path)
    assert not summary["ok"]
    assert summary["forbidden"]["corrupt-frame"] == 1
    rows = spark.read.parquet(str(tmp_path / "out" / "violations")).collect()
    (corrupt,) = [r for r in rows if r["anomaly"] == "corrupt-frame"]
    assert f"/default/sim-0/{segment}: byte {byte}: " in corrupt["detail"]


def test_the_command_refuses_a_directory_an_earlier_run_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "seed-5" / "logs").mkdir(parents=True)
    with pytest.raises(SystemExit) as stopped:
        sim_main(["--seed", "5", "--duration", "1", "--audit-out", str(tmp_path)])
    assert stopped.value.code == 2
    assert "seed-5 exists: give a fresh --audit-out" in capsys.readouterr().err
