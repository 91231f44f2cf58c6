"""The console's JSON API against a real broker (issue 26 point 4): the same command registry
as the CLI and MCP, refusals as the CLI's one-line message with a 4xx status, and the CSRF
rule for calls that change the cluster."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube.admin_mcp.tools import admin_tools
from danube.cli.admin import build_parser
from danube.console.app import js_safe
from danube.console.metrics import topic_series
from danube.localcluster.broker_process import BrokerProcess
from tests.console.support import ConsoleServer, call, request

ADMIN = str(Path(sys.executable).with_name("danube-admin"))


@pytest.fixture(scope="module")
def console(broker: BrokerProcess) -> Iterator[ConsoleServer]:
    with ConsoleServer(f"http://{broker.admin_addr}") as server:
        yield server


def admin_json(broker: BrokerProcess, name: str, arguments: dict[str, object]) -> object:
    tool = {t.name: t for t in admin_tools(build_parser())}[name]
    return asyncio.run(tool.run(f"http://{broker.admin_addr}", 10.0, arguments)).data


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ---- without a broker ---------------------------------------------------------------------


def test_integers_javascript_cannot_hold_become_strings() -> None:
    data = {"brokers": [{"broker_id": 6736512050086376951, "load": 1.0, "count": 3, "ok": True}]}
    assert js_safe(data) == {
        "brokers": [{"broker_id": "6736512050086376951", "load": 1.0, "count": 3, "ok": True}]
    }
    assert js_safe(2**53 - 1) == 2**53 - 1 and js_safe(2**53) == str(2**53)


def test_topic_series_sums_a_topics_counters_over_brokers() -> None:
    old_owner = (
        'danube_topic_messages_in_total{broker="1",topic="/default/t"} 30.0\n'
        'danube_topic_messages_in_total{broker="1",topic="/default/other"} 999.0\n'
        'danube_consumer_messages_out_total{broker="1",subscription="s",topic="/default/t"} 20.0\n'
        "# HELP danube_topic_bytes_in_total bytes\n"
    )
    new_owner = (
        'danube_topic_messages_in_total{broker="2",topic="/default/t"} 12.0\n'
        'danube_topic_bytes_in_total{broker="2",topic="/default/t"} 120.0\n'
        'danube_consumer_messages_out_total{broker="2",subscription="s",topic="/default/t"} 2.0\n'
    )
    series = topic_series([old_owner, new_owner], "/default/t")
    assert series["messages_in"] == 42.0 and series["bytes_in"] == 120.0
    assert series["messages_out"] == {"s": 22.0}
    assert series["backlog_estimate"] == {"s": 20.0}


def test_the_page_ships_as_package_data() -> None:
    """A wheel carries only the data files pyproject names: the console's must be among them."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["danube"]
    static = root / "src" / "danube" / "console" / "static"
    shipped = {p for pattern in globs for p in (root / "src" / "danube").glob(pattern)}
    assert {"index.html", "console.js", "console.css"} <= {p.name for p in static.iterdir()}
    assert set(static.iterdir()) <= shipped


# ---- against a real broker ----------------------------------------------------------------

slow = pytest.mark.slow


@slow
def test_the_tool_list_is_the_admin_command_registry(console: ConsoleServer) -> None:
    status, _, raw = request(f"{console.url}/api/tools")
    assert status == 200
    listed = {t["name"]: t for t in json.loads(raw)["tools"]}
    assert set(listed) == {t.name for t in admin_tools(build_parser())}
    assert listed["delete_topic"]["destructive"] is True
    assert listed["list_topics"]["read_only"] is True
    assert listed["create_topic"]["read_only"] is False
    assert listed["describe_topic"]["input_schema"]["required"] == ["topic"]


@slow
def test_a_call_returns_what_the_admin_api_returns(
    console: ConsoleServer, broker: BrokerProcess
) -> None:
    topic = f"/default/ui-{uuid.uuid4().hex[:8]}"
    status, body = call(console.url, "create_topic", {"topic": topic})
    assert status == 200, body
    status, body = call(console.url, "list_topics", {"namespace": "default"})
    assert status == 200
    assert body["data"] == js_safe(admin_json(broker, "list_topics", {"namespace": "default"}))
    assert topic in [t["name"] for t in body["data"]["topics"]]
    status, body = call(console.url, "describe_topic", {"topic": topic})
    assert status == 200 and body["data"]["name"] == topic


@slow
def test_refusals_are_one_line_messages_with_a_4xx_status(console: ConsoleServer) -> None:
    topic = f"/default/ui-{uuid.uuid4().hex[:8]}"
    assert call(console.url, "create_topic", {"topic": topic})[0] == 200
    status, body = call(console.url, "create_topic", {"topic": topic})  # exists already
    assert status == 409 and f"create topic {topic}" in body["error"]
    status, body = call(console.url, "describe_topic", {"topic": "a/b/c/d"})
    assert status == 400 and "invalid topic" in body["error"]
    status, body = call(console.url, "describe_topic", {"topc": topic})
    assert status == 400 and "unknown argument" in body["error"]
    assert call(console.url, "no_such_tool", {})[0] == 404
    status, body = call(console.url, "describe_topic", [topic])
    assert status == 400 and "JSON object" in body["error"]
    for answer in (body, call(console.url, "create_topic", {"topic": topic})[1]):
        assert "\n" not in answer["error"] and "Traceback" not in answer["error"]


@slow
def test_a_broker_that_is_not_there_is_a_409_not_a_traceback() -> None:
    with ConsoleServer(f"http://127.0.0.1:{free_port()}", timeout_s=2.0) as server:
        status, body = call(server.url, "list_brokers")
    assert status == 409 and "Traceback" not in body["error"] and "\n" not in body["error"]


@slow
def test_state_changing_calls_need_the_console_header_and_its_origin(
    console: ConsoleServer, broker: BrokerProcess
) -> None:
    topic = f"/default/ui-{uuid.uuid4().hex[:8]}"
    assert call(console.url, "create_topic", {"topic": topic})[0] == 200
    forged = [
        {},  # a plain cross-site form or fetch without the custom header
        {"x-danube-console": "1", "origin": "http://evil.example"},
        {"x-danube-console": "1", "sec-fetch-site": "cross-site"},
    ]
    for headers in forged:
        status, body = call(console.url, "delete_topic", {"topic": topic}, headers=headers)
        assert status == 403 and "CSRF" in body["error"], (headers, body)
    listed = admin_json(broker, "list_topics", {"namespace": "default"})
    assert topic in [t["name"] for t in listed["topics"]]  # type: ignore[index]
    # reading needs no header; the page's own request (header, same origin) may delete
    assert call(console.url, "list_topics", {"namespace": "default"}, headers={})[0] == 200
    same_origin = {"x-danube-console": "1", "origin": console.url, "sec-fetch-site": "same-origin"}
    assert call(console.url, "delete_topic", {"topic": topic}, headers=same_origin)[0] == 200
    listed = admin_json(broker, "list_topics", {"namespace": "default"})
    assert topic not in [t["name"] for t in listed["topics"]]  # type: ignore[index]


@slow
def test_a_foreign_host_name_is_refused_against_dns_rebinding(console: ConsoleServer) -> None:
    topic = f"/default/ui-{uuid.uuid4().hex[:8]}"
    assert call(console.url, "create_topic", {"topic": topic})[0] == 200
    rebound = {
        "host": "attacker.example",
        "origin": "http://attacker.example",
        "sec-fetch-site": "same-origin",
        "x-danube-console": "1",
    }
    status, _, raw = request(
        f"{console.url}/api/tools/delete_topic",
        json.dumps({"topic": topic}).encode(),
        {"content-type": "application/json", **rebound},
        "POST",
    )
    assert status == 400, raw
    assert call(console.url, "describe_topic", {"topic": topic})[0] == 200  # still there
    assert (
        request(f"{console.url}/api/health", headers={"host": f"localhost:{console.port}"})[0]
        == 200
    )


@slow
def test_the_page_is_served_from_the_package_with_a_strict_policy(console: ConsoleServer) -> None:
    status, headers, raw = request(f"{console.url}/")
    assert status == 200 and b'<script src="console.js"' in raw
    lowered = {k.lower(): v for k, v in headers.items()}
    assert "default-src 'self'" in lowered["content-security-policy"]
    assert lowered["x-frame-options"] == "DENY"
    for asset in ("console.js", "console.css"):
        assert request(f"{console.url}/{asset}")[0] == 200


@slow
def test_danube_admin_serve_mode_ui_serves_the_console(broker: BrokerProcess) -> None:
    port = free_port()
    process = subprocess.Popen(
        [ADMIN, "--endpoint", f"http://{broker.admin_addr}", "serve", "--mode", "ui",
         "--port", str(port)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                status, _, raw = request(f"http://127.0.0.1:{port}/api/health")
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
        assert status == 200 and json.loads(raw)["endpoint"] == f"http://{broker.admin_addr}"
        status, body = call(f"http://127.0.0.1:{port}", "list_brokers")
        assert status == 200 and len(body["data"]["brokers"]) == 1
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert f"event=console_listening url=http://127.0.0.1:{port}/" in stderr
