"""Every key the broker writes, built and parsed in one place: the metadata store's keys
(Danube's layout, danube-reference.md §6.2; spec/cluster.md; spec/schema-registry.md) and the
object store's keys (spec/object-layout.md).

Why one module: a key is built by one machine and read back by another (restore, a watch
routed by its key, the orphan collection, the sim's checkers). When the builder and the parser
live apart they drift, and a key one side writes is silently skipped by the other. Here each
kind of key has its builder next to its parser, and a parser returns a small typed value
(a `NamedTuple` per kind, or a plain id) or None for a key that is not of that kind, never
raises: a foreign key in a scan is skipped, not a crash.

Why `danube.keys` and not `danube.metadata.keys`: object-store keys are not metadata, and
`danube.metadata` is the store adapters' package; keys are values (pure string functions,
importing only `danube.values.names`) that every layer above the values may use, machines and
runtime alike, so they sit at the top of the package beside `danube.values`.

Layout, in short (`<ns>/<t>` is a topic's `TopicName.path`):

    /namespaces/<ns>/policy                           namespace_policy
    /namespaces/<ns>/topics/<ns>/<t>                  namespace_topic
    /topics/<ns>/<t>/{delivery,policy,schema_config,owner,writer}      TopicKey
    /topics/<ns>/<t>/producers/<id>                   ProducerKey
    /topics/<ns>/<t>/subscriptions/<sub>              SubscriptionKey
    /topics/<ns>/<t>/subscriptions/<sub>/{cursor,attempts,failure_policy,dispatch_config}
    /topics/<ns>/<t>/subscriptions/<sub>/consumers/<id>                ConsumerKey
    /storage/topics/<ns>/<t>/segments/<start:020d>    IndexKey (and `cur`: CurrentKey)
    /cluster/{register,load}/<broker>, /cluster/brokers/<broker>/state,
    /cluster/brokers/<broker>/<ns>/<t>, /cluster/unassigned/<ns>/<t>, /cluster/leader,
    /cluster/rebalancing_history/<unix s>, /cluster/replicas/<ns>/<t>
    /schemas/subjects/<name>, /schemas/ids/<id:020d>, /schemas/next_id
    storage/topics/<ns>/<t>/segments/<start>-<next>[-<epoch>].wal   (object store) ObjectKey
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal, NamedTuple

from danube.values.errors import DanubeError
from danube.values.names import TopicName, parse_topic, validate_namespace

_PARSED = 2048
"""Entries of each parser's cache (`lru_cache`): the parsers below are pure functions of a
string whose answers are immutable (str, tuples, frozen `TopicName`), and the simulator and
the brokers parse the same keys again and again (every orphan scan, every commit's events).
Kept small because the caches are memory outside the broker's budget (a full cache of 8,192
assignment keys measured 5.75 MiB): 2,048 entries cover every key of a simulated cluster, and
in a broker with more keys than that a cache churns and saves nothing anyway."""

# -- shared pieces ------------------------------------------------------------------------------


def _segments(key: str, prefix: str) -> list[str] | None:
    """The `/`-separated parts of `key` after `prefix`, None if it does not start with it or
    any part is empty (no key here has an empty part)."""
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix) :].split("/")
    return parts if all(parts) else None


@lru_cache(maxsize=_PARSED)
def _topic_name(namespace: str, local: str) -> TopicName | None:
    """The topic `/<namespace>/<local>` if that is a valid topic name, else None."""
    try:
        return parse_topic(f"/{namespace}/{local}")
    except DanubeError:
        return None


def _number(text: str) -> int | None:
    """A non-negative decimal id (ascii digits only: `int()` would take `+1`, ` 1`, `١`)."""
    return int(text) if text.isascii() and text.isdigit() else None


def _padded(text: str) -> bool:
    return len(text) == 20 and text.isascii() and text.isdigit()


# -- namespaces ---------------------------------------------------------------------------------

NAMESPACES_PREFIX = "/namespaces/"


def namespace_policy(namespace: str) -> str:
    return f"/namespaces/{namespace}/policy"


def namespace_prefix(namespace: str) -> str:
    return f"/namespaces/{namespace}/"


def namespace_topics_prefix(namespace: str) -> str:
    """The namespace's topic list (`namespace_topic` keys), for a scan."""
    return f"/namespaces/{namespace}/topics/"


def namespace_topic(topic: TopicName) -> str:
    return f"/namespaces/{topic.namespace}/topics/{topic.path}"


def parse_namespace_policy(key: str) -> str | None:
    """The namespace a `namespace_policy` key names, else None."""
    parts = _segments(key, NAMESPACES_PREFIX)
    return parts[0] if parts is not None and len(parts) == 2 and parts[1] == "policy" else None


def parse_namespace_topic(key: str) -> TopicName | None:
    """The topic a `namespace_topic` key lists, else None."""
    parts = _segments(key, NAMESPACES_PREFIX)
    if parts is None or len(parts) != 4 or parts[1] != "topics" or parts[2] != parts[0]:
        return None
    return _topic_name(parts[2], parts[3])


# -- topics -------------------------------------------------------------------------------------

TOPICS_PREFIX = "/topics/"

TopicKind = Literal["delivery", "policy", "schema_config", "owner", "writer"]
TOPIC_KINDS: tuple[TopicKind, ...] = ("delivery", "policy", "schema_config", "owner", "writer")
SubscriptionKind = Literal["cursor", "attempts", "failure_policy", "dispatch_config"]
SUBSCRIPTION_KINDS: tuple[SubscriptionKind, ...] = (
    "cursor",
    "attempts",
    "failure_policy",
    "dispatch_config",
)


class TopicKey(NamedTuple):
    """`/topics/<ns>/<t>/<kind>`: one of the topic's own records."""

    topic: TopicName
    kind: TopicKind


class ProducerKey(NamedTuple):
    topic: TopicName
    producer_id: int


class SubscriptionKey(NamedTuple):
    topic: TopicName
    subscription: str


class SubscriptionSettingKey(NamedTuple):
    """`/topics/<ns>/<t>/subscriptions/<sub>/<kind>`: the cursor or a stored setting."""

    topic: TopicName
    subscription: str
    kind: SubscriptionKind


class ConsumerKey(NamedTuple):
    topic: TopicName
    subscription: str
    consumer_id: int


def topic_prefix(topic: TopicName) -> str:
    return f"/topics/{topic.path}/"


def topic_key(topic: TopicName, kind: TopicKind) -> str:
    return f"/topics/{topic.path}/{kind}"


def topic_delivery(topic: TopicName) -> str:
    return topic_key(topic, "delivery")


def topic_schema_config(topic: TopicName) -> str:
    """The topic's schema binding (Danube's key); deleting the topic's keys deletes it."""
    return topic_key(topic, "schema_config")


def topic_policy(topic: TopicName) -> str:
    """The topic's own policies (Danube reads this key but never writes it)."""
    return topic_key(topic, "policy")


@lru_cache(maxsize=_PARSED)
def owner_key(topic: str) -> str:
    """`/topics/<ns>/<topic>/owner`: which broker holds the topic now, under its lease.
    `topic` is a full name (`/ns/t`), checked."""
    return topic_key(parse_topic(topic), "owner")


@lru_cache(maxsize=_PARSED)
def writer_key(topic: str) -> str:
    """`/topics/<ns>/<topic>/writer`: the broker that last loaded the topic for writing."""
    return topic_key(parse_topic(topic), "writer")


def producer(topic: TopicName, producer_id: int) -> str:
    return f"/topics/{topic.path}/producers/{producer_id}"


def subscription(topic: TopicName, name: str) -> str:
    return f"/topics/{topic.path}/subscriptions/{name}"


def subscription_setting(topic: TopicName, sub: str, kind: SubscriptionKind) -> str:
    return f"/topics/{topic.path}/subscriptions/{sub}/{kind}"


def cursor(topic: TopicName, sub: str) -> str:
    """The subscription's cursor: every offset up to it is acknowledged (-1: none yet)."""
    return subscription_setting(topic, sub, "cursor")


def attempts(topic: TopicName, sub: str) -> str:
    """Failures of the messages past the cursor that failed at least once, as
    `[[offset, failures], ...]`, written with the cursor (absent: none)."""
    return subscription_setting(topic, sub, "attempts")


def failure_policy(topic: TopicName, sub: str) -> str:
    return subscription_setting(topic, sub, "failure_policy")


def dispatch_config(topic: TopicName, sub: str) -> str:
    return subscription_setting(topic, sub, "dispatch_config")


def consumer(topic: TopicName, sub: str, consumer_id: int) -> str:
    return f"/topics/{topic.path}/subscriptions/{sub}/consumers/{consumer_id}"


TopicRecordKey = TopicKey | ProducerKey | SubscriptionKey | SubscriptionSettingKey | ConsumerKey


def parse_topic_key(key: str) -> TopicRecordKey | None:
    """Any key under `/topics/<ns>/<t>/`, typed by its kind; None for anything else (an
    unknown record of a known topic included: a later version's key is skipped, not misread).
    """
    parts = _segments(key, TOPICS_PREFIX)
    if parts is None or len(parts) < 3:
        return None
    topic = _topic_name(parts[0], parts[1])
    if topic is None:
        return None
    rest = parts[2:]
    if len(rest) == 1:
        kind = rest[0]
        for known in TOPIC_KINDS:
            if kind == known:
                return TopicKey(topic, known)
        return None
    if rest[0] == "producers" and len(rest) == 2:
        producer_id = _number(rest[1])
        return None if producer_id is None else ProducerKey(topic, producer_id)
    if rest[0] != "subscriptions":
        return None
    if len(rest) == 2:
        return SubscriptionKey(topic, rest[1])
    if len(rest) == 3:
        for setting in SUBSCRIPTION_KINDS:
            if rest[2] == setting:
                return SubscriptionSettingKey(topic, rest[1], setting)
        return None
    if len(rest) == 4 and rest[2] == "consumers":
        consumer_id = _number(rest[3])
        return None if consumer_id is None else ConsumerKey(topic, rest[1], consumer_id)
    return None


@lru_cache(maxsize=_PARSED)
def topic_of_key(key: str) -> str | None:
    """The topic (full name) a metadata key or prefix belongs to: one under
    `/topics/<ns>/<t>/<record>` or the object index `/storage/topics/<ns>/<t>/<...>`; else
    None. Fencing routes a transaction's keys through this, so it is deliberately the loose
    reading it has always been (no name check; a bare `/topics/<ns>/<t>/` prefix is no
    topic's record): changing it changes which writes are fenced."""
    parts = key.strip("/").split("/")
    if parts[0] == "topics" and len(parts) >= 4:
        return f"/{parts[1]}/{parts[2]}"
    if parts[:2] == ["storage", "topics"] and len(parts) >= 5:
        return f"/{parts[2]}/{parts[3]}"
    return None


# -- the object tier: objects and their index -----------------------------------------------------

OBJECT_SUFFIX = ".wal"
CURRENT = "cur"
"""The last component of Danube's pointer to the newest index entry (`segments/cur`)."""
OBJECTS_ROOT = "storage/topics/"
"""Object keys are relative to `durable.root`, so they have no leading slash."""
INDEX_ROOT = "/storage/topics/"


class ObjectKey(NamedTuple):
    """One sealed segment's object: offsets `start_offset` … `next_offset - 1` as written by
    the writer of `epoch` (0: standalone, left out of the name)."""

    topic: TopicName
    start_offset: int
    next_offset: int
    epoch: int


class IndexKey(NamedTuple):
    """`/storage/topics/<ns>/<t>/segments/<start>`: one entry of the object index."""

    topic: TopicName
    start_offset: int


class CurrentKey(NamedTuple):
    """`/storage/topics/<ns>/<t>/segments/cur`: Danube's pointer to the newest entry."""

    topic: TopicName


def object_prefix(topic: TopicName) -> str:
    """The topic's objects, relative to `durable.root` (a listing of this prefix sees no
    other topic: it ends with a slash)."""
    return f"{OBJECTS_ROOT}{topic.path}/segments/"


def object_name(start_offset: int, next_offset: int, epoch: int = 0) -> str:
    """Epoch 0 leaves the epoch out, so standalone names stay those of earlier releases."""
    writer = f"-{epoch:020d}" if epoch else ""
    return f"{start_offset:020d}-{next_offset:020d}{writer}{OBJECT_SUFFIX}"


def object_key(topic: TopicName, start_offset: int, next_offset: int, epoch: int = 0) -> str:
    """The object holding offsets `start_offset` … `next_offset - 1` as written by the
    writer of `epoch`: the sealed segment file of that range, byte for byte."""
    return object_prefix(topic) + object_name(start_offset, next_offset, epoch)


@lru_cache(maxsize=_PARSED)
def parse_object_name_full(name: str) -> tuple[int, int, int] | None:
    """(start, next, epoch) of a name `object_name` makes; None for anything else."""
    if not name.endswith(OBJECT_SUFFIX):
        return None
    parts = name[: -len(OBJECT_SUFFIX)].split("-")
    if len(parts) not in (2, 3) or not all(_padded(part) for part in parts):
        return None
    epoch = int(parts[2]) if len(parts) == 3 else 0
    if len(parts) == 3 and epoch == 0:
        return None
    return int(parts[0]), int(parts[1]), epoch


def parse_object_name(name: str) -> tuple[int, int] | None:
    """(start offset, next offset) of a name `object_name` makes, whatever its epoch."""
    found = parse_object_name_full(name)
    return None if found is None else (found[0], found[1])


def parse_object_key(topic: TopicName, key: str) -> tuple[int, int] | None:
    """(start offset, next offset) of one of the topic's object keys, whatever its epoch;
    None for anything else, which the orphan collection must then leave alone."""
    prefix = object_prefix(topic)
    return parse_object_name(key[len(prefix) :]) if key.startswith(prefix) else None


def parse_any_object_key(key: str) -> ObjectKey | None:
    """Any topic's object key, typed; None for anything else."""
    parts = _segments(key, OBJECTS_ROOT)
    if parts is None or len(parts) != 4 or parts[2] != "segments":
        return None
    topic = _topic_name(parts[0], parts[1])
    found = parse_object_name_full(parts[3])
    return None if topic is None or found is None else ObjectKey(topic, *found)


def index_prefix(topic: TopicName) -> str:
    """Danube's catalog of the topic's segments in the metadata store. A scan of it also
    returns the `cur` pointer; `index_start` tells entries from it."""
    return f"{INDEX_ROOT}{topic.path}/segments/"


def index_path(topic: TopicName, start_offset: int) -> str:
    return f"{index_prefix(topic)}{start_offset:020d}"


def current_path(topic: TopicName) -> str:
    return index_prefix(topic) + CURRENT


def index_start(path: str) -> int | None:
    """The start offset an index path (or its last component) names; None for `cur` and
    anything else."""
    last = path.rpartition("/")[2]
    return int(last) if _padded(last) else None


@lru_cache(maxsize=_PARSED)
def parse_index_key(key: str) -> IndexKey | CurrentKey | None:
    """An object index entry or the `cur` pointer, typed; None for anything else."""
    parts = _segments(key, INDEX_ROOT)
    if parts is None or len(parts) != 4 or parts[2] != "segments":
        return None
    topic = _topic_name(parts[0], parts[1])
    if topic is None:
        return None
    if parts[3] == CURRENT:
        return CurrentKey(topic)
    return IndexKey(topic, int(parts[3])) if _padded(parts[3]) else None


def is_index_entry(path: str) -> bool:
    """Whether a metadata path is one of the object index's entries (of any topic)."""
    return isinstance(parse_index_key(path), IndexKey)


# -- the cluster --------------------------------------------------------------------------------
# Topics are full names (`/namespace/topic`); broker ids are strings (decimal numbers in
# production, any text without `/` in tests).

CLUSTER_PREFIX = "/cluster/"
REGISTER_PREFIX = "/cluster/register/"
BROKERS_PREFIX = "/cluster/brokers/"
UNASSIGNED_PREFIX = "/cluster/unassigned/"
LOAD_PREFIX = "/cluster/load/"
LEADER_KEY = "/cluster/leader"
HISTORY_PREFIX = "/cluster/rebalancing_history/"
REPLICAS_PREFIX = "/cluster/replicas/"
POLICIES_PREFIX = "/cluster/policies/"


class AssignmentKey(NamedTuple):
    """`/cluster/brokers/<id>/<ns>/<topic>`; a tuple, so `broker, topic = ...` unpacks it."""

    broker_id: str
    topic: str


def check_broker(broker_id: str) -> str:
    """`broker_id` if it can be part of a key, else ValueError."""
    if not broker_id or "/" in broker_id:
        raise ValueError(f"invalid broker id {broker_id!r}: must be non-empty and without '/'")
    return broker_id


def _check_topic(topic: str) -> str:
    try:
        return parse_topic(topic).full
    except DanubeError as error:
        raise ValueError(error.message) from None


def register_key(broker_id: str) -> str:
    return REGISTER_PREFIX + check_broker(broker_id)


def state_key(broker_id: str) -> str:
    return f"{BROKERS_PREFIX}{check_broker(broker_id)}/state"


def assignment_key(broker_id: str, topic: str) -> str:
    """`/cluster/brokers/<id>/<ns>/<topic>`: the topic belongs to the broker."""
    return f"{BROKERS_PREFIX}{check_broker(broker_id)}{_check_topic(topic)}"


def unassigned_key(topic: str) -> str:
    return UNASSIGNED_PREFIX + _check_topic(topic)[1:]


def replicas_key(topic: str) -> str:
    """`/cluster/replicas/<ns>/<topic>`: the topic's replica set
    (`danube.machines.cluster.replicas`). Under `/cluster/`, not beside the topic's keys, so
    that the load manager's watch of `/cluster/` sees it (spec/replication.md)."""
    return REPLICAS_PREFIX + _check_topic(topic)[1:]


def cluster_policy_key(name: str) -> str:
    """`/cluster/policies/<ns>` for a namespace (`name` without `/`), or
    `/cluster/policies/<ns>/<topic>` for a topic (`/ns/topic`): our own policy record
    (`danube.machines.cluster.policies`: the replication factor). Not in Danube's
    `/namespaces/<ns>/policy` or `/topics/.../policy`: those are Danube's JSON, and the load
    manager, which applies the factor, watches `/cluster/` only."""
    if name.startswith("/"):
        return POLICIES_PREFIX + _check_topic(name)[1:]
    try:
        return POLICIES_PREFIX + validate_namespace(name)
    except DanubeError as error:
        raise ValueError(error.message) from None


def load_key(broker_id: str) -> str:
    return LOAD_PREFIX + check_broker(broker_id)


def history_key(unix_s: int) -> str:
    """`/cluster/rebalancing_history/<unix seconds>`: the audit record of one move."""
    if unix_s < 0:
        raise ValueError(f"a history timestamp cannot be negative, got {unix_s}")
    return f"{HISTORY_PREFIX}{unix_s}"


def _single(key: str, prefix: str) -> str | None:
    parts = _segments(key, prefix)
    return parts[0] if parts is not None and len(parts) == 1 else None


def parse_register_key(key: str) -> str | None:
    """The broker id of a registration key, else None."""
    return _single(key, REGISTER_PREFIX)


def parse_load_key(key: str) -> str | None:
    return _single(key, LOAD_PREFIX)


@lru_cache(maxsize=_PARSED)
def parse_state_key(key: str) -> str | None:
    parts = _segments(key, BROKERS_PREFIX)
    return parts[0] if parts is not None and len(parts) == 2 and parts[1] == "state" else None


@lru_cache(maxsize=_PARSED)
def parse_assignment_key(key: str) -> AssignmentKey | None:
    """(broker id, topic) of an assignment key, else None (the state key is not one)."""
    parts = _segments(key, BROKERS_PREFIX)
    if parts is None or len(parts) != 3:
        return None
    topic = _topic_name(parts[1], parts[2])
    return None if topic is None else AssignmentKey(parts[0], topic.full)


@lru_cache(maxsize=_PARSED)
def parse_unassigned_key(key: str) -> str | None:
    """The topic (full name) of an unassigned marker's key, else None."""
    parts = _segments(key, UNASSIGNED_PREFIX)
    if parts is None or len(parts) != 2:
        return None
    topic = _topic_name(parts[0], parts[1])
    return None if topic is None else topic.full


@lru_cache(maxsize=_PARSED)
def parse_replicas_key(key: str) -> str | None:
    """The topic (full name) of a replica set's key, else None."""
    parts = _segments(key, REPLICAS_PREFIX)
    if parts is None or len(parts) != 2:
        return None
    topic = _topic_name(parts[0], parts[1])
    return None if topic is None else topic.full


def parse_cluster_policy_key(key: str) -> str | None:
    """The namespace (`ns`) or topic (`/ns/topic`) a policy record is for, else None."""
    parts = _segments(key, POLICIES_PREFIX)
    if parts is None or len(parts) not in (1, 2):
        return None
    if len(parts) == 2:
        topic = _topic_name(parts[0], parts[1])
        return None if topic is None else topic.full
    try:
        return validate_namespace(parts[0])
    except DanubeError:
        return None


def parse_history_key(key: str) -> int | None:
    rest = _single(key, HISTORY_PREFIX)
    return None if rest is None else _number(rest)


# -- the schema registry ------------------------------------------------------------------------

SUBJECTS = "/schemas/subjects/"
IDS = "/schemas/ids/"
NEXT_ID = "/schemas/next_id"


def subject_key(name: str) -> str:
    return SUBJECTS + name


def id_key(schema_id: int) -> str:
    return f"{IDS}{schema_id:020d}"


def parse_subject_key(key: str) -> str | None:
    """The subject a subject key holds, else None."""
    return _single(key, SUBJECTS)


def parse_id_key(key: str) -> int | None:
    """The schema id an id-index key names, else None."""
    rest = _single(key, IDS)
    return int(rest) if rest is not None and _padded(rest) else None
