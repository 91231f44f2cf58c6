"""What every tool offers besides its commands (issue 26): `--version`, shell completion,
argparse's exit status 2 for usage errors, and the pieces of `danube-cli`'s output that need
no broker: the progress line, `consume -o json`, `schema get`."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
from importlib.metadata import version
from typing import Any

import pytest

from danube.cli import admin, broker, client, local_cluster, logs, schema
from danube.cli.client_commands import MessageRenderer
from danube.cli.progress import Progress
from danube.client import Message
from danube.machines.schema.compatibility import CompatibilityMode
from danube.machines.schema.formats import SchemaType
from danube.proto import danube_schema as schema_pb

TOOLS = {
    "danube-cli": client,
    "danube-admin": admin,
    "danube-broker": broker,
    "danube-local-cluster": local_cluster,
}


def test_the_spelled_out_choices_are_the_registry_s() -> None:
    """`danube.cli.schema` spells the types and modes out so `--help` loads no schema code."""
    assert tuple(kind.value for kind in SchemaType) == schema.TYPES
    assert tuple(mode.value for mode in CompatibilityMode) == schema.MODES


@pytest.mark.parametrize("prog", sorted(TOOLS))
def test_every_tool_says_its_version(prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        TOOLS[prog].build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{prog} {version('pydanube')}\n"


@pytest.mark.parametrize("prog", sorted(TOOLS))
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_every_tool_prints_a_completion_script(
    prog: str, shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module: Any = TOOLS[prog]
    if prog in ("danube-cli", "danube-admin"):
        assert module.main(["completion", shell]) == 0
    else:
        with pytest.raises(SystemExit) as exited:
            module.build_parser().parse_args(["--completion", shell])
        assert exited.value.code == 0
    script = capsys.readouterr().out
    assert prog in script and "--help" in script
    if prog == "danube-cli":
        assert "produce" in script and "consume" in script and "schema" in script


@pytest.mark.parametrize(
    "argv",
    [
        ["produce", "-s", "http://127.0.0.1:1"],  # no payload
        ["produce", "-s", "http://127.0.0.1:1", "-m", "x", "-c", "0"],
        ["consume", "-s", "http://127.0.0.1:1", "-m", "sub", "-c", "0"],
        ["produce", "-s", "http://127.0.0.1:1", "-m", "x", "-a", "no-colon"],
    ],
)
def test_danube_cli_usage_errors_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a new user: these exited 1, like a broker's refusal; argparse's own exit 2."""
    assert client.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("danube-cli: error: ") and len(err.strip().splitlines()) == 1


def test_argparse_s_own_errors_exit_2_too() -> None:
    with pytest.raises(SystemExit) as exited:
        client.main(["consume"])  # -m/--subscription is required
    assert exited.value.code == 2


def test_schema_get_is_danube_s_spelling_of_show() -> None:
    args = client.build_parser().parse_args(["schema", "get", "orders", "-v", "2", "-o", "json"])
    shown = client.build_parser().parse_args(["schema", "show", "orders", "-v", "2"])
    assert args.run is shown.run is schema.show
    assert (args.subject, args.version, args.output) == ("orders", 2, "json")


class Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def test_the_progress_line_in_a_pipe_is_printed_once() -> None:
    """Found by a new user: `sent 1/1 messages in 8.0 s (0 msg/s)` twice on one line when
    stderr was not a terminal (a `\\r` rewrite followed by the final line)."""
    stream = Stream(terminal=False)
    progress = Progress("sent", 1, stream)
    progress._last -= 60  # a slow first send: the report is due
    progress.tick()
    progress.finish()
    lines = stream.getvalue().split("\n")
    assert "\r" not in stream.getvalue()
    assert len(lines) == 2 and lines[0].startswith("sent 1/1 messages") and lines[1] == ""


def test_a_terminal_s_progress_line_is_rewritten_in_place() -> None:
    stream = Stream(terminal=True)
    progress = Progress("sent", 3, stream)
    progress._last -= 60
    progress.tick()
    progress.finish()
    assert stream.getvalue().startswith("sent 1/3 messages") and stream.getvalue().count("\r") == 1


def test_a_long_run_in_a_pipe_reports_a_line_at_a_time() -> None:
    stream = Stream(terminal=False)
    progress = Progress("received", None, stream)
    for _ in range(3):
        progress._last -= 60
        progress.tick()
    progress.finish()
    assert stream.getvalue().count("\n") == 4 and "\r" not in stream.getvalue()


class Registry:
    """Knows one string schema, id 9."""

    async def get(self, schema_id: int, version: int | None) -> schema_pb.GetSchemaResponse:
        return schema_pb.GetSchemaResponse(schema_id, 1, "notes", "string", b"")


def json_line(message: Message) -> dict[str, Any]:
    line = asyncio.run(MessageRenderer(Registry()).render_json(message))  # type: ignore[arg-type]
    assert "\n" not in line
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def message(payload: bytes, schema_id: int | None = None) -> Message:
    return Message(
        payload, "/default/t", 41, "producer-1", 1700, {"k": "v"}, "key-1", schema_id,
        1 if schema_id is not None else None, producer_id=7, broker_addr="b:1", request_id=3,
    )  # fmt: skip


def test_consume_json_carries_the_message_s_fields() -> None:
    line = json_line(message(b"hello"))
    assert line == {
        "topic": "/default/t",
        "offset": 41,
        "producer_id": 7,
        "producer_name": "producer-1",
        "broker_addr": "b:1",
        "request_id": 3,
        "publish_time": 1700,
        "routing_key": "key-1",
        "attributes": {"k": "v"},
        "payload": "hello",
        "payload_encoding": "utf-8",
    }


def test_consume_json_gives_binary_payloads_as_base64() -> None:
    payload = bytes([0xFF, 0x00, 0xFE])
    line = json_line(message(payload))
    assert line["payload_encoding"] == "base64"
    assert base64.b64decode(line["payload"]) == payload


def test_consume_json_names_the_schema() -> None:
    line = json_line(message(b"note", schema_id=9))
    assert (line["schema_id"], line["schema_version"], line["payload"]) == (9, 1, "note")
    assert "schema_error" not in line


def test_the_json_log_is_one_object_per_line_with_the_event_s_fields() -> None:
    record = logging.LogRecord(
        "danube.runtime", logging.INFO, __file__, 1,
        "event=broker_ready broker_id=%s reason=%r", ("7", "it's up"), None,
    )  # fmt: skip
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["event"] == "broker_ready" and line["broker_id"] == "7"
    assert line["reason"] == "it's up" and line["level"] == "INFO"
    assert line["logger"] == "danube.runtime" and line["time"].endswith("Z")


def test_grpclib_s_chatter_is_kept_at_warning() -> None:
    before = logging.getLogger().handlers[:], logging.getLogger().level
    try:
        logs.setup_logging("info", "json")
        assert logging.getLogger("grpclib").getEffectiveLevel() == logging.WARNING
        logs.setup_logging("debug")
        assert logging.getLogger("grpclib").getEffectiveLevel() == logging.DEBUG
    finally:
        logging.getLogger("grpclib").setLevel(logging.NOTSET)
        root = logging.getLogger()
        root.handlers[:] = before[0]
        root.setLevel(before[1])


def test_the_broker_s_log_format_flag() -> None:
    args = broker.build_parser().parse_args(["--log-format", "json"])
    assert args.log_format == "json"
    with pytest.raises(SystemExit):
        broker.build_parser().parse_args(["--log-format", "xml"])
