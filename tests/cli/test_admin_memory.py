"""`danube-admin brokers memory` reads the pools from a broker's metrics page without
prometheus_client (the admin tool is part of the client install)."""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
from types import SimpleNamespace

from danube.cli.admin_brokers import memory, memory_of

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


def test_a_metrics_address_that_answers_no_http_is_a_row_not_a_traceback() -> None:
    """Review finding: http.client's BadStatusLine (something other than an HTTP server at
    the metrics address, a gRPC port say) escaped `(OSError, ValueError)` as a traceback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def answer_nonsense() -> None:
        for _ in range(2):
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                connection.sendall(b"\x00\x00\x12\x04garbage\r\n\r\n")

    server = threading.Thread(target=answer_nonsense, daemon=True)
    server.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    brokers = SimpleNamespace(
        brokers=[
            SimpleNamespace(broker_id="1", metrics_addr=address),
            SimpleNamespace(broker_id="2", metrics_addr=address),
        ]
    )

    class Client:
        security = None
        brokers = SimpleNamespace(list_brokers=lambda _: brokers)

        async def call(self, _what: str, answer: object) -> object:
            return answer

    try:
        result = asyncio.run(memory(Client(), argparse.Namespace()))  # type: ignore[arg-type]
    finally:
        server.join(5)
        listener.close()
    assert "metrics unreachable: not an HTTP answer" in result.text
    assert [row["broker_id"] for row in result.data] == ["1", "2"]  # type: ignore[attr-defined]
