"""`danube.keys` builds and parses every key: each kind reads back what it builds, and a
parser given another kind's key (or something foreign) answers None, never raises, so a scan
or a watch can route any key it meets through the parsers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from danube import keys
from danube.values.names import TopicName

PART = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-é"), min_size=1, max_size=12
)
TOPICS = st.builds(TopicName, PART, PART)
SUB = st.text(st.sampled_from("abcxyz0189_-."), min_size=1, max_size=12)
IDS = st.integers(min_value=0, max_value=2**64 - 1)
OFFSETS = st.integers(min_value=0, max_value=10**19)
BROKERS = st.text(st.characters(exclude_characters="/", exclude_categories=("Cs",)), min_size=1)

PARSERS: list[Callable[[str], Any]] = [
    keys.parse_namespace_policy,
    keys.parse_namespace_topic,
    keys.parse_topic_key,
    keys.parse_any_object_key,
    keys.parse_index_key,
    keys.parse_register_key,
    keys.parse_load_key,
    keys.parse_state_key,
    keys.parse_assignment_key,
    keys.parse_unassigned_key,
    keys.parse_history_key,
    keys.parse_subject_key,
    keys.parse_id_key,
]


def only(key: str, parser: Callable[[str], Any]) -> Any:
    """What `parser` reads from `key`, after checking every other parser refuses it."""
    others = [p.__name__ for p in PARSERS if p is not parser and p(key) is not None]
    assert others == [], f"{key!r} is also read by {others}"
    return parser(key)


@given(PART)
def test_namespace_policy(namespace: str) -> None:
    assert only(keys.namespace_policy(namespace), keys.parse_namespace_policy) == namespace


@given(TOPICS)
def test_namespace_topic(topic: TopicName) -> None:
    key = keys.namespace_topic(topic)
    assert key.startswith(keys.namespace_topics_prefix(topic.namespace))
    assert only(key, keys.parse_namespace_topic) == topic


@given(TOPICS, st.sampled_from(keys.TOPIC_KINDS))
def test_topic_records(topic: TopicName, kind: keys.TopicKind) -> None:
    key = keys.topic_key(topic, kind)
    assert key.startswith(keys.topic_prefix(topic))
    assert only(key, keys.parse_topic_key) == keys.TopicKey(topic, kind)
    assert keys.topic_of_key(key) == topic.full


def test_the_named_topic_builders_are_topic_keys() -> None:
    topic = TopicName("ns", "t")
    assert keys.topic_delivery(topic) == "/topics/ns/t/delivery"
    assert keys.topic_policy(topic) == "/topics/ns/t/policy"
    assert keys.topic_schema_config(topic) == "/topics/ns/t/schema_config"
    assert keys.owner_key("/ns/t") == "/topics/ns/t/owner"
    assert keys.writer_key("/ns/t") == "/topics/ns/t/writer"


@given(TOPICS, IDS)
def test_producer(topic: TopicName, producer_id: int) -> None:
    key = keys.producer(topic, producer_id)
    assert only(key, keys.parse_topic_key) == keys.ProducerKey(topic, producer_id)


@given(TOPICS, SUB)
def test_subscription(topic: TopicName, sub: str) -> None:
    key = keys.subscription(topic, sub)
    assert only(key, keys.parse_topic_key) == keys.SubscriptionKey(topic, sub)


@given(TOPICS, SUB, st.sampled_from(keys.SUBSCRIPTION_KINDS))
def test_subscription_settings(topic: TopicName, sub: str, kind: keys.SubscriptionKind) -> None:
    key = keys.subscription_setting(topic, sub, kind)
    assert key.startswith(keys.subscription(topic, sub) + "/")
    assert only(key, keys.parse_topic_key) == keys.SubscriptionSettingKey(topic, sub, kind)
    named = {"cursor": keys.cursor, "failure_policy": keys.failure_policy}
    named["dispatch_config"] = keys.dispatch_config
    named["attempts"] = keys.attempts
    assert named[kind](topic, sub) == key


@given(TOPICS, SUB, IDS)
def test_consumer(topic: TopicName, sub: str, consumer_id: int) -> None:
    key = keys.consumer(topic, sub, consumer_id)
    assert only(key, keys.parse_topic_key) == keys.ConsumerKey(topic, sub, consumer_id)


@given(TOPICS, OFFSETS, OFFSETS, st.integers(min_value=0, max_value=10**19))
def test_object_keys(topic: TopicName, start: int, end: int, epoch: int) -> None:
    key = keys.object_key(topic, start, end, epoch)
    assert key.startswith(keys.object_prefix(topic))
    assert only(key, keys.parse_any_object_key) == keys.ObjectKey(topic, start, end, epoch)
    assert keys.parse_object_key(topic, key) == (start, end)
    assert keys.parse_object_key(TopicName(topic.namespace + "x", topic.local), key) is None


@given(TOPICS, OFFSETS)
def test_index_keys(topic: TopicName, start: int) -> None:
    entry, current = keys.index_path(topic, start), keys.current_path(topic)
    assert only(entry, keys.parse_index_key) == keys.IndexKey(topic, start)
    assert keys.index_start(entry) == start and keys.is_index_entry(entry)
    assert only(current, keys.parse_index_key) == keys.CurrentKey(topic)
    assert keys.index_start(current) is None and not keys.is_index_entry(current)
    assert keys.topic_of_key(entry) == topic.full


@given(BROKERS)
def test_broker_keys(broker: str) -> None:
    assert only(keys.register_key(broker), keys.parse_register_key) == broker
    assert only(keys.load_key(broker), keys.parse_load_key) == broker
    assert only(keys.state_key(broker), keys.parse_state_key) == broker


@given(BROKERS, TOPICS)
def test_assignment_and_marker_keys(broker: str, topic: TopicName) -> None:
    assigned = only(keys.assignment_key(broker, topic.full), keys.parse_assignment_key)
    assert assigned == keys.AssignmentKey(broker, topic.full) == (broker, topic.full)
    assert only(keys.unassigned_key(topic.full), keys.parse_unassigned_key) == topic.full


@given(st.integers(min_value=0, max_value=2**63))
def test_history_key(unix_s: int) -> None:
    assert only(keys.history_key(unix_s), keys.parse_history_key) == unix_s


@given(st.text(st.characters(exclude_characters="/", exclude_categories=("Cs",)), min_size=1))
def test_schema_subject_key(name: str) -> None:
    assert only(keys.subject_key(name), keys.parse_subject_key) == name


@given(st.integers(min_value=0, max_value=10**19))
def test_schema_id_key(schema_id: int) -> None:
    assert only(keys.id_key(schema_id), keys.parse_id_key) == schema_id


@given(st.text())
def test_no_parser_raises_on_any_text(text: str) -> None:
    for parser in PARSERS:
        parser(text)
    keys.topic_of_key(text)
    keys.index_start(text)


FOREIGN = [
    "",
    "/",
    "/topics/ns/t",
    "/topics/ns/t/",
    "/topics/ns/t/unknown",
    "/topics/ns/t/producers/x",
    "/topics/ns/t/producers/-1",
    "/topics/ns/t/subscriptions/s/consumers/1/more",
    "/topics/ns/t/subscriptions/s/unknown",
    "/topics/n s/t/delivery",
    "/topics//t/delivery",
    "topics/ns/t/delivery",
    "/namespaces/ns/policy/",
    "/namespaces/ns/topics/other/t",
    "/storage/topics/ns/t/segments/12",
    "/storage/topics/ns/t/segments/cur/x",
    "storage/topics/ns/t/segments/00000000000000000000-00000000000000000001-"
    "00000000000000000000.wal",
    "/cluster/brokers/b",
    "/cluster/brokers/b/ns",
    "/cluster/register/",
    "/cluster/rebalancing_history/+1",
    "/cluster/leader",
    "/schemas/next_id",
    "/schemas/ids/12",
]


def test_foreign_keys_parse_as_nothing() -> None:
    for key in FOREIGN:
        assert [p.__name__ for p in PARSERS if p(key) is not None] == [], key


def test_old_import_paths_name_the_same_functions() -> None:
    from danube.machines.cluster import keys as cluster_keys
    from danube.machines.cluster import ownership
    from danube.machines.node import paths
    from danube.machines.schema import records
    from danube.machines.tiering import layout

    assert paths.cursor is keys.cursor and paths.namespace_topic is keys.namespace_topic
    assert cluster_keys.parse_assignment_key is keys.parse_assignment_key
    assert ownership.owner_key is keys.owner_key and ownership.topic_of_key is keys.topic_of_key
    assert records.subject_key is keys.subject_key and records.NEXT_ID == keys.NEXT_ID
    assert layout.object_key is keys.object_key and layout.index_start is keys.index_start
