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
    "nonmonotonic-poll": "an ordered consumer received, once only, an offset below one it "
    "had received",
    "poll-skip": "an ordered consumer jumped over stored offsets its subscription never got",
}
ALLOWED = {
    "duplicate": "one acknowledged message is stored at two offsets (a producer's retry)",
    "duplicate-delivery": "a subscription received one offset more than once (redelivery)",
    "torn-tail": "a topic's newest local segment ends in an unfinished write (a crash)",
    "superseded": "a broker's copy holds records past where a later writer epoch starts: "
    "appended by an owner that died before they were acknowledged (read as stored nowhere)",
    "dead-lettered": "a subscription's message was moved to its dead-letter topic (the copy "
    "stored there names it: x-original-topic, -subscription, -topic-offset)",
    "dropped-by-policy": "a subscription's message was passed by its Drop poison policy (a "
    "broker's policy_dropped event)",
}
ANOMALIES = {**FORBIDDEN, **ALLOWED}

VIOLATION_COLUMNS = (
    "anomaly", "topic", "subscription", "consumer", "offset", "producer", "digest", "detail",
)  # fmt: skip
ORDERED_TYPES = ("exclusive", "failover")
"""Subscription types whose consumers must see offsets in order (key_shared: per key)."""


def violations(
    anomaly: Column | str, frame: DataFrame, detail: Column, **columns: Column
) -> DataFrame:
    """`frame` shaped as violation rows of `anomaly`: each column is the one given, else the
    frame's column of that name, else null."""
    if isinstance(anomaly, str):
        if anomaly not in ANOMALIES:
            raise ValueError(f"unknown anomaly {anomaly!r}")
        anomaly = F.lit(anomaly)
    select = [anomaly.alias("anomaly")]
    for name in VIOLATION_COLUMNS[1:-1]:
        value = columns.get(name)
        if value is None and name in frame.columns:
            value = F.col(name)
        if value is None:
            value = F.lit(None).cast("long" if name in ("offset", "digest") else "string")
        select.append(value.alias(name))
    return frame.select(*select, detail.alias("detail"))


def storage_problems(stored: DataFrame) -> DataFrame:
    problems = stored.where(F.col("row_type") != "record")
    detail = F.format_string("%s: byte %d: %s", "source", "position", "detail")
    return violations(F.col("row_type"), problems, detail)


def distinct_records(stored: DataFrame) -> DataFrame:
    """Each (topic, offset, message) once: a record in a local segment and in its object is
    one record."""
    records = stored.where(F.col("row_type") == "record")
    return records.groupBy("topic", "offset", "producer", "digest").agg(
        F.min("source").alias("source")
    )


def inconsistent_offsets(records: DataFrame) -> DataFrame:
    clash = records.groupBy("topic", "offset").agg(
        F.count("*").alias("messages"), F.sort_array(F.collect_set("source")).alias("sources")
    )
    clash = clash.where(F.col("messages") > 1)
    detail = F.format_string(
        "%d different messages stored at this offset, in %s",
        "messages",
        F.concat_ws(", ", "sources"),
    )
    return violations("inconsistent-offsets", clash, detail)


def offset_gaps(records: DataFrame) -> DataFrame:
    offsets = records.select("topic", "offset").distinct()
    following = F.lead("offset").over(Window.partitionBy("topic").orderBy("offset"))
    gaps = offsets.withColumn("next", following).where(F.col("next") > F.col("offset") + 1)
    gaps = gaps.withColumn("offset", F.col("offset") + 1)
    detail = F.format_string("offsets %d–%d are in no stored segment", "offset", F.col("next") - 1)
    return violations("offset-gap", gaps, detail)


def messages(records: DataFrame) -> DataFrame:
    """Each stored message with every offset it is stored at, lowest first."""
    return records.groupBy("topic", "producer", "digest").agg(
        F.sort_array(F.collect_list("offset")).alias("offsets")
    )


def duplicates(stored_messages: DataFrame) -> DataFrame:
    twice = stored_messages.where(F.size("offsets") > 1)
    detail = F.format_string("stored at offsets %s", F.concat_ws(", ", "offsets"))
    return violations("duplicate", twice, detail, offset=F.element_at("offsets", 1))


def acked_at(acks: DataFrame, stored_messages: DataFrame) -> DataFrame:
    """Each acknowledged message with the offsets storage holds it at (null: lost)."""
    return acks.join(stored_messages, ["topic", "producer", "digest"], "left")


def lost_writes(acked: DataFrame) -> DataFrame:
    lost = acked.where(F.col("offsets").isNull())
    detail = F.format_string(
        "seq %d acknowledged at %d ms is in no stored segment", "seq", "ack_ms"
    )
    return violations("lost-write", lost, detail)


def acked_offsets_disagree(acked: DataFrame) -> DataFrame:
    """Acks that named an offset at which storage does not hold the message."""
    wrong = acked.where(
        F.col("offset").isNotNull()
        & F.col("offsets").isNotNull()
        & ~F.array_contains("offsets", F.col("offset"))
    )
    detail = F.format_string(
        "acknowledged at this offset, but stored at %s", F.concat_ws(", ", "offsets")
    )
    return violations("inconsistent-offsets", wrong, detail)


def delivered_against_storage(deliveries: DataFrame, records: DataFrame) -> DataFrame:
    """Reliable deliveries of an offset storage does not hold, or holds only other messages
    at (storage may hold two there, itself an inconsistency)."""
    held = records.groupBy("topic", "offset").agg(
        F.collect_set(F.struct("producer", "digest")).alias("held")
    )
    got = deliveries.where(F.col("reliable")).join(held, ["topic", "offset"], "left")
    wrong = got.where(
        F.col("held").isNull() | ~F.array_contains("held", F.struct("producer", "digest"))
    )
    phantom = F.col("held").isNull()
    anomaly = F.when(phantom, "phantom-delivery").otherwise("inconsistent-offsets")
    detail = F.when(phantom, "delivered, but no stored segment holds this offset").otherwise(
        "delivered at this offset, but storage holds another message there"
    )
    return violations(anomaly, wrong, detail)


def settled(stored: DataFrame, settlements: DataFrame) -> DataFrame:
    """(subscription, topic, offset, how, detail) of every message settled for a subscription
    without a consumer's acknowledgement: a dead letter stored anywhere (its origin columns,
    read from its `x-original-*` attributes) and each settlement a broker logged."""
    dead = stored.where((F.col("row_type") == "record") & F.col("origin_topic").isNotNull())
    dead = dead.groupBy("origin_subscription", "origin_topic", "origin_offset").agg(
        F.min(F.format_string("%s@%d", "topic", "offset")).alias("copy")
    )
    dead = dead.select(
        F.col("origin_subscription").alias("subscription"),
        F.col("origin_topic").alias("topic"),
        F.col("origin_offset").alias("offset"),
        F.lit("dead-lettered").alias("how"),
        F.format_string("its dead letter is stored at %s", "copy").alias("detail"),
    )
    dropped = settlements.where(F.col("action") == "dropped").select(
        "subscription",
        "topic",
        "offset",
        F.lit("dropped-by-policy").alias("how"),
        F.format_string("dropped after %d failed deliveries", "attempts").alias("detail"),
    )
    return dead.unionByName(dropped).dropDuplicates(["subscription", "topic", "offset", "how"])


def settlements_seen(settled_rows: DataFrame) -> DataFrame:
    """The settled messages as allowed rows, so the report counts them."""
    return violations(F.col("how"), settled_rows, F.col("detail"))


def unseen(acked: DataFrame, deliveries: DataFrame, settled_rows: DataFrame) -> DataFrame:
    """Acknowledged messages a reliable subscription never received, on each topic where it
    received an offset at or below one the message is stored at (where it started), unless
    the message was settled for it without a consumer (`settled`: dead-lettered, or dropped
    by its policy). A message neither delivered nor settled stays `unseen`, forbidden."""
    got = deliveries.where(F.col("reliable"))
    starts = got.groupBy("subscription", "topic").agg(F.min("offset").alias("start"))
    expected = acked.where(F.col("offsets").isNotNull()).join(starts, "topic")
    expected = expected.withColumn("offset", F.element_at("offsets", -1))
    expected = expected.where(F.col("offset") >= F.col("start"))
    received = got.select("subscription", "topic", "producer", "digest").distinct()
    missing = expected.join(received, ["subscription", "topic", "producer", "digest"], "left_anti")
    done = settled_rows.select(
        F.col("subscription").alias("s_subscription"),
        F.col("topic").alias("s_topic"),
        F.col("offset").alias("s_offset"),
    )
    missing = missing.join(
        done,
        (F.col("subscription") == F.col("s_subscription"))
        & (F.col("topic") == F.col("s_topic"))
        & F.array_contains("offsets", F.col("s_offset")),
        "left_anti",
    )
    detail = F.format_string(
        "seq %d acknowledged, never delivered (the subscription started at offset %d)",
        "seq",
        "start",
    )
    return violations("unseen", missing, detail)


def delivery_counts(deliveries: DataFrame) -> DataFrame:
    """How many times each subscription received each offset of each topic."""
    return deliveries.groupBy("subscription", "topic", "offset").agg(F.count("*").alias("times"))


def duplicate_deliveries(counts: DataFrame) -> DataFrame:
    repeated = counts.where(F.col("times") > 1)
    detail = F.format_string("delivered %d times", "times")
    return violations("duplicate-delivery", repeated, detail)


def first_deliveries(deliveries: DataFrame) -> DataFrame:
    """Each consumer's first receipt of each offset, in the order it received them, with the
    highest offset it had received before (`previous`), for the ordered subscription types,
    and for key_shared per routing key (the producer's name for a message without one, as
    Danube routes it)."""
    ordered = deliveries.where(F.col("sub_type").isin(*ORDERED_TYPES, "key_shared"))
    lane_key = F.coalesce("key", "producer")
    ordered = ordered.withColumn(
        "lane", F.when(F.col("sub_type") == "key_shared", lane_key).otherwise("")
    )
    repeat = Window.partitionBy("subscription", "consumer", "topic", "offset").orderBy("n")
    firsts = ordered.withColumn("time", F.row_number().over(repeat)).where(F.col("time") == 1)
    lane = Window.partitionBy("subscription", "consumer", "topic", "lane").orderBy("n")
    before = lane.rowsBetween(Window.unboundedPreceding, -1)
    return firsts.withColumn("previous", F.max("offset").over(before))


def nonmonotonic_polls(firsts: DataFrame, counts: DataFrame) -> DataFrame:
    """Offsets the subscription received only once that came below one the consumer had
    received before. A repeat is left out wherever it lands: after a restart, a reconnect or
    a failover the subscription starts again at its cursor, so its consumer may receive,
    for the first time, offsets another consumer (or an earlier stream) already had."""
    once = counts.where(F.col("times") == 1).select("subscription", "topic", "offset")
    back = firsts.where(F.col("offset") < F.col("previous"))
    back = back.join(once, ["subscription", "topic", "offset"])
    detail = F.format_string("received (delivery %d) after offset %d", "n", "previous")
    return violations("nonmonotonic-poll", back, detail)


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
        F.min("skipped").alias("offset"), F.count("*").alias("skipped")
    )
    detail = F.format_string(
        "%d stored offsets from this one skipped on the way to offset %d", "skipped", "landed"
    )
    return violations("poll-skip", per_jump, detail)


def all_violations(
    stored: DataFrame, acks: DataFrame, deliveries: DataFrame, settlements: DataFrame
) -> DataFrame:
    records = distinct_records(stored)
    settled_rows = settled(stored, settlements)
    stored_messages = messages(records)
    acked = acked_at(acks, stored_messages)
    firsts = first_deliveries(deliveries)
    counts = delivery_counts(deliveries)
    parts = [
        storage_problems(stored),
        inconsistent_offsets(records),
        offset_gaps(records),
        duplicates(stored_messages),
        lost_writes(acked),
        acked_offsets_disagree(acked),
        delivered_against_storage(deliveries, records),
        unseen(acked, deliveries, settled_rows),
        settlements_seen(settled_rows),
        duplicate_deliveries(counts),
        nonmonotonic_polls(firsts, counts),
        poll_skips(firsts, deliveries, records),
    ]
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result.withColumn("forbidden", F.col("anomaly").isin(*FORBIDDEN))
