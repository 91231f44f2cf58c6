"""Audit a run: decode every stored segment and object, read the producers' ack logs and the
consumers' delivery logs, and report every anomaly (spec/audit.md).

    python -m spark.audit --wal DIR --objects URL --logs DIR --out DIR

Writes `OUT/violations/` (Parquet, one row per anomaly), `OUT/summary.json` and
`OUT/report.txt`; exits 1 when a forbidden anomaly was found, 2 on input it cannot read, 3
when the job failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from danube.audit.logs import (
    ACK_SCHEMA,
    ACKS,
    DELIVERIES,
    DELIVERY_SCHEMA,
    SETTLEMENT_SCHEMA,
    SETTLEMENTS,
)
from spark import checks, sources
from spark.session import get_session


class AuditInputError(Exception):
    """Input the audit cannot read: named in words, exit status 2."""


@dataclass(frozen=True)
class AuditInputs:
    wal_roots: Sequence[str] = ()
    objects_root: str | None = None
    indexed_keys: Sequence[str] | None = None
    logs: Sequence[str] = ()
    options: dict[str, Any] = field(default_factory=dict)
    """fsspec storage options (an S3 `endpoint_url`, credentials come from the environment)."""


@dataclass(frozen=True)
class AuditResult:
    summary: dict[str, Any]
    report: str

    @property
    def ok(self) -> bool:
        return bool(self.summary["ok"])


class Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            elapsed = time.monotonic() - self.started
            print(f"[audit {elapsed:7.1f} s] {message}", file=sys.stderr, flush=True)


def run_audit(
    spark: SparkSession, inputs: AuditInputs, out: str, *, quiet: bool = False
) -> AuditResult:
    progress = Progress(quiet)
    found = sources.replicated_wal_sources(inputs.wal_roots, inputs.options)
    wal_count = len(found)
    if inputs.objects_root is not None:
        found += sources.object_sources(inputs.objects_root, inputs.options, inputs.indexed_keys)
    progress(f"{wal_count} WAL segments and {len(found) - wal_count} objects to decode")
    if not found:
        raise AuditInputError("no WAL segment and no object found under the given roots")
    out_root = out.rstrip("/")
    stored = _decode(spark, found, inputs.options, f"{out_root}/stored")
    progress("storage decoded")
    acks = _log(spark, inputs.logs, ACKS, ACK_SCHEMA, inputs.options)
    deliveries = _log(spark, inputs.logs, DELIVERIES, DELIVERY_SCHEMA, inputs.options)
    settlements = _log(spark, inputs.logs, SETTLEMENTS, SETTLEMENT_SCHEMA, inputs.options)
    checks.all_violations(stored, acks, deliveries, settlements).write.mode("overwrite").parquet(
        f"{out_root}/violations"
    )
    progress("checks done, violations written")
    table = spark.read.parquet(f"{out_root}/violations")
    summary = _summary(table, stored, acks, deliveries)
    report = render_report(summary)
    with fsspec.open(f"{out_root}/summary.json", "w", **inputs.options) as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    with fsspec.open(f"{out_root}/report.txt", "w", **inputs.options) as handle:
        handle.write(report)
    progress("summary and report written")
    return AuditResult(summary, report)


def _decode(
    spark: SparkSession,
    found: list[tuple[str, str, int | None]],
    options: dict[str, Any],
    path: str,
) -> DataFrame:
    """Decodes in tasks and lands the rows as Parquet, so the checks reread them from disk
    instead of holding millions of rows in memory or decoding twice."""
    context = spark.sparkContext
    slices = max(1, min(len(found), context.defaultParallelism * 4))
    rdd = context.parallelize(found, slices).mapPartitions(sources.decoder(options))
    rows = spark.createDataFrame(rdd, sources.STORED_COLUMNS, verifySchema=False)
    rows.write.mode("overwrite").parquet(path)
    return spark.read.parquet(path)


def _log(
    spark: SparkSession,
    roots: Sequence[str],
    name: str,
    schema: pa.Schema,
    options: dict[str, Any],
) -> DataFrame:
    """One log from every `--logs` root. Spark reads the part files itself, so their paths
    keep the root as given (`s3a://` stays `s3a://`, which fsspec would rewrite)."""
    paths = []
    for root in roots:
        directory = f"{root.rstrip('/')}/{name}"
        fs, base = fsspec.core.url_to_fs(directory, **options)
        parts = fs.glob(f"{base}/*.parquet") if fs.exists(base) else []
        paths += [f"{directory}/{part.rpartition('/')[2]}" for part in parts]
    if not paths:
        return spark.createDataFrame([], from_arrow_schema(schema))
    return spark.read.schema(from_arrow_schema(schema)).parquet(*paths)


def _summary(
    table: DataFrame, stored: DataFrame, acks: DataFrame, deliveries: DataFrame
) -> dict[str, Any]:
    by_anomaly: dict[str, int] = {}
    per_topic: dict[str, dict[str, int]] = {}
    for row in table.groupBy("topic", "anomaly").count().collect():
        per_topic.setdefault(row["topic"] or "(none)", {})[row["anomaly"]] = row["count"]
        by_anomaly[row["anomaly"]] = by_anomaly.get(row["anomaly"], 0) + row["count"]
    records = stored.where(F.col("row_type") == "record")
    counts = records.agg(
        F.count("*").alias("rows"), F.countDistinct("topic").alias("topics")
    ).first()
    assert counts is not None
    forbidden = {a: n for a, n in by_anomaly.items() if a in checks.FORBIDDEN}
    return {
        "ok": not forbidden,
        "forbidden": dict(sorted(forbidden.items())),
        "allowed": dict(sorted((a, n) for a, n in by_anomaly.items() if a in checks.ALLOWED)),
        "per_topic": {t: dict(sorted(c.items())) for t, c in sorted(per_topic.items())},
        "stored_records": counts["rows"],
        "topics": counts["topics"],
        "acknowledged": acks.count(),
        "deliveries": deliveries.count(),
    }


def render_report(summary: dict[str, Any]) -> str:
    lines = [
        "Danube audit: " + ("no forbidden anomaly" if summary["ok"] else "FORBIDDEN ANOMALIES"),
        f"stored records {summary['stored_records']} in {summary['topics']} topics; "
        f"acknowledged {summary['acknowledged']}; deliveries {summary['deliveries']}",
        "",
        f"{'anomaly':<22} {'kind':<10} {'count':>10}  meaning",
    ]
    for kind, counts in (("forbidden", summary["forbidden"]), ("allowed", summary["allowed"])):
        for anomaly, count in counts.items():
            meaning = checks.ANOMALIES[anomaly]
            lines.append(f"{anomaly:<22} {kind:<10} {count:>10}  {meaning}")
    if summary["per_topic"]:
        lines += ["", "per topic:"]
        for topic, counts in summary["per_topic"].items():
            listed = ", ".join(f"{a} {n}" for a, n in counts.items())
            lines.append(f"  {topic}: {listed}")
    return "\n".join(lines) + "\n"


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spark.audit",
        description="Audit a Danube run: storage against producer acks and consumer deliveries.",
    )
    parser.add_argument(
        "--wal",
        action="append",
        default=[],
        metavar="DIR",
        help="a broker's WAL root (repeat for several brokers)",
    )
    parser.add_argument(
        "--objects",
        metavar="URL",
        help="the object tier's durable.root (a path, file:// or s3://...)",
    )
    parser.add_argument(
        "--index",
        metavar="FILE",
        help="JSON list of object keys the object index names: read only "
        "those (leaves out orphans of deposed brokers)",
    )
    parser.add_argument(
        "--logs",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory with acks/ and deliveries/ Parquet logs (repeatable)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where violations/, summary.json and report.txt go",
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for every root read or written through fsspec (storage, the "
        "listing of --logs, summary.json, report.txt), e.g. endpoint_url=http://...",
    )
    parser.add_argument(
        "--master", default=None, help="Spark master (default: local[*], or spark-submit's own)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser.parse_args(argv)


def inputs_from(arguments: argparse.Namespace) -> AuditInputs:
    if not arguments.wal and arguments.objects is None:
        raise AuditInputError("nothing to audit: give --wal and/or --objects")
    options: dict[str, Any] = {}
    for item in arguments.storage_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AuditInputError(f"--storage-option wants KEY=VALUE, got {item!r}")
        options[key] = value
    for flag, roots in (
        ("--wal", arguments.wal),
        ("--objects", [arguments.objects] if arguments.objects else []),
        ("--logs", arguments.logs),
    ):
        for root in roots:
            fs, path = fsspec.core.url_to_fs(root, **options)
            if not fs.isdir(path):
                raise AuditInputError(f"{flag} {root}: no such directory")
    for root in arguments.logs:
        fs, path = fsspec.core.url_to_fs(root, **options)
        if not fs.glob(f"{path}/*/*.parquet"):
            raise AuditInputError(f"--logs {root}: no acks/ or deliveries/ Parquet files")
    indexed = None
    if arguments.index is not None:
        try:
            indexed = json.loads(Path(arguments.index).read_text())
        except (OSError, ValueError) as error:
            raise AuditInputError(f"--index {arguments.index}: {error}") from None
        if not isinstance(indexed, list) or not all(isinstance(k, str) for k in indexed):
            raise AuditInputError(f"--index {arguments.index}: not a JSON list of keys")
    return AuditInputs(arguments.wal, arguments.objects, indexed, arguments.logs, options)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    try:
        inputs = inputs_from(arguments)
    except AuditInputError as error:
        print(f"audit: {error}", file=sys.stderr)
        return 2
    master = arguments.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"
    running = SparkSession.getActiveSession()
    spark = get_session(master, progress=not arguments.quiet)
    try:
        result = run_audit(spark, inputs, arguments.out, quiet=arguments.quiet)
    except AuditInputError as error:
        print(f"audit: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        print(f"audit: the audit did not finish: {type(error).__name__}: {error}", file=sys.stderr)
        return 3
    finally:
        if running is None:
            spark.stop()
    print(result.report, end="")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
