"""`danube-cli schema ...` as a user runs it against the shared broker: what it prints, its
exit codes, and one readable line for every error (issue 8, point 5)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from danube.client import DanubeClient, DispatchStrategy, SchemaRef
from danube.localcluster.broker_process import BrokerProcess
from tests.support.aio import run as aio_run
from tests.support.aio import unique_topic

pytestmark = pytest.mark.slow
CLI = Path(sys.executable).parent / "danube-cli"


ADMIN_ACTIONS = ("mode", "delete")
"""They change a subject's rules: on the admin port (`-a`), spec/protocol.md."""


def cli(
    broker: BrokerProcess, *args: str, port: str | None = None
) -> subprocess.CompletedProcess[str]:
    action, rest = args[0], args[1:]
    where = ["-a", f"http://{broker.admin_addr}"] if action in ADMIN_ACTIONS else ["-s", broker.url]
    if port is not None:
        where = [where[0], port]
    return subprocess.run(
        [str(CLI), "schema", action, *where, *rest],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip


def write(path: Path, fields: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"type": "record", "name": "Order", "fields": fields}))
    return path


def test_register_show_versions_check_mode_and_delete(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    subject = f"cli-{uuid.uuid4().hex[:8]}"
    v1 = write(tmp_path / "v1.avsc", [{"name": "id", "type": "long"}])
    note = {"name": "note", "type": "string", "default": ""}
    v2 = write(tmp_path / "v2.avsc", [{"name": "id", "type": "long"}, note])
    breaking = write(tmp_path / "v3.avsc", [{"name": "id", "type": "int"}])

    first = cli(broker, "register", subject, "-t", "avro", "-f", str(v1))
    assert first.returncode == 0 and "registered as version 1" in first.stdout, first.stderr
    again = cli(broker, "register", subject, "-t", "avro", "-f", str(v1))
    assert "already registered as version 1" in again.stdout
    assert cli(broker, "register", subject, "-t", "avro", "-f", str(v2)).returncode == 0

    shown = cli(broker, "show", subject, "-v", "1")
    assert shown.returncode == 0 and json.loads(shown.stdout) == json.loads(v1.read_text())
    assert f"subject {subject} version 1" in shown.stderr

    listed = cli(broker, "versions", subject)
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["1", "2"]
    assert subject in cli(broker, "list").stdout

    refused = cli(broker, "check", subject, "-t", "avro", "-f", str(breaking))
    assert refused.returncode == 1 and "NOT compatible" in refused.stdout
    assert "/fields/id" in refused.stdout
    under_none = cli(broker, "check", subject, "-t", "avro", "-f", str(breaking), "--mode", "none")
    assert under_none.returncode == 0 and "compatible" in under_none.stdout
    assert "NOT compatible" not in under_none.stdout

    on_client_port = cli(broker, "mode", subject, "none", port=broker.url)
    assert on_client_port.returncode == 1 and "PERMISSION_DENIED" in on_client_port.stderr
    assert "admin port" in on_client_port.stderr
    assert "is none" in cli(broker, "mode", subject, "none").stdout
    assert cli(broker, "register", subject, "-t", "avro", "-f", str(breaking)).returncode == 0
    assert "deleted version 3" in cli(broker, "delete", subject, "3").stdout


@pytest.mark.parametrize(
    ("args", "words", "status"),
    [
        (("show", "nobody-at-all"), "NOT_FOUND", 1),
        (("register", "s", "-t", "avro", "-f", "/nonexistent.avsc"), "cannot read", 2),
        (("delete", "nobody-at-all", "1"), "NOT_FOUND", 1),
    ],
)
def test_errors_are_one_readable_line(
    broker: BrokerProcess, args: tuple[str, ...], words: str, status: int
) -> None:
    """Exit 1 for the broker's refusal, 2 for bad usage (a file named that cannot be read)."""
    run = cli(broker, *args)
    assert run.returncode == status and words in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_a_bad_schema_file_names_the_problem(broker: BrokerProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}')
    run = cli(broker, "register", "bad-subject", "-t", "avro", "-f", str(bad))
    assert run.returncode == 1 and "INVALID_ARGUMENT" in run.stderr and "nope" in run.stderr


def register_order(broker: BrokerProcess, subject: str, tmp_path: Path) -> None:
    definition = write(tmp_path / "v1.avsc", [{"name": "id", "type": "long"}])
    assert cli(broker, "register", subject, "-t", "avro", "-f", str(definition)).returncode == 0


def data_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
    )


def consume_earliest(broker: BrokerProcess, topic: str, count: int) -> list[str]:
    run = data_cli(
        "consume", "-s", broker.url, "-t", topic, "-m", "check", "--start", "earliest",
        "-c", str(count),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_produce_registers_a_schema_file_and_sends_avro_typed_as_json(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Danube's `--schema-file`: the subject is the topic's name with dashes; the JSON typed
    goes out as a binary Avro datum, which consume decodes back to JSON."""
    topic = f"/default/cli-avro-{uuid.uuid4().hex[:8]}"
    schema = write(tmp_path / "order.avsc", [{"name": "id", "type": "long"}])
    produced = data_cli(
        "produce", "-s", broker.url, "-t", topic, "--reliable", "-m", '{"id": 41}',
        "--schema-file", str(schema), "--schema-type", "avro", "-c", "2",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    subject = topic.lstrip("/").replace("/", "-")
    assert f"schema {subject}: registered version 1" in produced.stderr
    lines = consume_earliest(broker, topic, 2)
    assert all(line.endswith(f'schema={subject} v1 (avro)] {{"id": 41}}') for line in lines)


def test_produce_refuses_a_payload_that_does_not_fit_before_sending(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    subject = f"cli-{uuid.uuid4().hex[:8]}"
    topic = f"/default/cli-refused-{uuid.uuid4().hex[:8]}"
    register_order(broker, subject, tmp_path)
    refused = data_cli(
        "produce", "-s", broker.url, "-t", topic, "--reliable", "--schema-subject", subject,
        "-m", '{"id": "forty-one"}',
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"danube-cli: error: not a datum of {subject} v1 (avro): field 'id': expected long, "
        "got str; nothing was sent"
    ]
    missing = data_cli(
        "consume", "-s", broker.url, "-t", topic, "-m", "check", "--start", "earliest"
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_a_pinned_older_json_schema_version_is_what_consumers_see(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    subject = f"cli-{uuid.uuid4().hex[:8]}"
    topic = f"/default/cli-pinned-{uuid.uuid4().hex[:8]}"
    for version, extra in ((1, {}), (2, {"note": {"type": "string"}})):
        path = tmp_path / f"v{version}.json"
        path.write_text(
            json.dumps(
                {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, **extra},
                    "additionalProperties": False,
                }
            )
        )
        assert (
            cli(broker, "register", subject, "-t", "json_schema", "-f", str(path)).returncode == 0
        )
    produced = data_cli(
        "produce", "-s", broker.url, "-t", topic, "--reliable", "--schema-subject", subject,
        "--schema-version", "1", "-m", '{"id": 7}',
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    wrong = data_cli(
        "produce", "-s", broker.url, "-t", topic, "--reliable", "--schema-subject", subject,
        "-m", '{"id": "seven"}',
    )  # fmt: skip
    assert wrong.returncode == 1 and "$.id: 'seven' is not of type 'integer'" in wrong.stderr
    too_new = data_cli(
        "produce", "-s", broker.url, "-t", topic, "--schema-subject", subject,
        "--schema-min-version", "3", "-m", "{}",
    )  # fmt: skip
    assert too_new.returncode == 1 and "below the minimum 3" in too_new.stderr
    assert consume_earliest(broker, topic, 1)[0].endswith(
        f'schema={subject} v1 (json_schema)] {{"id": 7}}'
    )


def test_consume_marks_a_message_that_does_not_fit_the_schema_it_names(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Under the default `warn` policy the broker lets it through; the reader is told."""
    subject = f"cli-{uuid.uuid4().hex[:8]}"
    topic = unique_topic("cli-invalid")
    register_order(broker, subject, tmp_path)

    async def send_garbage() -> None:
        async with DanubeClient(broker.url) as client:
            producer = client.producer(
                topic, "p", dispatch=DispatchStrategy.RELIABLE, schema=SchemaRef(subject)
            )
            await (await producer.create()).send(b"\x80")

    aio_run(send_garbage)
    line = consume_earliest(broker, topic, 1)[0]
    assert f"INVALID: not a datum of {subject} v1 (avro)" in line and line.endswith("<1 bytes> 80")


@pytest.mark.parametrize(
    ("args", "words", "status"),
    [
        (("--schema-version", "2"), "need --schema-subject", 2),
        (("--schema-type", "avro"), "--schema-type goes with --schema-file", 2),
        (("--schema-file", "/nonexistent.avsc", "--schema-type", "avro"), "cannot read", 2),
        (("--schema-file", "/nonexistent.avsc"), "needs --schema-type", 2),
        (("--schema-subject", "nobody-at-all"), "NOT_FOUND", 1),
    ],
)
def test_schema_flags_that_cannot_work_get_one_error_line(
    broker: BrokerProcess, args: tuple[str, ...], words: str, status: int
) -> None:
    """Flags that cannot work together are usage errors (exit 2, as argparse's); a subject
    the registry does not have is its refusal (exit 1)."""
    run = data_cli("produce", "-s", broker.url, "-t", unique_topic(), "-m", "{}", *args)
    assert run.returncode == status and words in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_a_payload_that_does_not_fit_the_schema_file_registers_nothing(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Found in review: the file was registered before the payload was checked."""
    subject = f"cli-{uuid.uuid4().hex[:8]}"
    schema = write(tmp_path / "order.avsc", [{"name": "id", "type": "long"}])
    refused = data_cli(
        "produce", "-s", broker.url, "-t", unique_topic(), "--schema-subject", subject,
        "--schema-file", str(schema), "--schema-type", "avro", "-m", '{"id": "x"}',
    )  # fmt: skip
    assert refused.returncode == 1
    assert "from the schema file (avro): field 'id'" in refused.stderr
    assert "nothing was registered or sent" in refused.stderr
    assert "NOT_FOUND" in cli(broker, "versions", subject).stderr
