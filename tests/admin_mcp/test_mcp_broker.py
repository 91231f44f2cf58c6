"""`danube-admin serve --mode mcp` against a real broker, driven by the MCP SDK's own client
(issue 26, point 5): over stdio (the server is a subprocess, as an assistant starts it) and
over streamable HTTP. Tools list with Danube's names, a call does what the CLI does, and a
refusal is a tool error with the CLI's message, not a protocol failure."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from danube.localcluster.broker_process import BrokerProcess

pytestmark = pytest.mark.slow
ADMIN = str(Path(sys.executable).with_name("danube-admin"))


@asynccontextmanager
async def stdio_session(endpoint: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=ADMIN, args=["--endpoint", endpoint, "serve", "--mode", "mcp"]
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text(result: Any) -> str:
    return "".join(block.text for block in result.content)


async def exercise(session: ClientSession) -> None:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert {"list_brokers", "create_topic", "describe_topic", "list_topics"} <= set(tools)
    assert tools["delete_topic"].annotations.destructive_hint is True
    assert tools["list_topics"].annotations.read_only_hint is True

    topic = f"/default/mcp-{uuid.uuid4().hex[:8]}"
    created = await session.call_tool("create_topic", {"topic": topic})
    assert not created.is_error, text(created)
    listed = await session.call_tool("list_topics", {"namespace": "default"})
    assert not listed.is_error
    names = [t["name"] for t in json.loads(text(listed))["topics"]]
    assert topic in names
    assert listed.structured_content == json.loads(text(listed))

    refused = await session.call_tool("create_topic", {"topic": topic})  # exists already
    assert refused.is_error and f"create topic {topic}" in text(refused)
    assert "Traceback" not in text(refused)
    bad = await session.call_tool("describe_topic", {"topic": "a/b/c/d"})
    assert bad.is_error and "invalid topic" in text(bad)


def test_the_tools_over_stdio_work_against_a_real_broker(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with stdio_session(f"http://{broker.admin_addr}") as session:
            await exercise(session)

    anyio.run(main)


def test_a_broker_that_is_not_there_is_a_tool_error(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def main() -> None:
        async with stdio_session(f"http://127.0.0.1:{port}") as session:
            result = await session.call_tool("list_brokers", {})
            assert result.is_error and "cannot reach the admin port" in text(result)

    anyio.run(main)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the MCP HTTP server did not start")
        time.sleep(0.1)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_tools_over_streamable_http_work_against_a_real_broker(
    broker: BrokerProcess,
) -> None:
    port = _free_port()
    command = [ADMIN, "--endpoint", f"http://{broker.admin_addr}", "serve", "--mode", "mcp",
               "--transport", "streamable-http", "--port", str(port)]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: _listening(port) or server.poll() is not None, 30)
        assert server.poll() is None, server.stderr.read() if server.stderr else ""

        async def main() -> None:
            url = f"http://127.0.0.1:{port}/mcp"
            async with (
                streamable_http_client(url) as (read, write, *_),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                await exercise(session)

        anyio.run(main)
    finally:
        server.terminate()
        server.wait(timeout=15)
