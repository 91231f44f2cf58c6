"""Metadata key layout of namespaces and topics: kept importable for callers written before
`danube.keys` held every key (issue 21). New code imports `danube.keys`."""

from __future__ import annotations

from danube.keys import (
    consumer,
    cursor,
    dispatch_config,
    failure_policy,
    namespace_policy,
    namespace_prefix,
    namespace_topic,
    namespace_topics_prefix,
    producer,
    subscription,
    topic_delivery,
    topic_policy,
    topic_prefix,
    topic_schema_config,
)

__all__ = [
    "consumer",
    "cursor",
    "dispatch_config",
    "failure_policy",
    "namespace_policy",
    "namespace_prefix",
    "namespace_topic",
    "namespace_topics_prefix",
    "producer",
    "subscription",
    "topic_delivery",
    "topic_policy",
    "topic_prefix",
    "topic_schema_config",
]
