"""The `load_manager` section of the broker's config (spec/cluster.md, "Load manager"), with
Danube's code defaults: values the config parser builds and the load manager machine
(`danube.machines.cluster.load_manager`, which re-exports them) reads. They live with the values so
that `danube.values.config` imports no machine."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from danube.values.errors import ConfigError, DanubeError
from danube.values.names import parse_topic, validate_namespace


class Strategy(enum.Enum):
    """`load_manager.assignment_strategy`."""

    FAIR = "fair"
    BALANCED = "balanced"
    WEIGHTED_LOAD = "weighted_load"


class Aggressiveness(enum.Enum):
    """`rebalancing.aggressiveness`: how uneven the cluster may get before topics move."""

    CONSERVATIVE = "conservative"
    BALANCED = "balanced"
    AGGRESSIVE = "aggressive"

    @property
    def threshold(self) -> float:
        """Rebalance while the coefficient of variation is at least this."""
        return _THRESHOLDS[self]


_THRESHOLDS = {
    Aggressiveness.CONSERVATIVE: 0.40,
    Aggressiveness.BALANCED: 0.30,
    Aggressiveness.AGGRESSIVE: 0.20,
}

_REBALANCING_MINIMA = {
    "check_interval_seconds": 1,
    "max_moves_per_hour": 0,
    "cooldown_seconds": 0,
    "min_brokers_for_rebalance": 1,
    "min_topic_age_seconds": 0,
}
_WHERE = "load_manager.rebalancing"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_pattern(pattern: Any) -> None:
    where = f"{_WHERE}.blacklist_topics"
    if not isinstance(pattern, str):
        raise ConfigError(f"{where}: expected topic names, got {pattern!r}")
    try:
        if pattern.startswith("/") and pattern.endswith("/*") and pattern.count("/") == 2:
            validate_namespace(pattern[1:-2])
        else:
            parse_topic(pattern)
    except DanubeError as error:
        raise ConfigError(
            f"{where}: {pattern!r} is neither '/namespace/topic' nor '/namespace/*' "
            f"({error.message})"
        ) from None


@dataclass(frozen=True, slots=True)
class RebalancingConfig:
    """`load_manager.rebalancing`, with Danube's code defaults."""

    enabled: bool = False
    aggressiveness: Aggressiveness = Aggressiveness.BALANCED
    check_interval_seconds: int = 300
    max_moves_per_hour: int = 10
    """Cap on automatic moves in any sliding hour (manual moves count towards it too)."""
    cooldown_seconds: int = 60
    """No move, automatic or manual, sooner than this after the previous one."""
    min_brokers_for_rebalance: int = 2
    min_topic_age_seconds: int = 300
    """A topic moves only once it has been on its broker (or since its last move) this long."""
    blacklist_topics: tuple[str, ...] = ()
    """Never moved: exact topic names, or `/namespace/*`."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"{_WHERE}.enabled: expected true or false, got {self.enabled!r}")
        if not isinstance(self.aggressiveness, Aggressiveness):
            raise ConfigError(f"{_WHERE}.aggressiveness: got {self.aggressiveness!r}")
        for name, minimum in _REBALANCING_MINIMA.items():
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise ConfigError(
                    f"{_WHERE}.{name}: expected an integer >= {minimum}, got {value!r}"
                )
        for pattern in self.blacklist_topics:
            _check_pattern(pattern)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RebalancingConfig:
        _reject_unknown(data, {f.name for f in dataclasses.fields(cls)}, _WHERE)
        values = dict(data)
        if "aggressiveness" in values:
            values["aggressiveness"] = _enum(
                Aggressiveness, values["aggressiveness"], f"{_WHERE}.aggressiveness"
            )
        if "blacklist_topics" in values:
            patterns = values["blacklist_topics"]
            if patterns is None:
                patterns = []
            if not isinstance(patterns, list):
                raise ConfigError(f"{_WHERE}.blacklist_topics: expected a list of topic names")
            values["blacklist_topics"] = tuple(patterns)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class LoadManagerConfig:
    """The `load_manager` section, plus `retry_ms`."""

    assignment_strategy: Strategy = Strategy.BALANCED
    load_report_interval_seconds: int = 30
    """How often each broker writes its load report; read by the membership machine, kept
    here because it is a key of this section."""
    rebalancing: RebalancingConfig | None = None
    """None when the section is absent: nothing moves on its own and a manual rebalance is
    refused, as in Danube."""
    retry_ms: int = 2_000
    """Ours, not read from YAML: how long a transaction may take to show in the watch before
    its decision is made again (a transaction that failed leaves no trace in the watch)."""
    replication_factor: int | None = None
    """Ours (`cluster.replication_factor` in the YAML, spec/replication.md): replicas of each
    topic, the owner included, unless its namespace or the topic sets its own. None: 2 when
    at least two brokers are active, else 1. Always capped by the active brokers
    (`danube.machines.cluster.replicas`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.assignment_strategy, Strategy):
            raise ConfigError(f"load_manager.assignment_strategy: got {self.assignment_strategy!r}")
        for name, minimum in (("load_report_interval_seconds", 1), ("retry_ms", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise ConfigError(
                    f"load_manager.{name}: expected an integer >= {minimum}, got {value!r}"
                )
        factor = self.replication_factor
        if factor is not None and (not _is_int(factor) or factor < 1):
            raise ConfigError(
                f"cluster.replication_factor: expected an integer >= 1, got {factor!r}"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> LoadManagerConfig:
        """The parsed YAML section (None when absent), with Danube's keys only."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("load_manager: expected a mapping")
        allowed = {"assignment_strategy", "load_report_interval_seconds", "rebalancing"}
        _reject_unknown(data, allowed, "load_manager")
        values: dict[str, Any] = {}
        if "assignment_strategy" in data:
            values["assignment_strategy"] = _enum(
                Strategy, data["assignment_strategy"], "load_manager.assignment_strategy"
            )
        if "load_report_interval_seconds" in data:
            values["load_report_interval_seconds"] = data["load_report_interval_seconds"]
        section = data.get("rebalancing")
        if section is not None:
            if not isinstance(section, Mapping):
                raise ConfigError(f"{_WHERE}: expected a mapping")
            values["rebalancing"] = RebalancingConfig.from_mapping(section)
        return cls(**values)


def _reject_unknown(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


_E = TypeVar("_E", bound=enum.Enum)


def _enum(cls: type[_E], value: Any, where: str) -> _E:
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(str(member.value) for member in cls)
        raise ConfigError(f"{where}: expected one of {choices}, got {value!r}") from None
