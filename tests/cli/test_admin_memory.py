"""`danube-admin brokers memory` reads the pools from a broker's metrics page without
prometheus_client (the admin tool is part of the client install)."""

from __future__ import annotations

from danube.cli.admin_brokers import memory_of

PAGE = """# HELP danube_memory_budget_bytes the budget
# TYPE danube_memory_budget_bytes gauge
danube_memory_budget_bytes{broker="1"} 2.68435456e+08
danube_memory_pool_used_bytes{broker="1",pool="cache"} 1024.0
danube_memory_pool_used_bytes{pool="publish",broker="1"} 12.0
danube_memory_publish_paused_seconds_total{broker="1"} 0.5
danube_memory_pool_bytes{broker="1",pool="consumer"} NaN-ish
danube_topic_messages_in_total{broker="1",topic="/default/t"} 3.0
"""


def test_the_memory_samples_are_read_by_name_and_pool() -> None:
    assert memory_of(PAGE) == {
        "danube_memory_budget_bytes": 268435456.0,
        "danube_memory_pool_used_bytes:cache": 1024.0,
        "danube_memory_pool_used_bytes:publish": 12.0,
        "danube_memory_publish_paused_seconds_total": 0.5,
    }
