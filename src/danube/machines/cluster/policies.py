"""Our own policy record for namespaces and topics (spec/replication.md, "Replication factor"):
`/cluster/policies/<ns>` and `/cluster/policies/<ns>/<topic>` (`danube.keys.cluster_policy_key`)
hold `{"replication_factor": N}`.

Why a record of our own and not a field of Danube's policies: Danube's
`/namespaces/<ns>/policy` and `/topics/<ns>/<t>/policy` are Danube's JSON (its brokers read
them), and the factor is the load manager's to apply, which watches `/cluster/` only, on
every broker, so the leader that places followers sees a change at once, without a second
watch. The admin call (`PolicyAdmin.SetReplicationFactor`) writes it with the flow below; the
load manager reads it through `danube.machines.cluster.replicas.ReplicaView`.

The factor in force for a topic: the topic's own, else its namespace's, else the cluster's
(`cluster.replication_factor`), else the default rule (2 with at least two active brokers,
else 1), always capped by the active brokers (`replicas.replication_factor`). Pure: the flows
yield store effects (`danube.effects`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from danube import keys
from danube.effects import Outcome, StoreRead, StoreTxn
from danube.effects.flow import Flow
from danube.metadata.model import Compare, Delete, JSONValue, Op, Put
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.values.names import parse_topic, validate_namespace

FIELD = "replication_factor"
MAX_FACTOR = 16
"""A bound on what an operator may ask for (a typo of 100 would otherwise be accepted and
silently capped by the active brokers); more copies than this is not a replication factor."""

TOPIC, NAMESPACE, CLUSTER, DEFAULT = "topic", "namespace", "cluster", "default"
"""Where a topic's factor comes from (`resolve`)."""


class PolicyError(ValueError):
    """A stored policy record that does not read as one (the message says why)."""


def check_factor(factor: Any) -> int:
    """`factor` if it is a valid replication factor, else INVALID_ARGUMENT."""
    if not isinstance(factor, int) or isinstance(factor, bool) or not 1 <= factor <= MAX_FACTOR:
        raise invalid(
            f"replication factor: expected an integer from 1 to {MAX_FACTOR}, got {factor!r}"
        )
    return factor


def factor_from_json(value: JSONValue) -> int:
    """The factor of a stored record; `PolicyError` if it is not one. Unknown fields are
    ignored, so that a later version may add policies to the record."""
    if not isinstance(value, dict) or FIELD not in value:
        raise PolicyError(f"policy record: expected {{{FIELD!r}: N}}, got {value!r}")
    try:
        return check_factor(value[FIELD])
    except DanubeError as error:
        raise PolicyError(f"policy record: {error.message}") from None


def factor_to_json(factor: int) -> dict[str, JSONValue]:
    return {FIELD: check_factor(factor)}


def namespace_of(name: str) -> str:
    """The namespace a policy name belongs to: itself, or a topic's (`/ns/topic`)."""
    return parse_topic(name).namespace if name.startswith("/") else validate_namespace(name)


def in_force(
    name: str, own: int | None, namespace: int | None, configured: int | None
) -> tuple[int | None, str]:
    """(factor, source) for a topic or, for a namespace, for its topics that set none:
    `own` (the name's record), `namespace` (its namespace's record), `configured` (the
    cluster's), or None for the default rule."""
    if name.startswith("/") and own is not None:
        return own, TOPIC
    if (inherited := namespace if name.startswith("/") else own) is not None:
        return inherited, NAMESPACE
    return configured, CLUSTER if configured is not None else DEFAULT


def resolve(
    topic: str, factors: Mapping[str, int], configured: int | None
) -> tuple[int | None, str]:
    """(factor, source) for `topic`: its own, its namespace's, the cluster's, or None for
    the default rule. `factors` maps policy names (`ns`, `/ns/topic`) to factors."""
    if (own := factors.get(topic)) is not None:
        return own, TOPIC
    if (inherited := factors.get(namespace_of(topic))) is not None:
        return inherited, NAMESPACE
    return configured, CLUSTER if configured is not None else DEFAULT


# -- the admin's flows ---------------------------------------------------------------------------


def set_factor(name: str, factor: int | None) -> Flow[int | None]:
    """SetReplicationFactor: `name`'s own factor becomes `factor` (None: cleared, its
    namespace's or the cluster's applies). The namespace, and a topic itself, must exist:
    the write compares that they still do, so a record never outlives a deletion it raced
    with. An unanswered write is read back: the record found there is ours."""
    if factor is not None:
        check_factor(factor)
    namespace = namespace_of(name)  # INVALID_ARGUMENT for a bad name
    key = keys.cluster_policy_key(name)
    must_exist = [(keys.namespace_policy(namespace), f"namespace {quoted(namespace)}")]
    if name.startswith("/"):
        must_exist.append((keys.namespace_topic(parse_topic(name)), f"topic {quoted(name)}"))
    for where, what in must_exist:
        if (yield StoreRead(where)) is None:
            raise not_found(f"{what} does not exist")
    ops: tuple[Op, ...] = (
        (Put(key, factor_to_json(factor)),) if factor is not None else (Delete(key),)
    )
    answer = yield StoreTxn(
        tuple(Compare(where, "version", ">", 0) for where, _ in must_exist),
        ops,
        read_back=(key,),
        purpose=f"replication factor {name}",
    )
    if answer.committed:
        return factor
    if answer.outcome is Outcome.UNKNOWN and key in answer.found:
        found = answer.found[key]
        stored = None if found is None else found.value
        if stored == (None if factor is None else factor_to_json(factor)):
            return factor
        raise DanubeError(
            ErrorCode.UNAVAILABLE, "the metadata store did not answer; the factor may not be set"
        )
    if answer.outcome is Outcome.UNKNOWN:
        raise DanubeError(ErrorCode.UNAVAILABLE, "the metadata store did not answer; retry")
    raise not_found(f"{name} was deleted meanwhile")


def read_factors(name: str) -> Flow[tuple[int | None, int | None]]:
    """(the name's own factor, its namespace's) as stored; for a namespace both are its own.
    A record that does not read (written by hand) counts as absent, as for the load manager."""
    namespace = namespace_of(name)
    found: list[int | None] = []
    for policy in (name, namespace):
        kv = yield StoreRead(keys.cluster_policy_key(policy))
        try:
            found.append(None if kv is None else factor_from_json(kv.value))
        except PolicyError:
            found.append(None)
    return found[0], found[1]
