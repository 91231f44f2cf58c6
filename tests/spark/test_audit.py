"""The audit finds each anomaly planted in an otherwise clean run and names it right, and a
clean run reports none (issue 7, point 4). Real Spark in local mode, real files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from danube.audit.digest import payload_digest
from danube.audit.logs import Ack, Settlement, SettlementLog
from danube.machines.wal import format as wal_format
from danube.proto import danube as pb
from spark.audit import AuditInputs, main, run_audit
from tests.spark import dataset
from tests.spark.dataset import SEGMENT, TOPICS, Run, write_clean_run, write_logs

pytestmark = pytest.mark.slow
ORDERS, EVENTS = TOPICS


def audit(spark: SparkSession, run: Run) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = run.root / "out"
    inputs = AuditInputs([str(run.wal)], str(run.objects), None, [str(run.logs)])
    result = run_audit(spark, inputs, str(out), quiet=True)
    rows = [r.asDict() for r in spark.read.parquet(str(out / "violations")).collect()]
    return result.summary, rows


def kinds(rows: list[dict[str, Any]]) -> set[str]:
    return {r["anomaly"] for r in rows}


def test_a_clean_run_has_no_anomaly(spark: SparkSession, tmp_path: Path) -> None:
    summary, rows = audit(spark, write_clean_run(tmp_path))
    assert rows == []
    assert summary["ok"] and summary["forbidden"] == {} and summary["allowed"] == {}
    assert summary["stored_records"] == 2 * len(TOPICS) * SEGMENT * 2  # WAL and objects overlap
    assert summary["acknowledged"] == 60 and summary["deliveries"] == 120
    assert summary["topics"] == 2


def test_a_message_dropped_from_an_object_is_a_lost_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = write_clean_run(tmp_path)
    path = run.object_file(ORDERS, 0)
    data = path.read_bytes()
    frames = wal_format.scan_segment(data).positions
    path.write_bytes(data[: frames[4]] + data[frames[5] :])  # the frame of offset 4 cut out
    summary, rows = audit(spark, run)
    assert not summary["ok"]
    lost = [r for r in rows if r["anomaly"] == "lost-write"]
    assert [(r["topic"], r["digest"]) for r in lost] == [
        (ORDERS, payload_digest(dataset.payload(ORDERS, 4)))
    ]
    gaps = [r for r in rows if r["anomaly"] == "offset-gap"]
    assert [(r["topic"], r["offset"]) for r in gaps] == [(ORDERS, 4)]
    phantoms = {
        (r["subscription"], r["offset"]) for r in rows if r["anomaly"] == "phantom-delivery"
    }
    assert phantoms == {("ex", 4), ("sh", 4)}, "both reliable subscriptions received it"
    assert kinds(rows) == {"lost-write", "offset-gap", "phantom-delivery"}


def test_an_offset_stored_twice_with_different_messages_is_inconsistent(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = write_clean_run(tmp_path)
    frames = dataset.one_per_frame(EVENTS, SEGMENT, SEGMENT)
    frames[2] = [dataset.record(EVENTS, SEGMENT + 2, 999, producer="intruder")]
    run.wal_file(EVENTS, SEGMENT).write_bytes(dataset.segment(EVENTS, SEGMENT, frames))
    summary, rows = audit(spark, run)
    clash = [r for r in rows if r["anomaly"] == "inconsistent-offsets" and r["consumer"] is None]
    assert [(r["topic"], r["offset"]) for r in clash] == [(EVENTS, 12)]
    assert "2 different messages" in clash[0]["detail"]
    assert summary["forbidden"]["inconsistent-offsets"] >= 1


def test_a_flipped_byte_is_a_corrupt_frame(spark: SparkSession, tmp_path: Path) -> None:
    """In the object of 10–19, whose segment the WAL still holds: the records survive
    there, so the damage is all there is to report."""
    run = write_clean_run(tmp_path)
    path = run.object_file(ORDERS, SEGMENT)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    summary, rows = audit(spark, run)
    assert kinds(rows) == {"corrupt-frame"}
    (row,) = rows
    assert row["topic"] == ORDERS and str(path) in row["detail"]
    assert summary["forbidden"] == {"corrupt-frame": 1}


def test_a_reordered_delivery_log_is_a_nonmonotonic_poll(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = write_clean_run(tmp_path)
    deliveries = dataset.deliveries_of()
    swapped = []
    for d in deliveries:
        if d.subscription == "ex" and d.topic == ORDERS and d.offset in (7, 8):
            d = d._replace(n=15 - d.n)  # offset 8 now came first
        swapped.append(d)
    _rewrite_logs(run, dataset.acks_of(), swapped)
    summary, rows = audit(spark, run)
    assert kinds(rows) == {"nonmonotonic-poll"}
    (row,) = rows
    assert (row["subscription"], row["consumer"], row["offset"]) == ("ex", "c1", 7)
    assert not summary["ok"]


def test_a_takeover_that_starts_again_at_the_cursor_is_no_nonmonotonic_poll(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What the simulator showed: c1 received 0–19 and died; the restarted broker first
    redelivered c1's unacknowledged 15–19 to c2, then started again at the cursor (10), so
    c2 received 10–14 for the first time after 19. Every one of them is a repeat for the
    subscription. A once-only offset below one c2 had seen is still a violation (22)."""
    run = write_clean_run(tmp_path)
    deliveries = [d for d in dataset.deliveries_of() if d.subscription != "ex"]
    exclusive = [d for d in dataset.deliveries_of() if d.subscription == "ex"]
    by_offset = {(d.topic, d.offset): d for d in exclusive}
    for topic in TOPICS:
        received = list(range(20))
        taken_over = [*range(15, 20), *range(10, 20)]
        rest = [20, 21, 23, 22, *range(24, 30)] if topic == ORDERS else list(range(20, 30))
        deliveries += [by_offset[topic, o]._replace(n=n) for n, o in enumerate(received)]
        deliveries += [
            by_offset[topic, o]._replace(consumer="c2", n=n)
            for n, o in enumerate(taken_over + rest)
        ]
    _rewrite_logs(run, dataset.acks_of(), deliveries)
    summary, rows = audit(spark, run)
    assert kinds(rows) == {"nonmonotonic-poll", "duplicate-delivery"}
    (back,) = [r for r in rows if r["anomaly"] == "nonmonotonic-poll"]
    assert (back["topic"], back["consumer"], back["offset"]) == (ORDERS, "c2", 22)
    assert summary["allowed"]["duplicate-delivery"] == 2 * 10


@pytest.mark.parametrize(
    ("subscription", "expected"),
    [("sh", {"unseen"}), ("ex", {"unseen", "poll-skip"})],
)
def test_a_dropped_delivery_is_unseen(
    spark: SparkSession, tmp_path: Path, subscription: str, expected: set[str]
) -> None:
    """A Shared subscription has no order, so the drop is only unseen; an Exclusive
    consumer also jumped over a stored offset."""
    run = write_clean_run(tmp_path)
    deliveries = [
        d
        for d in dataset.deliveries_of()
        if not (d.subscription == subscription and d.topic == EVENTS and d.offset == 17)
    ]
    _rewrite_logs(run, dataset.acks_of(), deliveries)
    summary, rows = audit(spark, run)
    assert kinds(rows) == expected
    assert {(r["subscription"], r["topic"], r["offset"]) for r in rows} == {
        (subscription, EVENTS, 17)
    }
    assert summary["per_topic"][EVENTS]["unseen"] == 1


DLQ = "/default/events-dlq"


def write_dead_letter(run: Run, subscription: str, offset: int) -> None:
    """The dead-letter topic's one segment: a copy of EVENTS' message at `offset` naming
    it (Danube's `x-original-*` attributes)."""
    copy = pb.StreamMessage(
        request_id=0,
        msg_id=pb.MsgId(topic_name=DLQ, topic_offset=0),
        payload=dataset.payload(EVENTS, offset),
        producer_name="dead-letters",
        attributes={
            "x-original-topic": EVENTS,
            "x-original-subscription": subscription,
            "x-original-topic-offset": str(offset),
            "x-poison-policy": "dead_letter",
        },
    )
    run.write_segment(run.wal_file(DLQ, 0), dataset.segment(DLQ, 0, [[bytes(copy)]]))


@pytest.mark.parametrize(
    ("settled_for", "how", "expected"),
    [
        ("sh", "dead-letter", {"dead-lettered"}),
        ("sh", "drop", {"dropped-by-policy"}),
        ("ex", "dead-letter", {"dead-lettered", "unseen"}),  # another subscription's copy
        ("ex", "drop", {"dropped-by-policy", "unseen"}),
    ],
)
def test_a_message_settled_by_policy_is_not_unseen(
    spark: SparkSession, tmp_path: Path, settled_for: str, how: str, expected: set[str]
) -> None:
    """Issue 24, point 6: a message its subscription never received is allowed when it was
    dead-lettered (the copy in storage names it) or dropped by the subscription's policy
    (the broker's `policy_dropped` event, as `danube.audit.events` writes it); for any
    other subscription it is still `unseen`, forbidden."""
    run = write_clean_run(tmp_path)
    deliveries = [
        d
        for d in dataset.deliveries_of()
        if not (d.subscription == "sh" and d.topic == EVENTS and d.offset == 17)
    ]
    _rewrite_logs(run, dataset.acks_of(), deliveries)
    if how == "dead-letter":
        write_dead_letter(run, settled_for, 17)
    else:
        log = SettlementLog(run.logs, "broker")
        log.settled(Settlement(EVENTS, settled_for, 17, "dropped", 3))
        log.close()
    summary, rows = audit(spark, run)
    assert kinds(rows) == expected
    assert summary["ok"] == ("unseen" not in expected)
    settled = [r for r in rows if r["anomaly"] != "unseen"]
    assert [(r["subscription"], r["topic"], r["offset"]) for r in settled] == [
        (settled_for, EVENTS, 17)
    ]


def test_repeats_are_counted_not_forbidden(spark: SparkSession, tmp_path: Path) -> None:
    """A redelivery, a producer's retry stored twice and a torn local tail are what
    at-least-once delivery and crashes leave: counted, the run still passes."""
    run = write_clean_run(tmp_path)
    deliveries = dataset.deliveries_of()
    again = next(d for d in deliveries if d.subscription == "ex" and d.offset == 29)
    deliveries.append(again._replace(n=1_000))
    _rewrite_logs(run, dataset.acks_of(), deliveries)
    frames = dataset.one_per_frame(ORDERS, 2 * SEGMENT, SEGMENT)
    frames.append([dataset.record(ORDERS, 30, 29)])  # seq 29 again, at offset 30
    torn = dataset.segment(ORDERS, 2 * SEGMENT, frames) + b"\x07" * 40
    run.wal_file(ORDERS, 2 * SEGMENT).write_bytes(torn)
    summary, rows = audit(spark, run)
    assert summary["ok"], rows
    assert summary["allowed"] == {"duplicate": 1, "duplicate-delivery": 1, "torn-tail": 1}
    (duplicate,) = [r for r in rows if r["anomaly"] == "duplicate"]
    assert "offsets 29, 30" in duplicate["detail"]


def test_an_ack_naming_another_offset_is_inconsistent(spark: SparkSession, tmp_path: Path) -> None:
    run = write_clean_run(tmp_path)
    acks = [a._replace(offset=a.seq) for a in dataset.acks_of()]
    acks[3] = acks[3]._replace(offset=5)
    _rewrite_logs(run, acks, dataset.deliveries_of())
    _, rows = audit(spark, run)
    assert [(r["anomaly"], r["topic"], r["offset"]) for r in rows] == [
        ("inconsistent-offsets", ORDERS, 5)
    ]


def test_key_shared_order_is_judged_per_routing_key(spark: SparkSession, tmp_path: Path) -> None:
    """Keys are k0, k1, k2 for offsets 0, 1, 2, 3...: offset 1 (k1) before 0 (k0) is no
    disorder for a Key-Shared consumer; offset 6 (k0) before 3 (k0) is."""
    run = write_clean_run(tmp_path)
    deliveries = dataset.deliveries_of()
    order = [1, 0, 2, 6, 3, 4, 5, *range(7, dataset.MESSAGES)]
    by_offset = {d.offset: d for d in deliveries if (d.subscription, d.topic) == ("ex", ORDERS)}
    for n, offset in enumerate(order):
        deliveries.append(
            by_offset[offset]._replace(subscription="ks", sub_type="key_shared", consumer="k", n=n)
        )
    _rewrite_logs(run, dataset.acks_of(), deliveries)
    _, rows = audit(spark, run)
    assert [(r["anomaly"], r["subscription"], r["offset"]) for r in rows] == [
        ("nonmonotonic-poll", "ks", 3)
    ]


def test_a_delivery_of_another_message_than_stored_is_inconsistent(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = write_clean_run(tmp_path)
    deliveries = [
        d._replace(digest=d.digest + 1)
        if (d.subscription, d.topic, d.offset) == ("sh", ORDERS, 6)
        else d
        for d in dataset.deliveries_of()
    ]
    _rewrite_logs(run, dataset.acks_of(), deliveries)
    _, rows = audit(spark, run)
    assert sorted((r["anomaly"], r["subscription"], r["consumer"], r["offset"]) for r in rows) == [
        ("inconsistent-offsets", "sh", "s0", 6),
        ("unseen", "sh", None, 6),
    ]


def test_the_command_exits_nonzero_on_forbidden_anomalies_and_says_why(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_clean_run(tmp_path)
    run.wal_file(EVENTS, 2 * SEGMENT).unlink()
    out = tmp_path / "out"
    status = main(["--wal", str(run.wal), "--objects", str(run.objects), "--logs",
                   str(run.logs), "--out", str(out), "--quiet"])  # fmt: skip
    assert status == 1
    report = capsys.readouterr().out
    assert "FORBIDDEN ANOMALIES" in report and "lost-write" in report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["forbidden"]["lost-write"] == 10
    assert (out / "report.txt").read_text() == report


def test_bad_input_is_refused_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out, empty = str(tmp_path / "out"), tmp_path / "empty"
    empty.mkdir()
    assert main(["--out", out]) == 2
    assert "nothing to audit" in capsys.readouterr().err
    assert main(["--wal", "/nonexistent/wal", "--out", out]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["--wal", str(empty), "--logs", str(empty), "--out", out]) == 2
    assert "no acks/ or deliveries/ Parquet files" in capsys.readouterr().err


def _rewrite_logs(run: Run, acks: list[Ack], deliveries: list[Any]) -> None:
    for part in run.logs.rglob("*.parquet"):
        part.unlink()
    write_logs(run.logs, acks, deliveries)
