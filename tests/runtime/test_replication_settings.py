"""`cluster.replication` in the broker's YAML (spec/replication.md, "Configuration") and what
the broker hands the core from it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from danube.runtime.server import _replication_settings
from danube.values.config import ConfigError, config_from_mapping


def test_lag_and_min_in_sync_come_from_cluster_replication() -> None:
    config = config_from_mapping({"cluster": {"replication": {"lag_ms": 250, "min_in_sync": 2}}})
    settings = _replication_settings(config, "42")
    assert (settings.broker_id, settings.lag_ms, settings.min_in_sync) == ("42", 250, 2)


def test_without_the_section_the_defaults_hold() -> None:
    settings = _replication_settings(config_from_mapping({}), "42")
    assert (settings.lag_ms, settings.min_in_sync) == (1_000, 1)


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ({"lag": 1}, "cluster.replication: unknown key(s) lag"),
        ({"lag_ms": 0}, "cluster.replication.lag_ms: expected an integer >= 1"),
        ({"min_in_sync": "2"}, "cluster.replication.min_in_sync: expected an integer >= 1"),
        ([], "cluster.replication: expected a mapping"),
    ],
)
def test_mistakes_name_the_key(section: Any, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        config_from_mapping({"cluster": {"replication": section}})


def test_the_replication_factor_comes_from_cluster_replication_factor() -> None:
    config = config_from_mapping({"cluster": {"replication_factor": 3}})
    assert config.cluster.load_manager.replication_factor == 3
    # with a load_manager section too: both apply
    config = config_from_mapping(
        {"cluster": {"replication_factor": 1}, "load_manager": {"assignment_strategy": "fair"}}
    )
    assert config.cluster.load_manager.replication_factor == 1
    assert config_from_mapping({}).cluster.load_manager.replication_factor is None


@pytest.mark.parametrize("value", [0, -1, "2", True, 1.5])
def test_a_bad_replication_factor_is_one_readable_line(value: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"cluster": {"replication_factor": value}})
    assert str(caught.value).startswith("cluster.replication_factor: expected an integer >= 1")
    assert "\n" not in str(caught.value)
