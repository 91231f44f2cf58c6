"""`danube-cli schema ...` as a user runs it against the shared broker: what it prints, its
exit codes, and one readable line for every error (issue 8, point 5)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from danube.localcluster.broker_process import BrokerProcess

pytestmark = pytest.mark.slow
CLI = Path(sys.executable).parent / "danube-cli"


def cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    action, rest = args[0], args[1:]
    return subprocess.run(
        [str(CLI), "schema", action, "-s", broker.url, *rest],
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

    assert "is none" in cli(broker, "mode", subject, "none").stdout
    assert cli(broker, "register", subject, "-t", "avro", "-f", str(breaking)).returncode == 0
    assert "deleted version 3" in cli(broker, "delete", subject, "3").stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("show", "nobody-at-all"), "NOT_FOUND"),
        (("register", "s", "-t", "avro", "-f", "/nonexistent.avsc"), "cannot read"),
        (("delete", "nobody-at-all", "1"), "NOT_FOUND"),
    ],
)
def test_errors_are_one_readable_line(
    broker: BrokerProcess, args: tuple[str, ...], words: str
) -> None:
    run = cli(broker, *args)
    assert run.returncode == 1 and words in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_a_bad_schema_file_names_the_problem(broker: BrokerProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}')
    run = cli(broker, "register", "bad-subject", "-t", "avro", "-f", str(bad))
    assert run.returncode == 1 and "INVALID_ARGUMENT" in run.stderr and "nope" in run.stderr
