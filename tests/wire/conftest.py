"""Shared fixtures for the wire-protocol tests: our compiled protos and the official client's
interpreter (which lives in its own environment because it also imports as `danube`)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent
PROTO_DIR = ROOT / "proto"
DUMP_SCRIPT = HERE / "dump_official_descriptors.py"
DEFAULT_OFFICIAL_PYTHON = ROOT / ".venv-official" / "bin" / "python"


def load_module(path: pathlib.Path) -> ModuleType:
    """Imports a file by path so these tests work whatever pytest import mode is configured
    (tests/wire is deliberately not a package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dump_official = load_module(DUMP_SCRIPT)


@pytest.fixture(scope="session")
def our_wire(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Our protos as protoc itself sees them (a FileDescriptorSet), flattened the same way as the
    official client's descriptors so both comparisons use one representation."""
    out = tmp_path_factory.mktemp("descriptors") / "ours.binpb"
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            *protos,
        ],
        cwd=PROTO_DIR,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"protoc rejected proto/:\n{proc.stderr}"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return dump_official.flatten(files)


@pytest.fixture
def run_official() -> Callable[..., str]:
    """Runs a script under the official client's interpreter and returns its stdout.

    A missing interpreter fails the calling test rather than skipping it: a conformance suite
    that quietly skips on a machine without the official client proves nothing.
    """

    def run(*args: str, stdin: str = "") -> str:
        python = pathlib.Path(os.environ.get("DANUBE_OFFICIAL_PYTHON", DEFAULT_OFFICIAL_PYTHON))
        if not python.exists():
            pytest.fail(
                f"official danube-client interpreter {python} does not exist: run "
                "`scripts/bootstrap.sh` (or point DANUBE_OFFICIAL_PYTHON at it)",
                pytrace=False,
            )
        # -I: ignore PYTHONPATH, which may hold our src/ and would shadow the official `danube`.
        proc = subprocess.run(
            [str(python), "-I", *args], input=stdin, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"official interpreter failed:\n{proc.stderr}"
        return proc.stdout

    return run
