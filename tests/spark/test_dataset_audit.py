"""The scale data set (`bench/audit_dataset.py`) is what bench/RESULTS.md audits: a small
one must audit clean, with exactly its planted repeats counted."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench import audit_dataset
from spark.audit import AuditInputs, run_audit

pytestmark = pytest.mark.slow


def test_a_small_data_set_audits_clean(spark: SparkSession, tmp_path: Path) -> None:
    out = tmp_path / "data"
    code = audit_dataset.main(
        ["--messages", "3000", "--topics", "3", "--segment-records", "400",
         "--subscriptions", "exclusive,shared,key_shared", "--repeat-every", "100",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    inputs = AuditInputs([str(out / "wal")], str(out / "objects"), None, [str(out / "logs")])
    summary = run_audit(spark, inputs, str(tmp_path / "audit"), quiet=True).summary
    assert summary["ok"], summary
    assert summary["acknowledged"] == 3000
    assert summary["allowed"] == {"duplicate-delivery": 30}  # offsets 0, 100, ... per topic
    assert summary["deliveries"] == 3 * 3000 + 30
