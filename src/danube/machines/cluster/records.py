"""The values of Danube's `/cluster/...` records (danube-reference.md §6.2, spec/cluster.md):
broker states, unassigned markers, broker ids in JSON, and the leader's guard. The keys they
live under are built and parsed in `danube.keys`.

Danube writes broker ids inside JSON values as numbers, so decimal ids are written as numbers
and both forms are read back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from danube.keys import LEADER_KEY, check_broker
from danube.metadata.model import Compare, JSONValue


def leader_compare(broker_id: str) -> Compare:
    """The guard of every write only the leader may make: the store still names it leader."""
    return Compare(LEADER_KEY, "value", "==", check_broker(broker_id))


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
