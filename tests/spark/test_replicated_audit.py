"""The audit of a replicated run (issue 27): several brokers' WAL directories hold copies of
one topic's log. Identical copies are one record; the tail a dead owner appended and never
had acknowledged, past where the next owner's epoch starts (its epochs file says so), is
`superseded`, not an inconsistency; an acknowledged message found only in such a tail is lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from danube.audit.digest import payload_digest
from danube.audit.logs import Ack
from spark.audit import AuditInputs, run_audit
from tests.spark import dataset
from tests.spark.dataset import SEGMENT, TOPICS, Run, write_clean_run

pytestmark = pytest.mark.slow
ORDERS = TOPICS[0]
NEW_EPOCH_AT = 2 * SEGMENT + 5
"""The next owner's epoch starts here: the dead owner had appended up to 29 on its own."""


def _epochs(run: Run, starts: list[list[int]]) -> None:
    path = run.wal_file(ORDERS, 0).parent / "epochs"
    path.write_text(json.dumps({"seen": starts[-1][0], "starts": starts}))


def _replicated_run(root: Path, *, epochs: bool = True) -> tuple[Run, Run]:
    """The new owner's directory (`write_clean_run`: offsets 0–29, the last five written in
    epoch 2) and the dead owner's: the same up to 24, then five other messages of epoch 1
    (a producer "ghost") that were never acknowledged."""
    owner = write_clean_run(root / "owner")
    dead = Run(root / "dead")
    frames = dataset.one_per_frame(ORDERS, 2 * SEGMENT, SEGMENT)
    for offset in range(NEW_EPOCH_AT, 3 * SEGMENT):
        frames[offset - 2 * SEGMENT] = [dataset.record(ORDERS, offset, 100 + offset, "ghost")]
    for base, data in (
        (SEGMENT, dataset.segment(ORDERS, SEGMENT, dataset.one_per_frame(ORDERS, SEGMENT, 10))),
        (2 * SEGMENT, dataset.segment(ORDERS, 2 * SEGMENT, frames)),
    ):
        dead.write_segment(dead.wal_file(ORDERS, base), data)
    if epochs:
        _epochs(owner, [[1, 0], [2, NEW_EPOCH_AT]])
        _epochs(dead, [[1, 0]])
    return owner, dead


def _audit(
    spark: SparkSession, owner: Run, dead: Run
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = owner.root / "out"
    inputs = AuditInputs(
        [str(owner.wal), str(dead.wal)], str(owner.objects), None, [str(owner.logs)]
    )
    summary = run_audit(spark, inputs, str(out), quiet=True).summary
    rows = [r.asDict() for r in spark.read.parquet(str(out / "violations")).collect()]
    return summary, rows


def test_a_dead_owners_unacknowledged_tail_is_superseded(
    spark: SparkSession, tmp_path: Path
) -> None:
    summary, rows = _audit(spark, *_replicated_run(tmp_path))
    assert summary["ok"], rows
    assert summary["allowed"] == {"superseded": 3 * SEGMENT - NEW_EPOCH_AT}
    assert sorted(r["offset"] for r in rows) == list(range(NEW_EPOCH_AT, 3 * SEGMENT))
    assert all(r["producer"] == "ghost" for r in rows)


def test_without_epochs_the_two_tails_are_inconsistent(spark: SparkSession, tmp_path: Path) -> None:
    """What the epochs files decide: without them the same copies clash."""
    summary, rows = _audit(spark, *_replicated_run(tmp_path, epochs=False))
    assert not summary["ok"]
    clash = {r["offset"] for r in rows if r["anomaly"] == "inconsistent-offsets"}
    assert clash == set(range(NEW_EPOCH_AT, 3 * SEGMENT))


def test_an_acknowledged_message_only_in_a_superseded_tail_is_lost(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A planted broker bug: the dead owner acknowledged offset 27 before any follower had
    it (the next owner's log does not hold it)."""
    owner, dead = _replicated_run(tmp_path)
    ghost = Ack(ORDERS, "ghost", 127, payload_digest(dataset.payload(ORDERS, 127)), None, 9, 10)
    acks = [*dataset.acks_of(), ghost]
    for part in (owner.logs / "acks").glob("*.parquet"):
        part.unlink()
    for part in (owner.logs / "deliveries").glob("*.parquet"):
        part.unlink()
    dataset.write_logs(owner.logs, acks, dataset.deliveries_of())
    summary, rows = _audit(spark, owner, dead)
    assert not summary["ok"]
    lost = [(r["producer"], r["digest"]) for r in rows if r["anomaly"] == "lost-write"]
    assert lost == [("ghost", ghost.digest)]
    assert summary["forbidden"] == {"lost-write": 1}
