"""Compiling a `.proto` text into descriptors with Google's own compiler.

Why protoc: the registry has to turn a `.proto` text into real descriptors. Google's compiler
(shipped in grpcio-tools, kept in step with protobuf by the gRPC project) gives exactly the
semantics every other Protobuf user gets — proto2, proto3, editions, imports of the
well-known types, name resolution, option checks — with its own error messages, instead of a
third-party re-implementation of the grammar that would drift from it.

It runs as a program in a private temporary directory (so its diagnostics can be captured
and nothing else is touched), which is why it lives here and not in the pure
`danube.machines.schema`: callers (the broker's schema service, tests) compile, and
the registry only ever sees the descriptor set."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc_tools

from danube.machines.schema.errors import SchemaParseError
from danube.machines.schema.protobuf import SCHEMA_FILE

WELL_KNOWN_PROTOS = Path(grpc_tools.__file__).parent / "_proto"

TIMEOUT_S = 30.0
"""A compile that takes longer is given up (protoc normally needs well under a second)."""

_ABSL_LOG_LINE = re.compile(r"^(WARNING: All log messages before absl|[IWEF]\d{4} )")
"""protoc's logging library writes lines with a timestamp and pid: noise, not diagnostics."""


def compile_proto(definition: bytes) -> bytes:
    """The serialized FileDescriptorSet of UTF-8 `.proto` text (which may import Google's
    well-known types): the schema's file last, its imports before it. Raises
    SchemaParseError with protoc's own diagnostics (`schema.proto:LINE:COLUMN: ...`)."""
    try:
        definition.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaParseError(f"{SCHEMA_FILE}: not UTF-8 text: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="danube-proto-") as temporary:
        source = Path(temporary, "src")
        source.mkdir()
        (source / SCHEMA_FILE).write_bytes(definition)
        output = Path(temporary, "schema.desc")
        try:
            result = _run_protoc(source, output)
        except subprocess.TimeoutExpired:
            raise SchemaParseError(f"protoc did not finish within {TIMEOUT_S:g} s") from None
        if result.returncode != 0:
            raise SchemaParseError(_diagnostics(result.stderr, temporary, result.returncode))
        return output.read_bytes()


def _run_protoc(source: Path, output: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            f"-I{WELL_KNOWN_PROTOS}",
            "--include_imports",
            f"--descriptor_set_out={output}",
            SCHEMA_FILE,
        ],
        cwd=source,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT_S,
        check=False,
    )


def _diagnostics(stderr: bytes, temporary: str, returncode: int) -> str:
    """protoc's errors without its logging noise and without the temporary directory, so a
    message reads `schema.proto:3:5: ...` and is the same on every run."""
    text = stderr.decode("utf-8", errors="replace")
    for directory in (Path(temporary, "src"), Path(temporary)):
        text = text.replace(f"{directory}{os.sep}", "")
    lines = [
        line
        for line in text.splitlines()
        if line.strip() and not _ABSL_LOG_LINE.match(line) and ": warning: " not in line
    ]
    return "\n".join(lines) or f"protoc failed with exit status {returncode}"
