"""Danube's `/cluster/...` metadata layout (danube-reference.md §6.2): the keys, and the values
the load manager reads and writes under them (spec/cluster.md).

Keys are built and parsed here only, so that a watch event can be routed by its key and a
Danube operator finds every record where Danube keeps it. Topics are full names
(`/namespace/topic`); broker ids are strings (decimal numbers in production, any text without
`/` in tests). Danube writes broker ids inside JSON values as numbers, so decimal ids are
written as numbers and both forms are read back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from danube.core.errors import DanubeError
from danube.core.names import parse_topic
from danube.metadata.model import Compare, JSONValue

CLUSTER_PREFIX = "/cluster/"
REGISTER_PREFIX = "/cluster/register/"
BROKERS_PREFIX = "/cluster/brokers/"
UNASSIGNED_PREFIX = "/cluster/unassigned/"
LOAD_PREFIX = "/cluster/load/"
LEADER_KEY = "/cluster/leader"
HISTORY_PREFIX = "/cluster/rebalancing_history/"


def _check_broker(broker_id: str) -> str:
    if not broker_id or "/" in broker_id:
        raise ValueError(f"invalid broker id {broker_id!r}: must be non-empty and without '/'")
    return broker_id


def _check_topic(topic: str) -> str:
    try:
        return parse_topic(topic).full
    except DanubeError as error:
        raise ValueError(error.message) from None


def register_key(broker_id: str) -> str:
    return REGISTER_PREFIX + _check_broker(broker_id)


def state_key(broker_id: str) -> str:
    return f"{BROKERS_PREFIX}{_check_broker(broker_id)}/state"


def assignment_key(broker_id: str, topic: str) -> str:
    """`/cluster/brokers/<id>/<ns>/<topic>`: the topic belongs to the broker."""
    return f"{BROKERS_PREFIX}{_check_broker(broker_id)}{_check_topic(topic)}"


def unassigned_key(topic: str) -> str:
    return UNASSIGNED_PREFIX + _check_topic(topic)[1:]


def load_key(broker_id: str) -> str:
    return LOAD_PREFIX + _check_broker(broker_id)


def history_key(unix_s: int) -> str:
    """`/cluster/rebalancing_history/<unix seconds>`: the audit record of one move."""
    if unix_s < 0:
        raise ValueError(f"a history timestamp cannot be negative, got {unix_s}")
    return f"{HISTORY_PREFIX}{unix_s}"


def leader_compare(broker_id: str) -> Compare:
    """The guard of every write only the leader may make: the store still names it leader."""
    return Compare(LEADER_KEY, "value", "==", _check_broker(broker_id))


def _single(key: str, prefix: str) -> str | None:
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix) :]
    return rest if rest and "/" not in rest else None


def _topic(namespace: str, local: str) -> str | None:
    try:
        return _check_topic(f"/{namespace}/{local}")
    except ValueError:
        return None


def parse_register_key(key: str) -> str | None:
    """The broker id of a registration key, else None."""
    return _single(key, REGISTER_PREFIX)


def parse_load_key(key: str) -> str | None:
    return _single(key, LOAD_PREFIX)


def parse_state_key(key: str) -> str | None:
    if not key.startswith(BROKERS_PREFIX):
        return None
    parts = key[len(BROKERS_PREFIX) :].split("/")
    return parts[0] if len(parts) == 2 and parts[0] and parts[1] == "state" else None


def parse_assignment_key(key: str) -> tuple[str, str] | None:
    """(broker id, topic) of an assignment key, else None (the state key is not one)."""
    if not key.startswith(BROKERS_PREFIX):
        return None
    parts = key[len(BROKERS_PREFIX) :].split("/")
    if len(parts) != 3 or not parts[0]:
        return None
    topic = _topic(parts[1], parts[2])
    return None if topic is None else (parts[0], topic)


def parse_unassigned_key(key: str) -> str | None:
    if not key.startswith(UNASSIGNED_PREFIX):
        return None
    parts = key[len(UNASSIGNED_PREFIX) :].split("/")
    return _topic(parts[0], parts[1]) if len(parts) == 2 else None


def parse_history_key(key: str) -> int | None:
    rest = _single(key, HISTORY_PREFIX)
    return int(rest) if rest is not None and rest.isascii() and rest.isdigit() else None


# -- values ------------------------------------------------------------------------------------


def broker_id_to_json(broker_id: str) -> int | str:
    """Danube's JSON spelling: a number when the id is one."""
    return int(broker_id) if broker_id.isascii() and broker_id.isdigit() else broker_id


def broker_id_from_json(value: JSONValue) -> str | None:
    """A broker id read from a JSON number or string; None when it is neither."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and value and "/" not in value:
        return value
    return None


ACTIVE = "active"
DRAINING = "draining"
DRAINED = "drained"
MODES = (ACTIVE, DRAINING, DRAINED)


def state_value(mode: str, reason: str) -> dict[str, str]:
    """The value of `/cluster/brokers/<id>/state` (Danube's `{mode, reason}`)."""
    if mode not in MODES:
        raise ValueError(f"unknown broker mode {mode!r}: expected one of {', '.join(MODES)}")
    return {"mode": mode, "reason": reason}


def broker_mode(state: JSONValue) -> str | None:
    """The `mode` of `/cluster/brokers/<id>/state` (active, draining, drained), None if unset.

    Danube counts a broker as active unless its state names another mode, so a value without
    a readable mode reads as None, which is active."""
    if isinstance(state, dict) and isinstance(state.get("mode"), str):
        return str(state["mode"])
    return None


class MarkerReason(enum.Enum):
    """Why a topic is under `/cluster/unassigned/`."""

    NEW = "new"
    """Danube's null marker: a new topic, or one failed over from a dead broker."""
    UNLOAD = "unload"
    REBALANCE = "rebalance"
    DRAIN_REDIRECT = "drain_redirect"
    DELETE = "delete"
    """Ours: the topic is being deleted (DeleteTopic). Never assigned; once `ready` (its owner,
    if any, let go of it) the admin removes its metadata, objects and this marker."""


@dataclass(frozen=True, slots=True)
class Marker:
    """The value of `/cluster/unassigned/<ns>/<topic>`.

    `ready` is false while the previous owner is still sealing the topic; the leader assigns
    it only once the owner rewrites the marker with `ready: true`. Danube has the field on
    unload markers only; ours carry it on rebalance markers too, so that a rebalanced topic is
    unloaded (sealed) by its source instead of deleted (spec/cluster.md, "Differences")."""

    reason: MarkerReason = MarkerReason.NEW
    from_broker: str | None = None
    to_broker: str | None = None
    ready: bool = True
    timestamp: int | None = None

    @classmethod
    def from_json(cls, value: JSONValue) -> Marker:
        """Reads a marker as Danube does: anything it cannot make sense of is a null marker,
        so that a topic is never stranded by an unreadable value, and only an explicit
        `ready: false` holds a topic back."""
        if not isinstance(value, dict):
            return cls()
        try:
            reason = MarkerReason(value.get("reason"))
        except ValueError:
            return cls()
        if reason is MarkerReason.NEW:
            return cls()
        timestamp = value.get("timestamp")
        return cls(
            reason,
            broker_id_from_json(value.get("from_broker")),
            broker_id_from_json(value.get("to_broker")),
            value.get("ready") is not False,
            timestamp if isinstance(timestamp, int) and not isinstance(timestamp, bool) else None,
        )

    def to_json(self) -> JSONValue:
        if self.reason is MarkerReason.NEW:
            return None
        value: dict[str, Any] = {"reason": self.reason.value}
        if self.from_broker is not None:
            value["from_broker"] = broker_id_to_json(self.from_broker)
        if self.reason is MarkerReason.REBALANCE:
            if self.to_broker is not None:
                value["to_broker"] = broker_id_to_json(self.to_broker)
            if self.timestamp is not None:
                value["timestamp"] = self.timestamp
        if self.reason in (MarkerReason.UNLOAD, MarkerReason.REBALANCE, MarkerReason.DELETE):
            value["ready"] = self.ready
        return value
