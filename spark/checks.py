"""The audit's checks, as DataFrame transformations: each takes the decoded storage, the ack
log and the delivery log and returns violation rows (`VIOLATION_COLUMNS`). Anomaly names
follow Jepsen's Kafka checker where it has one (spec/audit.md lists them all)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

FORBIDDEN = {
    "corrupt-frame": "bytes inside a segment or an object are no valid frame (CRC32C fails)",
    "corrupt-record": "a valid frame holds a record that is no StreamMessage",
    "unreadable": "a stored file has no valid segment header",
    "inconsistent-offsets": "one offset holds two different messages (in storage, or as acked "
    "or delivered against storage)",
    "offset-gap": "offsets of a topic's storage are not dense",
    "lost-write": "an acknowledged message is not in storage",
    "unseen": "an acknowledged message never reached a reliable subscription",
    "phantom-delivery": "a reliable subscription received an offset storage does not hold",
    "nonmonotonic-poll": "an ordered consumer received an offset below one it had received",
    "poll-skip": "an ordered consumer jumped over stored offsets its subscription never got",
}
ALLOWED = {
    "duplicate": "one acknowledged message is stored at two offsets (a producer's retry)",
    "duplicate-delivery": "a subscription received one offset more than once (redelivery)",
    "torn-tail": "a local segment ends in an unfinished write (a crash)",
}
ANOMALIES = {**FORBIDDEN, **ALLOWED}

VIOLATION_COLUMNS = (
    "anomaly", "topic", "subscription", "consumer", "offset", "producer", "digest", "detail",
)  # fmt: skip
ORDERED_TYPES = ("exclusive", "failover")
"""Subscription types whose consumers must see offsets in order (key_shared: per key)."""


def violations(anomaly: str, frame: DataFrame, **columns: Column) -> DataFrame:
    """`frame` shaped as violation rows of `anomaly`; absent columns are null."""
    if anomaly not in ANOMALIES:
        raise ValueError(f"unknown anomaly {anomaly!r}")
    select = [F.lit(anomaly).alias("anomaly")]
    for name in VIOLATION_COLUMNS[1:]:
        value = columns.get(name)
        if value is None:
            kind = "long" if name in ("offset", "digest") else "string"
            value = F.lit(None).cast(kind)
        select.append(value.alias(name))
    return frame.select(*select)


def storage_problems(stored: DataFrame) -> DataFrame:
    problems = stored.where(F.col("row_type") != "record")
    return problems.select(
        F.col("row_type").alias("anomaly"),
        "topic",
        F.lit(None).cast("string").alias("subscription"),
        F.lit(None).cast("string").alias("consumer"),
        F.lit(None).cast("long").alias("offset"),
        F.lit(None).cast("string").alias("producer"),
        F.lit(None).cast("long").alias("digest"),
        F.concat_ws(": ", "source", F.concat(F.lit("byte "), F.col("position")), "detail").alias(
            "detail"
        ),
    )


def distinct_records(stored: DataFrame) -> DataFrame:
    """Each (topic, offset, message) once: a record in a local segment and in its object is
    one record."""
    records = stored.where(F.col("row_type") == "record")
    return records.groupBy("topic", "offset", "producer", "digest").agg(
        F.first("key").alias("key"), F.min("source").alias("source")
    )


def inconsistent_offsets(records: DataFrame) -> DataFrame:
    clash = records.groupBy("topic", "offset").agg(
        F.count("*").alias("messages"), F.sort_array(F.collect_set("source")).alias("sources")
    )
    clash = clash.where(F.col("messages") > 1)
    return violations(
        "inconsistent-offsets",
        clash,
        topic=F.col("topic"),
        offset=F.col("offset"),
        detail=F.concat(
            F.col("messages").cast("string"),
            F.lit(" different messages stored at this offset, in "),
            F.concat_ws(", ", "sources"),
        ),
    )


def offset_gaps(records: DataFrame) -> DataFrame:
    offsets = records.select("topic", "offset").distinct()
    following = F.lead("offset").over(Window.partitionBy("topic").orderBy("offset"))
    gaps = offsets.withColumn("next", following).where(F.col("next") > F.col("offset") + 1)
    return violations(
        "offset-gap",
        gaps,
        topic=F.col("topic"),
        offset=F.col("offset") + 1,
        detail=F.concat(
            F.lit("offsets "),
            (F.col("offset") + 1).cast("string"),
            F.lit("–"),
            (F.col("next") - 1).cast("string"),
            F.lit(" are in no stored segment"),
        ),
    )


def duplicates(records: DataFrame) -> DataFrame:
    twice = records.groupBy("topic", "producer", "digest").agg(
        F.sort_array(F.collect_list("offset")).alias("offsets")
    )
    twice = twice.where(F.size("offsets") > 1)
    return violations(
        "duplicate",
        twice,
        topic=F.col("topic"),
        offset=F.element_at("offsets", 1),
        producer=F.col("producer"),
        digest=F.col("digest"),
        detail=F.concat(F.lit("stored at offsets "), F.concat_ws(", ", "offsets")),
    )


def acked_at(acks: DataFrame, records: DataFrame) -> DataFrame:
    """Each acknowledged message with the first offset storage holds it at (null: lost)."""
    first = records.groupBy("topic", "producer", "digest").agg(F.min("offset").alias("stored"))
    return acks.join(first, ["topic", "producer", "digest"], "left")


def lost_writes(acked: DataFrame) -> DataFrame:
    lost = acked.where(F.col("stored").isNull())
    return violations(
        "lost-write",
        lost,
        topic=F.col("topic"),
        offset=F.col("offset"),
        producer=F.col("producer"),
        digest=F.col("digest"),
        detail=F.concat(
            F.lit("seq "),
            F.col("seq").cast("string"),
            F.lit(" acknowledged at "),
            F.col("ack_ms").cast("string"),
            F.lit(" ms is in no stored segment"),
        ),
    )


def acked_offsets_disagree(acks: DataFrame, records: DataFrame) -> DataFrame:
    """Acks that named an offset whose stored message is another one."""
    named = acks.where(F.col("offset").isNotNull()).alias("a")
    stored = records.alias("s")
    joined = named.join(
        stored, (F.col("a.topic") == F.col("s.topic")) & (F.col("a.offset") == F.col("s.offset"))
    )
    wrong = joined.where(
        (F.col("a.producer") != F.col("s.producer")) | (F.col("a.digest") != F.col("s.digest"))
    )
    return violations(
        "inconsistent-offsets",
        wrong,
        topic=F.col("a.topic"),
        offset=F.col("a.offset"),
        producer=F.col("a.producer"),
        digest=F.col("a.digest"),
        detail=F.concat(
            F.lit("acknowledged at this offset, but storage holds a message of "),
            F.col("s.producer"),
            F.lit(" there"),
        ),
    )


def reliable_deliveries(deliveries: DataFrame) -> DataFrame:
    return deliveries.where(F.col("reliable"))


def delivered_against_storage(deliveries: DataFrame, records: DataFrame) -> DataFrame:
    """Reliable deliveries of an offset storage does not hold, or holds another message at."""
    got = reliable_deliveries(deliveries).alias("d")
    stored = records.select("topic", "offset", "producer", "digest").alias("s")
    joined = got.join(
        stored,
        (F.col("d.topic") == F.col("s.topic")) & (F.col("d.offset") == F.col("s.offset")),
        "left",
    )
    phantom = joined.where(F.col("s.offset").isNull())
    phantom_rows = violations(
        "phantom-delivery",
        phantom,
        topic=F.col("d.topic"),
        subscription=F.col("d.subscription"),
        consumer=F.col("d.consumer"),
        offset=F.col("d.offset"),
        producer=F.col("d.producer"),
        digest=F.col("d.digest"),
        detail=F.lit("delivered, but no stored segment holds this offset"),
    )
    other = joined.where(
        F.col("s.offset").isNotNull()
        & ((F.col("d.producer") != F.col("s.producer")) | (F.col("d.digest") != F.col("s.digest")))
    )
    # Storage may hold two messages at one offset (itself an inconsistency): a delivery is
    # wrong only if it matches none of them.
    matched = joined.where(
        (F.col("d.producer") == F.col("s.producer")) & (F.col("d.digest") == F.col("s.digest"))
    ).select("d.subscription", "d.consumer", "d.n", "d.topic")
    other = other.join(
        matched.alias("m"),
        [
            F.col("d.subscription") == F.col("m.subscription"),
            F.col("d.consumer") == F.col("m.consumer"),
            F.col("d.n") == F.col("m.n"),
            F.col("d.topic") == F.col("m.topic"),
        ],
        "left_anti",
    ).dropDuplicates(["subscription", "consumer", "n", "topic"])
    other_rows = violations(
        "inconsistent-offsets",
        other,
        topic=F.col("d.topic"),
        subscription=F.col("d.subscription"),
        consumer=F.col("d.consumer"),
        offset=F.col("d.offset"),
        producer=F.col("d.producer"),
        digest=F.col("d.digest"),
        detail=F.concat(
            F.lit("delivered at this offset, but storage holds a message of "),
            F.col("s.producer"),
            F.lit(" there"),
        ),
    )
    return phantom_rows.unionByName(other_rows)


def unseen(acked: DataFrame, deliveries: DataFrame) -> DataFrame:
    """Acknowledged messages a reliable subscription never received, on each topic from the
    first offset it received there (where it started)."""
    got = reliable_deliveries(deliveries)
    starts = got.groupBy("subscription", "topic").agg(F.min("offset").alias("start"))
    expected = acked.where(F.col("stored").isNotNull()).join(starts, "topic")
    expected = expected.where(F.col("stored") >= F.col("start"))
    received = got.select("subscription", "topic", "producer", "digest").distinct()
    missing = expected.join(received, ["subscription", "topic", "producer", "digest"], "left_anti")
    return violations(
        "unseen",
        missing,
        topic=F.col("topic"),
        subscription=F.col("subscription"),
        offset=F.col("stored"),
        producer=F.col("producer"),
        digest=F.col("digest"),
        detail=F.concat(
            F.lit("seq "),
            F.col("seq").cast("string"),
            F.lit(" acknowledged, never delivered (the subscription started at offset "),
            F.col("start").cast("string"),
            F.lit(")"),
        ),
    )


def duplicate_deliveries(deliveries: DataFrame) -> DataFrame:
    repeated = deliveries.groupBy("subscription", "topic", "offset").agg(
        F.count("*").alias("times")
    )
    repeated = repeated.where(F.col("times") > 1)
    return violations(
        "duplicate-delivery",
        repeated,
        topic=F.col("topic"),
        subscription=F.col("subscription"),
        offset=F.col("offset"),
        detail=F.concat(F.lit("delivered "), F.col("times").cast("string"), F.lit(" times")),
    )


def first_deliveries(deliveries: DataFrame) -> DataFrame:
    """Each consumer's first receipt of each offset, in the order it received them, with the
    offset it had received just before (`previous`), for the ordered subscription types (and
    key_shared per key)."""
    ordered = deliveries.where(
        F.col("sub_type").isin(*ORDERED_TYPES) | (F.col("sub_type") == "key_shared")
    )
    ordered = ordered.withColumn(
        "lane",
        F.when(F.col("sub_type") == "key_shared", F.coalesce("key", F.lit(""))).otherwise(""),
    )
    repeat = Window.partitionBy("subscription", "consumer", "topic", "offset").orderBy("n")
    firsts = ordered.withColumn("time", F.row_number().over(repeat)).where(F.col("time") == 1)
    lane = Window.partitionBy("subscription", "consumer", "topic", "lane").orderBy("n")
    return firsts.withColumn("previous", F.lag("offset").over(lane))


def nonmonotonic_polls(firsts: DataFrame) -> DataFrame:
    back = firsts.where(F.col("offset") < F.col("previous"))
    return violations(
        "nonmonotonic-poll",
        back,
        topic=F.col("topic"),
        subscription=F.col("subscription"),
        consumer=F.col("consumer"),
        offset=F.col("offset"),
        producer=F.col("producer"),
        digest=F.col("digest"),
        detail=F.concat(
            F.lit("received (delivery "),
            F.col("n").cast("string"),
            F.lit(") after offset "),
            F.col("previous").cast("string"),
        ),
    )


def poll_skips(firsts: DataFrame, deliveries: DataFrame, records: DataFrame) -> DataFrame:
    """Stored offsets an ordered consumer jumped over that no consumer of its subscription
    ever received (another consumer's share, after a failover, is no skip)."""
    jumps = firsts.where(
        F.col("sub_type").isin(*ORDERED_TYPES) & (F.col("offset") > F.col("previous") + 1)
    )
    between = jumps.select(
        "subscription",
        "consumer",
        "topic",
        F.col("offset").alias("landed"),
        F.explode(F.sequence(F.col("previous") + 1, F.col("offset") - 1)).alias("skipped"),
    )
    stored = records.select("topic", F.col("offset").alias("skipped")).distinct()
    between = between.join(stored, ["topic", "skipped"])
    received = deliveries.select("subscription", "topic", F.col("offset").alias("skipped"))
    missed = between.join(received.distinct(), ["subscription", "topic", "skipped"], "left_anti")
    per_jump = missed.groupBy("subscription", "consumer", "topic", "landed").agg(
        F.min("skipped").alias("first"), F.count("*").alias("skipped")
    )
    return violations(
        "poll-skip",
        per_jump,
        topic=F.col("topic"),
        subscription=F.col("subscription"),
        consumer=F.col("consumer"),
        offset=F.col("first"),
        detail=F.concat(
            F.col("skipped").cast("string"),
            F.lit(" stored offsets from this one skipped on the way to offset "),
            F.col("landed").cast("string"),
        ),
    )


def all_violations(stored: DataFrame, acks: DataFrame, deliveries: DataFrame) -> DataFrame:
    records = distinct_records(stored)
    acked = acked_at(acks, records)
    firsts = first_deliveries(deliveries)
    parts = [
        storage_problems(stored),
        inconsistent_offsets(records),
        offset_gaps(records),
        duplicates(records),
        lost_writes(acked),
        acked_offsets_disagree(acks, records),
        delivered_against_storage(deliveries, records),
        unseen(acked, deliveries),
        duplicate_deliveries(deliveries),
        nonmonotonic_polls(firsts),
        poll_skips(firsts, deliveries, records),
    ]
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result.withColumn("forbidden", F.col("anomaly").isin(*FORBIDDEN))
