"""Metadata key layout, after Danube's (reference section 6.2). Topic paths drop the leading
slash (`/topics/<ns>/<topic>/...`)."""

from __future__ import annotations

from danube.core.names import TopicName


def namespace_policy(namespace: str) -> str:
    return f"/namespaces/{namespace}/policy"


def namespace_prefix(namespace: str) -> str:
    return f"/namespaces/{namespace}/"


def namespace_topic(topic: TopicName) -> str:
    return f"/namespaces/{topic.namespace}/topics/{topic.path}"


def topic_prefix(topic: TopicName) -> str:
    return f"/topics/{topic.path}/"


def topic_delivery(topic: TopicName) -> str:
    return f"/topics/{topic.path}/delivery"


def topic_schema_config(topic: TopicName) -> str:
    """The topic's schema binding (Danube's key); deleting the topic's keys deletes it."""
    return f"/topics/{topic.path}/schema_config"


def producer(topic: TopicName, producer_id: int) -> str:
    return f"/topics/{topic.path}/producers/{producer_id}"


def subscription(topic: TopicName, name: str) -> str:
    return f"/topics/{topic.path}/subscriptions/{name}"


def consumer(topic: TopicName, sub: str, consumer_id: int) -> str:
    return f"/topics/{topic.path}/subscriptions/{sub}/consumers/{consumer_id}"


def cursor(topic: TopicName, sub: str) -> str:
    """The subscription's cursor: every offset up to it is acknowledged (-1: none yet)."""
    return f"/topics/{topic.path}/subscriptions/{sub}/cursor"


def topic_policy(topic: TopicName) -> str:
    """The topic's own policies (Danube reads this key but never writes it)."""
    return f"/topics/{topic.path}/policy"


def failure_policy(topic: TopicName, sub: str) -> str:
    return f"/topics/{topic.path}/subscriptions/{sub}/failure_policy"


def dispatch_config(topic: TopicName, sub: str) -> str:
    return f"/topics/{topic.path}/subscriptions/{sub}/dispatch_config"
